"""Running Debian's ``mmdebstrap`` for :mod:`sandpod_image.debian`, and discarding what it left.

:func:`run` starts it (in its own process group) with stdout and stderr on one pipe, hands the
process to the caller's ``started`` callback (so a caller giving up -- ``sandpod up`` stopped
during the first build -- can :func:`stop` it and everything it started), relays each ``I:``
line as a progress step with the elapsed time, and returns the exit code with the output's
tail. In root mode mmdebstrap mounts ``/proc``, ``/sys`` and device nodes into the tree while
it works; a build that is stopped leaves them, so :func:`discard` detaches them before it
removes the tree, and never removes one with a mount point still below it (``rm -r`` through
a bind mount of ``/dev`` would delete the host's): it reports them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["argv", "discard", "has_subuids", "mounts_below", "run", "stop"]

Started = Callable[["subprocess.Popen[str]"], None]
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # util-linux's umount, never one from $PATH
TAIL = 20  # lines of output kept for an error message


def argv(
    binary: str,
    *,
    variant: str,
    packages: Sequence[str],
    dpkgopts: Sequence[str],
    customize: str,
    target: tuple[str, str, str],
) -> list[str]:
    """mmdebstrap's command line: root mode as root, else unshare mode (subordinate uids);
    ``target`` is (suite, output directory, apt sources file)."""
    return [
        binary,
        f"--variant={variant}",
        f"--include={','.join(packages)}",
        "--mode=root" if os.geteuid() == 0 else "--mode=unshare",
        "--format=directory",
        f"--customize-hook={customize}",
        *(f"--dpkgopt={opt}" for opt in dpkgopts),
        *target,
    ]


def has_subuids(subuid: Path = Path("/etc/subuid")) -> bool:
    """Whether this user has a subordinate uid range (by name or by uid): unshare mode's need."""
    me = {str(os.geteuid()), pwd.getpwuid(os.geteuid()).pw_name}
    try:
        return any(line.split(":", 1)[0] in me for line in subuid.read_text().splitlines())
    except OSError:
        return False


def run(
    argv: list[str], say: Callable[[str], None], started: Started | None = None
) -> tuple[int, list[str]]:
    """(exit code, the output's last lines) of ``argv``.

    Raises:
        OSError: it cannot be started.
    """
    t0 = time.monotonic()
    tail: list[str] = []
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
        text=True,
        errors="replace",
        start_new_session=True,  # its own group: stop() reaches apt and dpkg below it too
    )
    with proc:
        if started is not None:
            started(proc)
        for line in proc.stdout or ():
            tail = [*tail[-(TAIL - 1) :], line.rstrip()]
            if line.startswith("I: "):
                say(f"[{time.monotonic() - t0:5.1f}s] {line[3:].strip()}")
    return proc.returncode, tail


def stop(proc: subprocess.Popen[str]) -> None:
    """Terminate a build :func:`run` started (its whole process group); its ``run`` returns."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)


def mounts_below(path: Path) -> list[str]:
    """Mount points at or below ``path`` (this process's mount namespace)."""
    top = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = _unescape(line.split()[4])
            if point == top or point.startswith(top + "/"):
                found.append(point)
    return found


def discard(path: Path) -> list[str]:
    """Remove ``path``, after detaching what a killed build left mounted below it (deepest
    first: they are its own ``/proc``, ``/sys`` and ``/dev`` mounts); if any mount stays, remove
    nothing and return the mount points."""
    if not path.exists():
        return []
    umount = shutil.which("umount", path=SYSTEM_PATH) or "/bin/umount"
    for point in sorted(mounts_below(path), key=len, reverse=True):
        with contextlib.suppress(OSError):  # no umount: the mounts stay, and are reported
            subprocess.run([umount, "--lazy", point], capture_output=True, check=False)
    left = mounts_below(path)
    if not left:
        shutil.rmtree(path, ignore_errors=True)
    return left


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    for code in ("040", "011", "012", "134"):
        field = field.replace(f"\\{code}", chr(int(code, 8)))
    return field
