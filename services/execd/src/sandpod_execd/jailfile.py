"""Read a sandbox's jail file only if nobody but root (or execd's own user) could have written it.

Why: the jail file says where a sandbox's commands run (holder pid, cgroups, uid). The node
execd (root) serves a sandbox when lifecycle asks, and takes the file from its *own* configured
directory (``SANDPOD_EXECD_JAIL`` with ``{sandbox_id}``), never from the request. A file another
local user could create or change there would still hand them a root-run sandbox, so the file
and its directory must be owned by root or by execd's uid and writable by nobody else. The file
is opened once without following links and checked and read through that one descriptor (no
check-then-open race).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sandpod_contract.errors import SandboxJailRefused
from sandpod_execd.jail import Jail
from sandpod_service.jailfile import JailFileInvalid, decode

__all__ = ["MAX_JAIL_FILE", "load_trusted"]

MAX_JAIL_FILE = 1024 * 1024  # a jail file is a few KiB


def _refuse(sandbox_id: str, path: Path, why: str) -> SandboxJailRefused:
    return SandboxJailRefused(
        f"sandbox {sandbox_id!r}: refusing jail file {path}: {why}; this node runs sandboxes "
        "only in jails that lifecycle created (create the sandbox through the Sandbox API)",
        sandbox_id=sandbox_id,
        path=str(path),
        reason=why,
    )


def _trusted(st: os.stat_result) -> str | None:
    """Why ``st`` may have been written by another user, else None."""
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def load_trusted(path: Path, sandbox_id: str) -> Jail:
    """The :class:`Jail` at ``path`` if it and its directory are trusted.

    Raises:
        SandboxJailRefused: missing, not a regular file, a link, owned by another user, group- or
            world-writable (the file or its directory), too large, or not a jail file.
    """
    try:
        parent = os.stat(path.parent)
    except OSError as exc:
        raise _refuse(sandbox_id, path, f"no jail ({exc.strerror})") from exc
    if why := _trusted(parent):
        raise _refuse(sandbox_id, path, f"its directory is {why}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise _refuse(sandbox_id, path, f"no jail ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(sandbox_id, path, "not a regular file")
        if why := _trusted(st):
            raise _refuse(sandbox_id, path, why)
        if st.st_size > MAX_JAIL_FILE:
            raise _refuse(sandbox_id, path, f"{st.st_size} bytes")
        raw = os.read(fd, MAX_JAIL_FILE + 1)
    finally:
        os.close(fd)
    try:
        record = decode(raw)
    except JailFileInvalid as exc:
        raise _refuse(sandbox_id, path, f"unusable ({exc.reason})") from exc
    try:
        return Jail.from_record(record, sandbox_id)
    except (ValueError, OSError) as exc:
        raise _refuse(sandbox_id, path, f"unusable ({exc})") from exc
