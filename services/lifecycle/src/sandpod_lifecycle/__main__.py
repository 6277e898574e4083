"""``python -m sandpod_lifecycle``: run a lifecycle replica until SIGTERM."""

from __future__ import annotations

import asyncio
import sys

from sandpod_lifecycle.service import LifecycleService
from sandpod_lifecycle.settings import LifecycleSettings
from sandpod_service import serve


def main() -> int:
    try:
        settings = LifecycleSettings.from_env()
    except ValueError as exc:
        print(f"sandpod-lifecycle: bad settings: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(
        serve(
            LifecycleService(settings),
            settings.bus,
            grace=settings.grace,
            log_level=settings.log_level,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
