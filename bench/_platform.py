"""Start a throwaway platform for a benchmark: nats-server and one execd, on free ports."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandpod_lifecycle.runtime.local import LocalRuntime

NATS_BIN = Path(sysconfig.get_path("scripts")) / "nats-server"
ROOTFS_CACHE = Path("~/.cache/sandpod/rootfs").expanduser()  # the test suite's too


def default_rootfs() -> Path:
    """The default sandbox root filesystem a bench's lifecycle (local runtime) gives templates
    without ``rootfs``: ``SANDPOD_DEFAULT_ROOTFS``, else the machine's cached one (built on the
    first run, about a minute, progress on stderr)."""
    from sandpod_image import debian

    given = os.environ.get("SANDPOD_DEFAULT_ROOTFS")
    if given:
        return Path(given)

    def say(line: str) -> None:
        print(f"  rootfs: {line}", file=sys.stderr)

    return debian.prepare(ROOTFS_CACHE, progress=say).fs


async def remove_runtime(rt: LocalRuntime, state: Path) -> None:
    """Destroy every jail of a bench's ``LocalRuntime`` ``rt``, its cgroup parents and ``state``."""
    for sandbox_id in await rt.list():
        await rt.destroy(sandbox_id)
    plan = rt._cgroup_plan(await rt.capabilities())
    for hierarchy in {h for h in (plan.core, *plan.limits.values()) if h is not None}:
        with contextlib.suppress(FileNotFoundError):
            (hierarchy.mount / plan.parent).rmdir()
    shutil.rmtree(state, ignore_errors=True)


@contextlib.asynccontextmanager
async def lifecycle(state: Path, runtime: str = "local", **env: str) -> AsyncIterator[str]:
    """Yield the bus URL of nats-server and a lifecycle service (``runtime``; local: on the
    default base) answering, their state in ``state``; both stopped on exit, sandboxes destroyed."""
    import asyncio

    from sandpod import AsyncSandbox
    from sandpod.errors import SandpodError

    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    nats = subprocess.Popen(
        [str(NATS_BIN), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(state)],
        stderr=subprocess.DEVNULL,
    )
    _wait_port(port)
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": url,
        "SANDPOD_STATE_DIR": str(state),
        "SANDPOD_LOG_LEVEL": "warning",
        "SANDPOD_RUNTIME": runtime,
        "SANDPOD_DESTROY_ON_EXIT": "true",
        **env,
    }
    if runtime == "local":
        env.setdefault("SANDPOD_DEFAULT_ROOTFS", str(default_rootfs()))
    lc = subprocess.Popen(
        [sys.executable, "-m", "sandpod_lifecycle"], env=env, stderr=subprocess.DEVNULL
    )
    try:
        while True:
            try:
                await AsyncSandbox.list(nats_url=url)
                break
            except SandpodError:
                await asyncio.sleep(0.05)
        yield url
    finally:
        lc.terminate()
        lc.wait()
        nats.terminate()
        nats.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, host: str = "127.0.0.1", timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5) as s:
            if s.recv(4).startswith(b"INFO"):
                return
        time.sleep(0.02)
    raise SystemExit(f"nats-server did not start on {port}")


