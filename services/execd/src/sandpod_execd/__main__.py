"""``python -m sandpod_execd`` / ``sandpod-execd``: serve the configured sandboxes until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from sandpod_execd.service import ExecdService
from sandpod_execd.settings import ExecdSettings
from sandpod_service import serve


def _keep_instance_lock() -> None:
    """The lifecycle's launcher hands us our instance's locked file (``SANDPOD_EXECD_LOCK_FD``):
    we hold it for our whole life, and no command we start inherits it."""
    fd = os.environ.pop("SANDPOD_EXECD_LOCK_FD", "")
    if fd.isdigit():
        with contextlib.suppress(OSError):
            os.set_inheritable(int(fd), False)


def main() -> int:
    _keep_instance_lock()
    try:
        settings = ExecdSettings.from_env()
    except ValueError as exc:
        print(f"sandpod-execd: bad settings: {exc}", file=sys.stderr)
        return 2
    service = ExecdService(settings)
    return asyncio.run(
        serve(service, settings.bus, grace=settings.grace, log_level=settings.log_level)
    )


if __name__ == "__main__":
    sys.exit(main())
