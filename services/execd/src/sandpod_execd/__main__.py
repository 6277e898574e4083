"""``python -m sandpod_execd`` / ``sandpod-execd``: serve the configured sandboxes until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
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


# Signals a sandbox's programs expect at their default disposition. An ignored one is inherited
# across fork and exec (a shell cannot even trap it), so a platform started under `nohup` or
# with SIGINT ignored would hand that to every command; a handled one resets to the default at
# exec. SIGINT and SIGTERM are serve()'s own.
COMMAND_SIGNALS = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


def _unignore_signals() -> None:
    """Replace an inherited SIG_IGN by a handler that does nothing: execd stays as immune as it
    was, and the commands it starts get the default disposition."""
    for sig in (*COMMAND_SIGNALS, signal.SIGINT):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, lambda *_: None)


def main() -> int:
    _keep_instance_lock()
    _unignore_signals()
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
