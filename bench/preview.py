"""Preview URLs: an HTTP round trip and a 1 GiB download through the gateway, next to the same
directly to the sandbox's port (the floor), measured in the same run on the same app.

Also the other data path the gateway could have used, bytes over NATS through execd, measured as
the gateway's file download of a file of the same app's size (``GET …/files/content``: chunked
NATS requests answered by execd): that is why preview bytes go gateway -> sandbox address over
TCP. Targets (issue 15): round-trip p50 at most 1.5x direct; the download at least 200 MB/s.

The gateway measured runs as it ships: its native front (``sandpod-front``, built by ``make
install``) relays the requests of a connection's kept admission; next to it, the same gateway
with the front off (``SANDPOD_GATEWAY_PREVIEW_FRONT=false``: its Python front.py relays them)
and with both off (uvicorn), and a do-nothing Python relay. The gateway's CPU counts the front's.

The app is ``bench/_preview_app.py`` (asyncio, standard library), started in a process-runtime
sandbox through the gateway's processes API; every client is a lean keep-alive HTTP/1.1 one, so
the ratio is the gateway's and not a Python HTTP client's.

    .venv/bin/python bench/preview.py [--calls 2000] [--mib 1024] [--nats-mib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from _gateway import gateway
from _platform import free_port, lifecycle, pct

SMOKE_ARGS = ["--calls", "20", "--mib", "8", "--nats-mib", "4"]
APP = (Path(__file__).parent / "_preview_app.py").read_text()
WARMUP = 100
READ = 4 << 20  # more than the stream buffer holds: a read takes all of it (no memmove)


class Lean:
    """One keep-alive HTTP/1.1 connection: GET, read a Content-Length body."""

    def __init__(self, port: int, key: str | None) -> None:
        self.port = port
        self.auth = f"authorization: Bearer {key}\r\n" if key else ""
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Lean:
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.w is not None:
            self.w.close()

    async def get(self, path: str, sink: hashlib._Hash | None = None) -> int:
        """GET ``path``; the body's length (fed to ``sink`` if given, else kept in memory)."""
        if self.r is None or self.w is None:
            raise RuntimeError("use `async with Lean(...)`")
        self.w.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n{self.auth}\r\n".encode())
        head = (await self.r.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        if not head.startswith("http/1.1 200"):
            raise SystemExit(f"GET {path}: {head.splitlines()[0]}")
        length = int(head.split("content-length:")[1].split("\r\n")[0])
        left = length
        while left:
            data = await self.r.read(min(left, READ))
            if not data:
                raise SystemExit(f"GET {path}: closed {left} bytes early")
            if sink is not None:
                sink.update(data)
            left -= len(data)
        return length


async def round_trips(clients: list[tuple[Lean, str]], calls: int) -> list[list[float]]:
    """Latencies of each (client, path), interleaved (a call of each per round) after a
    warm-up."""
    for c, path in clients:
        for _ in range(min(WARMUP, calls)):
            await c.get(path)
    out: list[list[float]] = [[] for _ in clients]
    for _ in range(calls):
        for i, (c, path) in enumerate(clients):
            t0 = time.perf_counter()
            await c.get(path)
            out[i].append(time.perf_counter() - t0)
    return out


@contextlib.contextmanager
def relay(upstream: int) -> Iterator[int]:
    """A do-nothing relay to ``upstream`` (bench/_relay.py) in a process of its own: its port."""
    port = free_port()
    script = Path(__file__).parent / "_relay.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), str(upstream)], stdout=subprocess.PIPE
    )
    try:
        if proc.stdout is None or not proc.stdout.readline():
            raise SystemExit("the reference relay did not start")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _p50_p99(samples: list[float]) -> str:
    return f"p50 {pct(samples, 50) * 1e3:.3f} ms  p99 {pct(samples, 99) * 1e3:.3f} ms"


async def download(c: Lean, path: str) -> float:
    """MB/s of one GET (the body is counted, not hashed: hashing here would eat the CPU the
    gateway and the app share with this client on a small machine)."""
    t0 = time.perf_counter()
    n = await c.get(path)
    return n / (time.perf_counter() - t0) / 1e6


async def digest(c: Lean, path: str) -> str:
    sink = hashlib.sha256()
    await c.get(path, sink)
    return sink.hexdigest()


