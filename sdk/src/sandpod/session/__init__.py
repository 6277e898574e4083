"""The ``session`` family: long-lived shell sessions in the sandbox (``sbx.sessions``).

Same shape as every SDK family: ``api`` (the async client, given a
:class:`~sandpod.channel.Channel`), ``types`` (the values it returns), ``sync`` (the blocking
twins). This module lists the family's public names.
"""

from sandpod.session.api import AsyncSession, AsyncSessions
from sandpod.session.sync import Session, Sessions
from sandpod.session.types import SessionInfo, SessionResult

__all__ = ["AsyncSession", "AsyncSessions", "Session", "SessionInfo", "SessionResult", "Sessions"]
