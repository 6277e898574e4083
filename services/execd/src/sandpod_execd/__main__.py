"""``python -m sandpod_execd`` / ``sandpod-execd``: serve the configured sandboxes until SIGTERM."""

from __future__ import annotations

import asyncio
import sys

from sandpod_execd.service import ExecdService
from sandpod_execd.settings import ExecdSettings
from sandpod_service import serve


def main() -> int:
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
