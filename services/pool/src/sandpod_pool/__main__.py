"""``python -m sandpod_pool``: run a pool-service replica until SIGTERM."""

from __future__ import annotations

import asyncio
import sys

from sandpod_pool.service import PoolService
from sandpod_pool.settings import PoolSettings
from sandpod_service import serve


def main() -> int:
    try:
        settings = PoolSettings.from_env()
    except ValueError as exc:
        print(f"sandpod-pool: bad settings: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(
        serve(
            PoolService(settings), settings.bus, grace=settings.grace, log_level=settings.log_level
        )
    )


if __name__ == "__main__":
    sys.exit(main())
