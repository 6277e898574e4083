"""Host helpers of the supervisor (``sandpod up``): files only its owner may read, ports, the
processes it watches, HTTP readiness, and what the kernel allows (stdlib only)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
from pathlib import Path

__all__ = [
    "die_with_parent",
    "http_ok",
    "instance_pids",
    "port_free",
    "private_dir",
    "tail",
    "user_namespaces",
    "wait_exit",
    "write_private",
]

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def instance_pids(directory: Path) -> list[tuple[str, int]]:
    """(sandbox id, execd pid) of live instances recorded by lifecycle's launcher."""
    out = []
    for record in directory.glob("*.json"):
        try:
            pid = int(json.loads(record.read_text())["pid"])
            if b"sandpod_execd" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append((record.stem, pid))
        except (OSError, ValueError, KeyError):
            continue
    return out


async def wait_exit(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to exit (pidfd: an event, not polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await asyncio.wait_for(exited, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def http_ok(host: str, port: int, path: str) -> bool:
    """GET ``path`` answers 200 (stdlib only: the SDK has no HTTP client dependency)."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(reader.readline(), 2.0)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return line.startswith(b"HTTP/1.1 200")


def private_dir(path: Path) -> None:
    """``path`` exists with mode 0700 (an older version's may be 0755)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, mode 0600 from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def user_namespaces() -> bool:
    """Whether this kernel lets an unprivileged user create user namespaces."""
    try:
        limit = Path("/proc/sys/user/max_user_namespaces").read_text().strip()
    except OSError:
        return False
    try:
        clone = Path("/proc/sys/kernel/unprivileged_userns_clone").read_text().strip()
    except OSError:
        clone = "1"  # upstream kernels have no such switch
    return limit not in ("", "0") and clone == "1"
