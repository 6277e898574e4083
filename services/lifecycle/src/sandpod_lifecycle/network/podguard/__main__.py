"""``python -m sandpod_lifecycle.network.podguard``: the network guard's entry point.

Reads :class:`GuardSettings` from the environment, runs the :class:`Guard` until SIGTERM or
SIGINT, exits 0; a guard that cannot enforce (no nftables, no port 53, bad settings) exits 1
before it writes its ready file, so the Pod's sandbox container never starts unguarded.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys

import structlog

from sandpod_lifecycle.network.nft import NftError
from sandpod_lifecycle.network.podguard.guard import Guard
from sandpod_lifecycle.network.podguard.settings import GuardSettings
from sandpod_lifecycle.network.resolver import ResolverBindError
from sandpod_service.logs import configure_logging

log = structlog.get_logger("sandpod.lifecycle.network.podguard")


async def _main() -> int:
    try:
        settings = GuardSettings.from_env()
    except ValueError as exc:
        log.error("guard_settings_invalid", error=str(exc))
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await Guard(settings).run(stop)
    except (NftError, ResolverBindError) as exc:
        log.error("guard_cannot_enforce", error=str(exc))
        return 1
    log.info("guard_stopped", sandbox_id=settings.sandbox_id)
    return 0


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # a stuck guard's threads, on demand (kill -USR1)
    configure_logging("netguard")
    sys.exit(asyncio.run(_main()))


if __name__ == "__main__":
    main()
