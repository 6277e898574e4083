"""Run a service as an unprivileged user, for the rootless local runtime's tests.

The suite runs as root; rootless jails must be built by a user without any privilege. This
makes that user (``sandpod-rootless``: a system account with no supplementary groups) and an
argv prefix running a command as it (``setpriv``). The interpreter, the venv or the checkout
may lie below directories that user cannot traverse (pyenv under ``/root``, a clone in a
mode-0700 temporary directory): the prefix then runs the command in a private mount namespace
where each such directory is replaced by a tmpfs holding bind mounts of its entries. The entries
keep their own permissions, so only what others could already read becomes reachable.
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
spare=$1
shift
mkdir -p "$spare"
mount -t tmpfs -o mode=0700,size=64k sandpod-spare "$spare"
n=0
while [ "$1" != -- ]; do
  hidden=$1 keep="$spare/$n"
  shift
  n=$((n + 1))
  mkdir "$keep"
  mount --bind "$hidden" "$keep"
  mount -t tmpfs -o mode=0755,size=64k sandpod-expose "$hidden"
  for entry in "$keep"/* "$keep"/.[!.]* "$keep"/..?*; do
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    name=${entry##*/}
    if [ -L "$entry" ]; then
      ln -s "$(readlink "$entry")" "$hidden/$name"
      continue
    elif [ -d "$entry" ]; then
      mkdir "$hidden/$name"
    else
      : > "$hidden/$name"
    fi
    mount --bind "$entry" "$hidden/$name"
  done
done
shift
exec "$@"
"""


def ensure_user() -> tuple[int, int]:
    """(uid, gid) of the test user, created if missing (needs root and ``useradd``)."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        subprocess.run(
            [
                useradd,
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


def _hidden(paths: list[Path]) -> list[Path]:
    """Every ancestor directory of ``paths`` that others cannot traverse, parents first."""
    found: set[Path] = set()
    for path in paths:
        for i in range(1, len(path.parts)):
            ancestor = Path(*path.parts[:i])
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                found.add(ancestor)
    return sorted(found, key=lambda p: len(p.parts))


def as_user(uid: int, gid: int, spare: Path) -> tuple[str, ...]:
    """An argv prefix running the rest as ``uid``/``gid``, no supplementary groups, with this
    interpreter, its venv, this checkout and the default root filesystem reachable (``spare``:
    a path for an empty directory, the mount point of what gets re-exposed; remove it
    afterwards)."""
    drop = ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--")
    needed = [Path(os.path.realpath(sys.executable)), Path(sys.prefix), Path(__file__).parent]
    if os.environ.get("SANDPOD_DEFAULT_ROOTFS"):  # the base (under root's ~/.cache): readable
        needed.append(Path(os.environ["SANDPOD_DEFAULT_ROOTFS"]))
    hidden = _hidden(needed)
    if not hidden:
        return drop
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        EXPOSE,
        "sandpod-expose",
        str(spare),
        *(str(h) for h in hidden),
        "--",
        *drop,
    )
