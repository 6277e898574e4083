"""A directory as a tar stream through the SDK (``fs.archive`` out, ``fs.extract`` in) next to
the same ``tar`` (same GNU flags) run in the sandbox with no transport (``tar -c . | wc -c``,
``tar -x`` of a file already there), measured in the same run on the same tree.

The tree: one large incompressible file plus many 4 KiB files (mixed sizes, as a workspace is).
The ratio says what the streaming exec (window-acknowledged stdout out, one stdin request per
256 KiB in) costs on top of ``tar`` itself.

    .venv/bin/python bench/fs_archive.py [--big-mib 256] [--small 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _platform import platform
from sandpod import AsyncSandbox

SMOKE_ARGS = ["--big-mib", "1", "--small", "5", "--rounds", "1"]

MiB = 1024 * 1024


async def measure(url: str, big_mib: int, small: int, rounds: int) -> None:
    async with await AsyncSandbox.connect("bench", nats_url=url) as sbx:
        await sbx.exec(
            f"rm -rf tree out* t.tar && mkdir -p tree && head -c {big_mib * MiB} /dev/urandom "
            f"> tree/big && for i in $(seq {small}); do head -c 4096 /dev/urandom > tree/s$i; "
            "done",
            check=True,
        )
        floors_out, outs, floors_in, ins = [], [], [], []
        size = 0
        for r in range(rounds):
            t0 = time.perf_counter()
            res = await sbx.exec("tree", "tar -c --xattrs --sparse -f - . | wc -c", check=True)
            floors_out.append(time.perf_counter() - t0)
            size = int(res.stdout)
            t0 = time.perf_counter()
            data = bytearray()
            async for chunk in sbx.fs.archive("tree"):
                data += chunk
            outs.append(time.perf_counter() - t0)
            if len(data) != size:
                raise SystemExit(f"archive gave {len(data)} bytes, tar alone {size}")
            await sbx.exec("tree", "tar -c --xattrs --sparse -f ../t.tar .", check=True)
            t0 = time.perf_counter()
            await sbx.exec(
                f"mkdir -p floor{r} && cd floor{r} && tar -x -p --xattrs --sparse -f ../t.tar",
                check=True,
            )
            floors_in.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await sbx.fs.extract(f"out{r}", bytes(data))
            ins.append(time.perf_counter() - t0)
            await sbx.exec(f"rm -rf floor{r} out{r}", check=True)

    def rate(seconds: list[float]) -> float:
        return size / statistics.median(seconds) / 1e6

    print(f"tree: {size / MiB:.1f} MiB tar ({big_mib} MiB file + {small} x 4 KiB), {rounds} rounds")
    rows = (
        ("out  tar in the sandbox -> wc", rate(floors_out), None),
        ("out  fs.archive -> client", rate(outs), rate(floors_out)),
        ("in   tar -x of a local file", rate(floors_in), None),
        ("in   client -> fs.extract", rate(ins), rate(floors_in)),
    )
    for label, mbs, floor in rows:
        tail = "(floor)" if floor is None else f"ratio {mbs / floor:.2f}x"
        print(f"{label:32} {mbs:8.0f} MB/s  {tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with platform() as (url, _execd):
        asyncio.run(measure(url, args.big_mib, args.small, args.rounds))


if __name__ == "__main__":
    main()
