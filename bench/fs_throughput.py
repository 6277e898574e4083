"""File write/read throughput through the SDK (``fs.upload`` / ``fs.download``) next to a local
``cp`` of the same file on the same disk, measured in the same run; and execd's peak RSS.

Both sides start from the page cache (the source was just written). Sandpod's writes are atomic
and fsync'd before the rename, ``cp`` does neither, so a second floor, ``cp`` + ``fsync``, is
printed too; the ratio is against plain ``cp``.

    .venv/bin/python bench/fs_throughput.py [--big-mib 1024] [--small-runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _platform import pct, platform
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--big-mib", "1", "--small-runs", "2", "--big-runs", "1"]

MiB = 1024 * 1024


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def make_file(path: Path, size: int) -> str:
    """Write ``size`` incompressible bytes to ``path``; returns their SHA-256."""
    block = os.urandom(MiB)
    digest = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            piece = block[: min(left, MiB)]
            piece = left.to_bytes(8, "big") + piece[8:] if len(piece) >= 8 else piece
            f.write(piece)
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def floor_cp(src: Path, dst: Path, *, sync: bool) -> float:
    """Seconds for ``cp src dst`` (plus an fsync of dst when ``sync``)."""
    t0 = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    if sync:
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    elapsed = time.perf_counter() - t0
    dst.unlink()
    return elapsed


async def sandpod_times(
    url: str, src: Path, out: Path, runs: int, size: int
) -> tuple[list[float], list[float]]:
    """Seconds per upload and per download of ``src`` through the SDK (last download kept)."""
    ups: list[float] = []
    downs: list[float] = []
    async with await AsyncSandbox.connect("bench", nats_url=url) as sbx:
        for _ in range(runs):
            t0 = time.perf_counter()
            info = await sbx.fs.upload(src, "/workspace/copy.bin")
            ups.append(time.perf_counter() - t0)
            assert info.size == size
            t0 = time.perf_counter()
            await sbx.fs.download("/workspace/copy.bin", out)
            downs.append(time.perf_counter() - t0)
        await sbx.fs.remove("/workspace/copy.bin")
    return ups, downs


def rate(size: int, seconds: float) -> float:
    return size / MiB / seconds


def report(
    label: str,
    size: int,
    ups: list[float],
    downs: list[float],
    *,
    floor: float,
    floor_sync: float,
) -> None:
    floor_rate, sync_rate = rate(size, floor), rate(size, floor_sync)
    up, down = rate(size, statistics.median(ups)), rate(size, statistics.median(downs))
    print(
        f"\n{label} (median of {len(ups)}; p99 up {pct(ups, 99) * 1000:.1f} ms, "
        f"down {pct(downs, 99) * 1000:.1f} ms)"
    )
    print(f"  floor: local cp (best run)      {floor_rate:9.1f} MiB/s  ({floor * 1000:8.2f} ms)")
    print(
        f"  floor: local cp + fsync (best)  {sync_rate:9.1f} MiB/s  ({floor_sync * 1000:8.2f} ms)"
    )
    print(
        f"  sandpod write (fs.upload)       {up:9.1f} MiB/s  "
        f"({statistics.median(ups) * 1000:8.2f} ms)  {up / floor_rate:.2f}x of cp, "
        f"{up / sync_rate:.2f}x of cp+fsync"
    )
    down_ms = statistics.median(downs) * 1000
    print(
        f"  sandpod read  (fs.download)     {down:9.1f} MiB/s  "
        f"({down_ms:8.2f} ms)  {down / floor_rate:.2f}x of cp"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--small-runs", type=int, default=30)
    parser.add_argument("--big-runs", type=int, default=1)
    args = parser.parse_args()
    with platform() as (url, execd), tempfile.TemporaryDirectory() as tmp:
        rss_start = vm_kib(execd.pid, "VmRSS")
        for label, size, runs in (
            ("1 MiB file", MiB, args.small_runs),
            (f"{args.big_mib} MiB file", args.big_mib * MiB, args.big_runs),
        ):
            src, out = Path(tmp) / "src.bin", Path(tmp) / "out.bin"
            expect = make_file(src, size)
            # The floors take the best of at least 3 runs: a single cp of 1 GiB varies a lot
            # with writeback of earlier dirty pages; Sandpod is not given that benefit.
            floors = [floor_cp(src, Path(tmp) / "cp.bin", sync=False) for _ in range(max(runs, 3))]
            syncs = [floor_cp(src, Path(tmp) / "cp.bin", sync=True) for _ in range(max(runs, 3))]
            ups, downs = asyncio.run(sandpod_times(url, src, out, runs, size))
            assert sha256_of(out) == expect, "the round trip changed the bytes"
            report(label, size, ups, downs, floor=min(floors), floor_sync=min(syncs))
            src.unlink()
            out.unlink()
        peak = vm_kib(execd.pid, "VmHWM")
    print(
        f"\nexecd RSS: {rss_start / 1024:.1f} MiB at start, peak {peak / 1024:.1f} MiB "
        f"(after a {args.big_mib} MiB round trip)"
    )


if __name__ == "__main__":
    main()
