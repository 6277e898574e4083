"""One ``run`` step inside the builder Pod: the chain so far as root, the command as nobody.

Started by ``builds.podmain`` as
``unshare --mount --propagation private --pid --fork --kill-child -- python3 -m
sandpod_lifecycle.builds.podjail <spec JSON>``, so every mount below lives in a mount namespace
of this step only and vanishes with it (nothing to unmount, even after a crash), and the
command's processes are in a pid namespace of their own (all killed when it ends). Here:

1. the chain's layers (top first) become an overlay's lower dirs, with ``upper`` as its
   writable layer: what the step changes lands there, in overlay format (whiteouts, opaque
   directories), which ``commit.commit_upper`` turns into the step's layer -- the very code
   the local runtime commits a builder sandbox's layer with;
2. ``/proc`` (this pid namespace's), a ``/dev`` of only null, zero, full, random, urandom and
   tty, and a private ``/tmp`` are mounted (never part of the layer: the commit removes them);
3. ``chroot`` into it, supplementary groups cleared, uid and gid set to ``uid`` (an
   unprivileged build uid; the commit gives its files to root, as in the local runtime), no
   new privileges, then ``exec /bin/sh -c <command>`` with the step's env in its workdir.

The spec is JSON: ``{"root", "upper", "work", "lowers": [...], "command", "cwd", "env", "uid"}``.
Exit status: the command's own, or 125 when the jail could not be set up (the message says why).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SETUP_FAILED", "main"]

SETUP_FAILED = 125
PR_SET_NO_NEW_PRIVS = 38
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
MOUNT = shutil.which("mount") or "/usr/bin/mount"  # util-linux's, from the builder image
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class JailSetupFailed(Exception):
    """A mount or privilege drop failed: the step cannot run (not the command's failure)."""


def _mount(*args: str) -> None:
    done = subprocess.run([MOUNT, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise JailSetupFailed(f"mount {' '.join(args)}: {done.stderr.strip()}")


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def setup(spec: dict[str, object]) -> Path:
    """Mount the step's root (see the module docstring); returns it."""
    root = Path(str(spec["root"]))
    lowers = [str(p) for p in spec["lowers"]]  # type: ignore[attr-defined]  # a JSON list
    if not lowers:
        raise JailSetupFailed("no lower layers: a run step needs a base")
    options = f"lowerdir={':'.join(lowers)},upperdir={spec['upper']},workdir={spec['work']}"
    _mount("-t", "overlay", "overlay", "-o", options, str(root))
    _mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", str(_dir(root / "proc")))
    dev = _dir(root / "dev")
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid,noexec,size=64k", "tmpfs", str(dev))
    for name in DEVICES:
        if Path("/dev", name).exists():
            (dev / name).touch()
            _mount("--bind", f"/dev/{name}", str(dev / name))
    _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", str(_dir(root / "tmp")))
    return root


def _no_new_privs() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise JailSetupFailed(f"prctl(NO_NEW_PRIVS): errno {ctypes.get_errno()}")


def enter(root: Path, cwd: str, uid: int) -> None:
    """chroot into ``root``, go to ``cwd``, become ``uid``, with no way back up."""
    os.chroot(root)
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise JailSetupFailed(f"the step's workdir {cwd}: {exc.strerror}") from exc
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    _no_new_privs()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        spec = json.loads(args[0])
        env = {str(k): str(v) for k, v in dict(spec.get("env") or {}).items()}
        env.setdefault("PATH", DEFAULT_PATH)
        env.setdefault("HOME", "/tmp")  # noqa: S108 - the step's private tmpfs
        enter(setup(spec), str(spec.get("cwd") or "/"), int(spec["uid"]))
    except (JailSetupFailed, OSError, KeyError, IndexError, ValueError) as exc:
        print(f"sandpod build jail: {exc}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    try:
        os.execve("/bin/sh", ["sh", "-c", str(spec["command"])], env)  # noqa: S606 - the step
    except OSError as exc:
        print(f"sandpod build jail: /bin/sh: {exc.strerror}", file=sys.stderr, flush=True)
    return SETUP_FAILED


if __name__ == "__main__":
    sys.exit(main())
