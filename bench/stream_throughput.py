"""1 GiB of stdout through a streaming exec: MB/s and execd's peak RSS.

The floor is the same command's output read straight from a pipe in this process (no NATS, no
execd), measured in the same run. Targets: >= 100 MB/s through Sandpod, execd peak RSS < 100 MB.

    .venv/bin/python bench/stream_throughput.py [--mib 1024] [--window-mib 4]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import subprocess
import time
from pathlib import Path

from _platform import platform
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--mib", "4", "--window-mib", "1"]

MiB = 1024 * 1024


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def floor_mb_s(nbytes: int) -> float:
    """Read the same bytes from a local pipe as fast as Python can (no NATS, no execd)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(["head", "-c", str(nbytes), "/dev/zero"], stdout=subprocess.PIPE)
    assert isinstance(proc.stdout, io.BufferedReader)  # bufsize -1: a buffered pipe
    got = 0
    while chunk := proc.stdout.read1(256 * 1024):
        got += len(chunk)
    proc.wait()
    assert got == nbytes
    return nbytes / MiB / (time.perf_counter() - t0)


async def through_sandpod(url: str, nbytes: int, window: int) -> tuple[float, int]:
    sbx = await AsyncSandbox.connect("bench", nats_url=url)
    got = 0
    t0 = time.perf_counter()
    async with sbx.exec_stream(["head", "-c", str(nbytes), "/dev/zero"], window=window) as st:
        async for chunk in st:
            got += len(chunk.data)
        status = await st.wait()
    elapsed = time.perf_counter() - t0
    await sbx.close()
    assert status.exit_code == 0 and got == nbytes, (status, got)
    return nbytes / MiB / elapsed, got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--window-mib", type=int, default=4)
    args = parser.parse_args()
    nbytes = args.mib * MiB
    with platform() as (url, execd):
        rss_start = vm_kib(execd.pid, "VmRSS")
        floor = floor_mb_s(nbytes)
        rate, _ = asyncio.run(through_sandpod(url, nbytes, args.window_mib * MiB))
        peak = vm_kib(execd.pid, "VmHWM")
    print(f"stream throughput: {args.mib} MiB of stdout, window {args.window_mib} MiB\n")
    print(f"floor: local pipe read in Python    {floor:8.0f} MiB/s")
    print(
        f"sandpod exec_stream (SDK)           {rate:8.0f} MiB/s  ({rate / floor:.2f}x of floor; "
        f"target >= 100: {'OK' if rate >= 100 else 'BELOW TARGET'})"
    )
    print(
        f"execd RSS: {rss_start / 1024:.1f} MiB at start, peak {peak / 1024:.1f} MiB "
        f"(target < 100 MiB: {'OK' if peak < 100 * 1024 else 'ABOVE TARGET'})"
    )


if __name__ == "__main__":
    main()
