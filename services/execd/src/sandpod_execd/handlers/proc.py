"""``proc``-family handlers (see ``sandpod_contract.messages.proc``)."""

from __future__ import annotations

from sandpod_execd.handlers import Deps, Route

__all__ = ["ProcHandlers"]


class ProcHandlers:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    def routes(self) -> dict[tuple[str, str], Route]:
        return {}

    async def close(self) -> None:
        """Release what this family holds (called once at shutdown, after intake stopped)."""
