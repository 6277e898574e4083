"""Many WebSocket terminals through the gateway at once: keystroke echo round trip p50/p99 and
the gateway's memory, next to the same keystroke over NATS directly (the SDK) in the same run.

Each connection opens its own pty running ``cat`` (the kernel's line discipline echoes) and types
keys alternating ``a`` and DEL, timing each until its echo arrives as a binary frame. execd keeps
at most 32 ptys per sandbox, so the terminals are spread over several sandboxes of one execd.

    .venv/bin/python bench/gateway_pty.py [--terminals 200] [--keys 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from websockets.asyncio.client import connect

from _gateway import gateway
from _platform import pct, platform, summary
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--terminals", "2", "--keys", "3"]

PER_SANDBOX = 30


async def terminal(base: str, key: str, sandbox: str, keys: int, out: list[float]) -> None:
    url = base.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox}/pty?shell=cat"
    # the key in a header: the gateway refuses one in the URL (URLs end up in logs)
    auth = {"Authorization": f"Bearer {key}"}
    async with connect(url, max_queue=64, additional_headers=auth) as ws:
        while not (isinstance(m := await ws.recv(), str) and json.loads(m)["type"] == "ready"):
            pass
        for i in range(keys):
            t0 = time.perf_counter()
            await ws.send(b"a" if i % 2 == 0 else b"\x7f")
            while not isinstance(await ws.recv(), bytes):
                pass
            out.append(time.perf_counter() - t0)
        await ws.send(json.dumps({"type": "signal", "signal": 9}))


async def direct(url: str, keys: int) -> list[float]:
    sbx = await AsyncSandbox.connect("bench", nats_url=url)
    samples: list[float] = []
    try:
        term = await sbx.pty.open("cat")
        reader = term.__aiter__()
        for i in range(keys):
            t0 = time.perf_counter()
            await term.write(b"a" if i % 2 == 0 else b"\x7f")
            await reader.__anext__()
            samples.append(time.perf_counter() - t0)
        await term.close()
    finally:
        await sbx.close()
    return samples


def rss_mib(pid: int) -> tuple[float, float]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def main(terminals: int, keys: int) -> None:
    boxes = [f"b{i}" for i in range((terminals + PER_SANDBOX - 1) // PER_SANDBOX)]
    with (
        platform() as (url, _),
        tempfile.TemporaryDirectory() as tmp,
        gateway(url) as (base, key, proc),
    ):
        execd = subprocess.Popen(
            [sys.executable, "-m", "sandpod_execd"],
            stderr=subprocess.DEVNULL,
            env={
                **os.environ,
                "SANDPOD_NATS_URL": url,
                "SANDPOD_SANDBOX_ID": ",".join(boxes),
                "SANDPOD_STATE_DIR": tmp,
                "SANDPOD_LOG_LEVEL": "warning",
            },
        )
        try:
            for box in boxes:  # wait until the second execd answers for every sandbox
                sbx = await AsyncSandbox.connect(box, nats_url=url)
                try:
                    for _ in range(200):
                        try:
                            await sbx.ping(timeout=1)
                            break
                        except Exception:
                            await asyncio.sleep(0.05)
                finally:
                    await sbx.close()
            floor = await direct(url, 200)
            idle = rss_mib(proc.pid)[0]
            samples: list[float] = []
            t0 = time.perf_counter()
            async with asyncio.TaskGroup() as tg:
                for i in range(terminals):
                    tg.create_task(terminal(base, key, boxes[i // PER_SANDBOX], keys, samples))
            wall = time.perf_counter() - t0
            now, peak = rss_mib(proc.pid)
        finally:
            execd.terminate()
            execd.wait(15)
        print(summary("keystroke echo, SDK over NATS (1 pty)", floor))
        print(summary(f"keystroke echo via gateway ({terminals} ws)", samples))
        print(
            f"{'ratio p50 / p99':38} {pct(samples, 50) / pct(floor, 50):.2f}x / "
            f"{pct(samples, 99) / pct(floor, 99):.2f}x   wall {wall:.1f} s"
        )
        print(f"{'gateway RSS idle / after / peak':38} {idle:.0f} / {now:.0f} / {peak:.0f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--terminals", type=int, default=200)
    parser.add_argument("--keys", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.terminals, args.keys))