def _wait_execd(sandbox: str, url: str, creds: str | None = None) -> None:
    """Return once ``sandbox``'s execd answers a ping (20 s at most)."""
    from sandpod import Sandbox
    from sandpod.errors import SandpodError

    end = time.monotonic() + 20
    while True:
        try:
            with Sandbox.connect(sandbox, nats_url=url, nats_creds=creds) as sbx:
                sbx.ping(timeout=1)
            return
        except SandpodError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def platform(sandbox: str = "bench", **env: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Yield (nats_url, execd process) with execd answering for ``sandbox``."""

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        nats = subprocess.Popen(
            [str(NATS_BIN), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"nats://127.0.0.1:{port}"
        execd = None
        try:
            _wait_port(port)
            execd = subprocess.Popen(
                [sys.executable, "-m", "sandpod_execd"],
                env={
                    **os.environ,
                    "SANDPOD_NATS_URL": url,
                    "SANDPOD_SANDBOX_ID": sandbox,
                    "SANDPOD_STATE_DIR": tmp,
                    "SANDPOD_LOG_LEVEL": "warning",
                    **env,
                },
                stderr=subprocess.DEVNULL,
            )
            _wait_execd(sandbox, url)
            yield url, execd
        finally:
            for proc in (execd, nats):
                if proc is not None:
                    proc.terminate()
                    proc.wait(15)


@contextlib.contextmanager
def auth_platform(sandbox: str = "bench", **env: str) -> Iterator[tuple[str, str]]:
    """(nats_url, client creds): the bus as `sandpod up` runs it -- nats-server in operator mode
    with its users -- and one execd (``env`` added) with the ``execd`` credential."""
    from sandpod_lifecycle.embedded_auth import provision

    with tempfile.TemporaryDirectory() as tmp:
        state, port = Path(tmp), free_port()
        auth = provision(state, "sandpod", "bench-node", int(time.time()))
        conf = state / "nats.conf"
        conf.write_text(f'include "{auth.directory.name}/operator.conf"\n')
        nats = subprocess.Popen(
            [
                str(NATS_BIN),
                "-c",
                str(conf),
                "-a",
                "127.0.0.1",
                "-p",
                str(port),
                "-js",
                "-sd",
                str(state / "js"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        execd = None
        try:
            _wait_port(port)
            url = f"nats://127.0.0.1:{port}"
            execd = subprocess.Popen(
                [sys.executable, "-m", "sandpod_execd"],
                env={
                    **os.environ,
                    "SANDPOD_NATS_URL": url,
                    "SANDPOD_SANDBOX_ID": sandbox,
                    "SANDPOD_STATE_DIR": tmp,
                    "SANDPOD_LOG_LEVEL": "warning",
                    "SANDPOD_NATS_CREDS": str(auth.creds("execd")),
                    **env,
                },
                stderr=subprocess.DEVNULL,
            )
            _wait_execd(sandbox, url, str(auth.creds("client")))
            yield url, str(auth.creds("client"))
        finally:
            for proc in (execd, nats):
                if proc is not None:
                    proc.terminate()
                    proc.wait(15)


RESPONDER = """
import asyncio, sys
import nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe("bench.echo", cb=echo)
    await nc.flush()  # the subscription has reached the server before we say ready
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def echo_responder(url: str) -> AsyncIterator[Callable[[int], Awaitable[list[float]]]]:
    """A bare responder in another process (as execd is), warmed up with 100 calls; yields
    ``rtt(n)``, which times ``n`` round trips of a 64-byte request to it. Held open, so a bench
    can interleave floor and Sandpod samples in rounds and a noisy moment hits both alike."""
    from sandpod_bus import Bus, BusSettings

    responder = subprocess.Popen(
        [sys.executable, "-c", RESPONDER, url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert responder.stdout is not None
        responder.stdout.readline()
        bus = await Bus.connect(BusSettings(url=url))

        async def rtt(calls: int) -> list[float]:
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                await bus.request("bench.echo", b"x" * 64, 5)
                samples.append(time.perf_counter() - t0)
            return samples

        await rtt(100)
        yield rtt
        await bus.close()
    finally:
        responder.terminate()
        responder.wait()


async def nats_rtt(url: str, calls: int) -> list[float]:
    """The NATS part of every floor: ``calls`` round trips to a bare responder in another
    process (as execd is), after 100 warm-up calls."""
    async with echo_responder(url) as rtt:
        return await rtt(calls)


def pct(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of ``samples``."""
    ordered = sorted(samples)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def ms(value: float) -> str:
    return f"{value * 1000:8.3f} ms"


def summary(name: str, samples: Sequence[float]) -> str:
    return (
        f"{name:38} p50 {ms(pct(samples, 50))}  p99 {ms(pct(samples, 99))}  "
        f"mean {ms(statistics.fmean(samples))}  n={len(samples)}"
    )
