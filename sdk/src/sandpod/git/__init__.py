"""The ``git`` family: clone, checkout, status and diff in the sandbox (``sbx.git``).

Same shape as every SDK family: ``api`` (the async client, given a
:class:`~sandpod.channel.Channel`), ``types`` (the values it returns), ``sync`` (the blocking
twin). This module lists the family's public names.
"""

from sandpod.git.api import AsyncGit
from sandpod.git.sync import Git
from sandpod.git.types import GitDiff, GitEntry, GitHead, GitStatus

__all__ = ["AsyncGit", "Git", "GitDiff", "GitEntry", "GitHead", "GitStatus"]
