"""The ``pty`` family: pseudo-terminals in the sandbox (``sbx.pty``).

Same shape as every SDK family: ``api`` (the async client, given a
:class:`~sandpod.channel.Channel`), ``types`` (the values it returns), ``sync`` (the blocking
twins). This module lists the family's public names.
"""

from sandpod.pty.api import AsyncPty, AsyncPtys
from sandpod.pty.sync import Pty, Ptys
from sandpod.pty.types import PtyExit, PtyInfo, PtyOutput

__all__ = ["AsyncPty", "AsyncPtys", "Pty", "PtyExit", "PtyInfo", "PtyOutput", "Ptys"]
