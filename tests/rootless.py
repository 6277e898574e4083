"""Run a service as an unprivileged user, for the rootless local runtime's tests.

The suite runs as root; rootless jails must be built by a user without any privilege. This
makes that user (``sandpod-rootless``: a system account with no supplementary groups) and an
argv prefix running a command as it (``setpriv``). The test interpreter may live below a
directory that user cannot traverse (pyenv under ``/root``): the prefix then runs the command in
a private mount namespace where an empty tmpfs over that directory exposes only the interpreter's
tree, so nothing else of root's becomes visible.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

__all__ = ["USER", "as_user", "ensure_user"]

USER = "sandpod-rootless"
EXPOSE = r"""
set -eu
child=$1 hidden=$2 spare=$3
shift 3
mkdir -p "$spare"
mount --bind "$child" "$spare"
mount -t tmpfs -o mode=0755,size=64k sandpod-expose "$hidden"
mkdir -p "$child"
mount --move "$spare" "$child"
exec "$@"
"""


def ensure_user() -> tuple[int, int]:
    """(uid, gid) of the test user, created if missing (needs root and ``useradd``)."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home", "--home-dir",
             "/nonexistent", "--shell", "/usr/sbin/nologin", USER],
            check=True, capture_output=True,
        )  # fmt: skip
        entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


def _hidden_ancestor(path: Path) -> tuple[Path, Path] | None:
    """(the highest ancestor of ``path`` others cannot traverse, its child on the way)."""
    parts = path.parts
    for i in range(1, len(parts) - 1):
        ancestor = Path(*parts[: i + 1])
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return ancestor, Path(*parts[: i + 2])
    return None


def as_user(uid: int, gid: int, spare: Path) -> tuple[str, ...]:
    """An argv prefix running the rest as ``uid``/``gid``, no supplementary groups, with this
    interpreter reachable (``spare``: an empty path used once as a mount point)."""
    drop = ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--")
    hidden = _hidden_ancestor(Path(os.path.realpath(sys.executable)))
    if hidden is None:
        return drop
    ancestor, child = hidden
    return ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", EXPOSE,
            "sandpod-expose", str(child), str(ancestor), str(spare), *drop)  # fmt: skip
