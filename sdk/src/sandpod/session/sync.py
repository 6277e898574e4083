"""Blocking twins of the ``session`` family (:class:`~sandpod.session.api.AsyncSessions`,
``AsyncSession``); ``with`` a :class:`Session` deletes it on exit.

Each method runs its async twin on the SDK's private loop thread (:mod:`sandpod._loop`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Self

from sandpod._loop import run
from sandpod._twins import twin
from sandpod.session.api import AsyncSession, AsyncSessions
from sandpod.session.types import SessionInfo
from sandpod_contract.errors import SessionNotFound

__all__ = ["Session", "Sessions"]


class Sessions:
    """Blocking twin of :class:`AsyncSessions` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncSessions) -> None:
        self._inner = inner

    def create(
        self,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Session:
        """Start a shell (see :meth:`AsyncSessions.create`)."""
        return Session(run(self._inner.create(session_id, cwd=cwd, env=env)))

    def get(self, session_id: str) -> Session:
        """A handle on an existing session. Raises SessionNotFound."""
        return Session(run(self._inner.get(session_id)))

    list = twin(AsyncSessions.list)
    status = twin(AsyncSessions.status)
    delete = twin(AsyncSessions.delete)
    cancel = twin(AsyncSessions.cancel)
    run = twin(AsyncSessions.run)


class Session:
    """Blocking twin of :class:`AsyncSession`; ``with`` deletes it on exit."""

    def __init__(self, inner: AsyncSession) -> None:
        self._inner = inner

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def info(self) -> SessionInfo:
        return self._inner.info

    def __repr__(self) -> str:
        return repr(self._inner).replace("AsyncSession", "Session", 1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(SessionNotFound):
            self.delete()

    run = twin(AsyncSession.run)
    status = twin(AsyncSession.status)
    cancel = twin(AsyncSession.cancel)
    delete = twin(AsyncSession.delete)
