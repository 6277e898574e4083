"""Reconnect when the creds file changes, so a renewed NATS credential reaches a live connection.

Why: nats-py re-reads a creds file at every (re)connect, but it never reconnects on its own for a
renewal, and when the server drops a connection whose user JWT expired (``User Authentication
Expired``) nats-py *closes* it for good. So a long-lived client (execd in a sandbox Pod, whose
Secret lifecycle re-mints) must reconnect *before* its JWT expires, as soon as the new file is
there. The kubelet replaces a mounted Secret's files by swapping a symlink, so the file's
identity (inode, size, mtime, as ``stat`` sees it through the link) changes; polling that every
few seconds is cheap and needs no inotify.

    poll(path) --identity changed--> on_change()  (Bus: nats-py force_reconnect -> new JWT)
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

__all__ = ["CredsWatch"]

log = logging.getLogger("sandpod.bus.creds")

Identity = tuple[int, int, int] | None


def _identity(path: str) -> Identity:
    try:
        st = os.stat(path)
    except OSError:  # mid-swap, or gone: the next poll sees the new one
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class CredsWatch:
    """Calls ``on_change`` each time the file at ``path`` is replaced or rewritten."""

    def __init__(self, path: str, on_change: Callable[[], Awaitable[None]], every: float) -> None:
        self.path = path
        self._on_change = on_change
        self._every = every
        self._seen = _identity(path)
        self.changes = 0  # how many changes were acted on (tests, metrics)

    async def run(self) -> None:
        """Poll until cancelled. A failing ``on_change`` is logged and tried at the next change."""
        while True:
            await asyncio.sleep(self._every)
            now = _identity(self.path)
            if now is None or now == self._seen:
                continue
            self._seen = now
            self.changes += 1
            log.info("nats creds file changed (%s): reconnecting with it", self.path)
            try:
                await self._on_change()
            except Exception as exc:  # the connection may be down: it reconnects with the file
                log.warning("reconnect after a creds change failed: %s", exc)
