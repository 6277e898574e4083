"""A local jail's traces on the host: its directories, its jail file, its holder process.

Why a module of its own: ``local.py`` (the driver's state machine: create, inspect, freeze,
destroy) calls these leaf operations, which touch only files and ``/proc``: make an instance's
directories with their modes, the resolver and ``/var/tmp`` in its writable layer, read and
write the jail file (atomically: write a temporary, rename), identify a process by pid and
start time, kill a holder and wait for it, remove a tree that overlayfs left mode-0 pieces in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from sandpod_lifecycle.runtime import diskquota
from sandpod_lifecycle.runtime.base import DestroyFailed
from sandpod_service import jailfile
from sandpod_service.jailfile import JailFile, JailReservation

__all__ = [
    "kill_holder",
    "make_dirs",
    "read_jail",
    "remove_tree",
    "start_time",
    "writable_var_tmp",
    "write_jail",
    "write_resolv_conf",
]

log = structlog.get_logger("sandpod.lifecycle.local")


async def kill_holder(data: JailFile, timeout: float, reap: Callable[[], None]) -> None:
    """SIGKILL the holder named in a jail file (if it is still that process) and wait until it
    is gone; the kernel then kills the rest of its pid namespace before the holder is reaped.

    Raises:
        DestroyFailed: it is still there after ``timeout`` seconds.
    """
    pid, start = data.holder_pid, data.holder_start
    if pid is None or start is None:
        return
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        if start_time(pid) != start:
            return  # the pid was recycled: not ours
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while start_time(pid) == start:  # a zombie of our launcher's: reap() collects it
            reap()
            if loop.time() > deadline:
                raise DestroyFailed(f"sandbox holder {pid} would not die", pids=[pid])
            await asyncio.sleep(0.005)
    finally:
        os.close(fd)


def make_dirs(d: Path, top: Path, *, restored: bool, quota: bool) -> None:
    """The instance's directories (see the module docstring), with their modes."""
    for name, mode in (
        ("upper", 0o755),
        ("work", 0o700),
        ("root", 0o755),
        ("workspace", 0o755),
        *((("wswork", 0o700),) if restored else ()),
    ):
        path = (d if name == "root" else top) / name
        path.mkdir()
        path.chmod(mode)  # upper's mode is the sandbox's "/": never 0700
    if quota:  # /tmp in the writable layer: on the disk quota, and never the base's /tmp
        diskquota.mark_opaque(top / "upper" / "tmp")


def write_resolv_conf(base: Path, upper: Path, nameserver: str) -> None:
    """``/etc/resolv.conf`` in the writable layer: the node's resolver on the gateway address
    (every port-53 packet goes there anyway; this spares the sandbox a dead upstream).
    ``/etc`` in the writable layer takes the base's mode and owner (overlayfs shows the upper
    directory's)."""
    etc = upper / "etc"
    if not etc.exists():
        etc.mkdir()
        with contextlib.suppress(OSError):
            st = (base / "etc").stat()
            os.chown(etc, st.st_uid, st.st_gid)
            etc.chmod(st.st_mode & 0o7777)
    conf = etc / "resolv.conf"
    conf.write_text(f"# written by sandpod: the node's resolver\nnameserver {nameserver}\n")
    conf.chmod(0o644)


def writable_var_tmp(upper: Path) -> None:
    """Rootless, the base's directories belong to a uid our user namespace does not map, so the
    overlay refuses to copy one up (EOVERFLOW): ``/var/tmp`` (the base's own is 1777) is made in
    the writable layer already, ours, so a sandbox can write there as it could as root."""
    var_tmp = upper / "var" / "tmp"
    var_tmp.mkdir(parents=True)
    var_tmp.chmod(0o1777)


def remove_tree(d: Path) -> list[str]:
    """rm -r ``d``; return what could not be removed. overlayfs leaves a mode-0 ``work``
    directory in each workdir: as root that does not matter, rootless it is ours to chmod."""
    errors: list[str] = []

    def retry(_func: Callable[..., Any], path: str, exc: Any) -> None:
        parent = os.path.dirname(path)
        try:
            os.chmod(parent, 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError as again:
            errors.append(f"{path}: {again}")

    shutil.rmtree(d, onerror=retry)
    return errors


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot): with the pid, a unique identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def read_jail(path: Path) -> JailFile | JailReservation | None:
    """The jail file at ``path``; None if there is none, or it is not one this driver wrote
    (another version: logged, and then treated like a directory that is not ours)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        return jailfile.decode(raw)
    except jailfile.JailFileInvalid as exc:
        log.warning("jail_file_unreadable", path=str(path), reason=exc.reason)
        return None


def write_jail(path: Path, record: JailFile | JailReservation) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(jailfile.encode(record))
    tmp.chmod(0o600)
    tmp.replace(path)