async def main(calls: int, mib: int, nats_mib: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with lifecycle(Path(tmp), runtime="process") as url:
            with (
                gateway(url) as (base, key, proc),
                gateway(url, SANDPOD_GATEWAY_PREVIEW_FRONT="false") as (python, _, _),
                gateway(url, SANDPOD_GATEWAY_PREVIEW_FAST_PATH="false") as (slow, _, _),
            ):
                if not _children(proc.pid):
                    raise SystemExit("the gateway runs no sandpod-front: `make install` builds it")
                await run(
                    base, key, calls, mib, nats_mib, gw_pid=proc.pid, slow=slow, python=python
                )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and its children (the front) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


async def run(
    base: str,
    key: str,
    calls: int,
    mib: int,
    nats_mib: int,
    *,
    gw_pid: int,
    slow: str,
    python: str,
) -> None:
    """``base``: the gateway measured; ``python``: one without its native front; ``slow``: one
    with the preview fast path off (``SANDPOD_GATEWAY_PREVIEW_FAST_PATH=false``: previews
    through uvicorn, as before it)."""
    port = free_port()
    gw_port = int(base.rsplit(":", 1)[1])
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {key}"}) as c:
        r = await c.post("/v1/sandboxes", json={"metadata": {"name": "pv"}, "wait": 60}, timeout=90)
        r.raise_for_status()
        address = r.json()["status"]["endpoint"]["address"]
        proc = {"proc_id": "app", "argv": ["python3", "-c", APP, str(port)]}
        (await c.post("/v1/sandboxes/pv/processes", json=proc)).raise_for_status()
        prefix = f"/v1/sandboxes/pv/ports/{port}"
        end = time.monotonic() + 30
        while (await c.get(f"{prefix}/ping")).status_code != 200:
            if time.monotonic() > end:
                raise SystemExit("the app did not start")
            await asyncio.sleep(0.05)
        size = nats_mib << 20
        write = {"shell": f"head -c {size} /dev/zero > pv.bin && pwd", "timeout": 120}
        where = (await c.post("/v1/sandboxes/pv/exec", json=write, timeout=150)).json()
        blob = where["stdout"].strip() + "/pv.bin"
        print(f"sandbox address {address} (process runtime), app port {port}")
        with relay(port) as relay_port:
            async with (
                Lean(port, None) as direct,
                Lean(gw_port, key) as proxied,
                Lean(relay_port, None) as relayed,
                Lean(int(slow.rsplit(":", 1)[1]), key) as uvicorn,
                Lean(int(python.rsplit(":", 1)[1]), key) as in_python,
            ):
                cpu = cpu_seconds(gw_pid)
                clients = [
                    (direct, "/ping"),
                    (proxied, f"{prefix}/ping"),
                    (relayed, "/ping"),
                    (uvicorn, f"{prefix}/ping"),
                    (in_python, f"{prefix}/ping"),
                ]
                d, g, via, old, py = await round_trips(clients, calls)
                cpu = cpu_seconds(gw_pid) - cpu
        print(f"round trip direct   {_p50_p99(d)} (floor)")
        print(f"round trip gateway  {_p50_p99(g)}")
        print(f"round trip ratio    p50 {pct(g, 50) / pct(d, 50):.2f}x (target <= 1.50x)")
        print(
            f"round trip through a do-nothing relay (bench/_relay.py) {_p50_p99(via)}: "
            f"{pct(via, 50) / pct(d, 50):.2f}x, the least an extra hop adds here"
        )
        print(
            f"round trip through the gateway without its native front (front.py) "
            f"{_p50_p99(py)}: {pct(py, 50) / pct(d, 50):.2f}x"
        )
        print(
            f"round trip through the gateway without its fast path (uvicorn) {_p50_p99(old)}: "
            f"{pct(old, 50) / pct(d, 50):.2f}x"
        )
        per = cpu / (calls + min(WARMUP, calls)) * 1e6
        print(f"gateway CPU per proxied round trip {per:.0f} us (user + system, with its front)")
        rate = await downloads(port, gw_port, key, prefix, mib)
        async with Lean(gw_port, key) as proxied:
            over_nats = await download(proxied, f"/v1/sandboxes/pv/files/content?path={blob}")
            print(f"{nats_mib} MiB over NATS via execd (files API) {over_nats:8.0f} MB/s")
            print(f"direct TCP path / NATS path {rate / over_nats:.2f}x")
        await c.post("/v1/sandboxes/pv/exec", json={"argv": ["rm", "-f", blob]})
        await c.delete("/v1/sandboxes/pv", params={"wait": 30}, timeout=60)


async def downloads(port: int, gw_port: int, key: str, prefix: str, mib: int) -> float:
    """The download through the gateway, on a connection's first request and on a kept one,
    next to the same directly: the first one's MB/s."""
    async with (
        Lean(port, None) as direct,
        Lean(gw_port, key) as proxied,
        Lean(gw_port, key) as kept,
    ):
        n = mib << 20
        floor = await download(direct, f"/bytes?n={n}")
        # a connection's first request: the gateway decides and relays it (through its
        # front); a kept connection's next one: the front relays it itself
        rate = await download(proxied, f"{prefix}/bytes?n={n}")
        await kept.get(f"{prefix}/ping")
        kept_rate = await download(kept, f"{prefix}/bytes?n={n}")
        check = f"/bytes?n={min(n, 64 << 20)}"
        want = await digest(direct, check)
        for client in (proxied, kept):
            if await digest(client, f"{prefix}{check}") != want:
                raise SystemExit("a download through the gateway differs from the direct one")
        print(f"{mib} MiB download direct  {floor:8.0f} MB/s (floor)")
        print(
            f"{mib} MiB download gateway {rate:8.0f} MB/s, a connection's first request "
            "(target >= 200 MB/s)"
        )
        print(f"{mib} MiB download gateway {kept_rate:8.0f} MB/s, on a kept connection")
        print(f"download ratio gateway/direct {rate / floor:.2f}x / {kept_rate / floor:.2f}x")
        return rate


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=1024, help="download size (MiB)")
    parser.add_argument("--nats-mib", type=int, default=256, help="NATS-path download (MiB)")
    a = parser.parse_args()
    asyncio.run(main(a.calls, a.mib, a.nats_mib))
