"""Layer unpack speed: ``sandpod_image.layers.unpack_layer`` next to GNU ``tar -x`` of the same
layer, measured in the same run, for a plain and a gzip layer.

The layer is a synthetic root filesystem: many small files and a few large ones (log-normal
sizes around 4 KiB, half random and half repetitive text, so gzip works about as hard as on
real layers), in ~1300 directories, with symlinks. Both sides read the blob from the page
cache and write to the same disk; the tree is removed between runs, outside the timing. The
floor for gzip is ``tar -xzf`` (tar pipes through a separate ``gzip -d`` process, so it uses two
cores; unpack_layer decompresses in-process) and unpack_layer also computes the diff_id.

    .venv/bin/python bench/layer_unpack.py [--mib 200] [--runs 3]
"""

from __future__ import annotations

import argparse
import io
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from sandpod_image.layers import MEDIA_TYPE_TAR, MEDIA_TYPE_TAR_GZIP, unpack_layer

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--mib", "2", "--runs", "1"]

MiB = 1 << 20
TEXT = b"the quick brown fox jumps over the lazy dog; " * (400 * 1024)


def make_tree(root: Path, total: int, rng: random.Random) -> int:
    """Fill ``root`` with about ``total`` bytes of files; return the number of files."""
    written = count = 0
    while written < total:
        # log-normal around 4 KiB (mean ~30 KiB): a Debian rootfs's shape, many small files
        size = min(int(rng.lognormvariate(math.log(4096), 2.0)), 16 * MiB)
        d = root / f"d{count % 97}" / f"s{count % 13}"
        d.mkdir(parents=True, exist_ok=True)
        body = rng.randbytes(size // 2) + TEXT[: size - size // 2]
        (d / f"f{count}").write_bytes(body)
        if count % 50 == 0:
            os.symlink(f"f{count}", d / f"l{count}")
        written += size
        count += 1
    return count


def make_blobs(work: Path, mib: int, real: Path | None) -> tuple[Path, Path, int]:
    plain = work / "layer.tar"
    if real is not None:
        shutil.copyfile(real, plain)
        with tarfile.open(plain) as tar:
            files = sum(1 for m in tar if m.isfile())
    else:
        src = work / "src"
        src.mkdir()
        files = make_tree(src, mib * MiB, random.Random(14))
        with tarfile.open(plain, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(src, arcname=".")
        shutil.rmtree(src)
    gz = work / "layer.tar.gz"
    comp = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    with plain.open("rb") as inp, gz.open("wb") as out:
        while chunk := inp.read(MiB):
            out.write(comp.compress(chunk))
        out.write(comp.flush())
    return plain, gz, files


def cpu() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def once(run: Callable[[Path], None], work: Path) -> tuple[float, float]:
    """(wall, cpu) seconds of one run; cpu (user+sys, children included) is steadier under load."""
    dest = work / "dest"
    dest.mkdir()
    start, cpu0 = time.perf_counter(), cpu()
    run(dest)
    took, used = time.perf_counter() - start, cpu() - cpu0
    shutil.rmtree(dest)
    os.sync()  # the next run must not pay for this one's writeback
    return took, used


def compare(
    floor: Callable[[Path], None], mine: Callable[[Path], None], work: Path, runs: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Median (wall, cpu) of each side, runs interleaved so both see the same machine load."""
    floors, mines = [], []
    for _ in range(runs):
        floors.append(once(floor, work))
        mines.append(once(mine, work))
    return _median(floors), _median(mines)


def _median(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def ours(blob: Path, media_type: str) -> Callable[[Path], None]:
    def run(dest: Path) -> None:
        with blob.open("rb", buffering=0) as f:
            unpack_layer(io.BufferedReader(f, 1 << 20), dest, media_type=media_type)

    return run


def gnu_tar(blob: Path, flags: str) -> Callable[[Path], None]:
    def run(dest: Path) -> None:
        subprocess.run(["tar", flags, str(blob), "-C", str(dest)], check=True)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=200, help="layer size (uncompressed)")
    parser.add_argument("--runs", type=int, default=3, help="runs per side (median)")
    parser.add_argument(
        "--tar", type=Path, help="a real layer tarball instead (the make images Debian one)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="layer-bench-", dir=os.environ.get("TMPDIR")) as t:
        work = Path(t)
        plain, gz, files = make_blobs(work, args.mib, args.tar)
        print(
            f"layer: {files} files, {plain.stat().st_size / MiB:.0f} MiB tar, "
            f"{gz.stat().st_size / MiB:.0f} MiB gzip"
        )
        for label, blob, media_type, flags in (
            ("tar", plain, MEDIA_TYPE_TAR, "-xf"),
            ("tar+gzip", gz, MEDIA_TYPE_TAR_GZIP, "-xzf"),
        ):
            floor, mine = compare(gnu_tar(blob, flags), ours(blob, media_type), work, args.runs)
            print(
                f"{label:9} tar {flags}: {floor[0] * 1000:6.0f} ms (cpu {floor[1] * 1000:5.0f})"
                f"   unpack_layer: {mine[0] * 1000:6.0f} ms (cpu {mine[1] * 1000:5.0f})"
                f"   ratio {mine[0] / floor[0]:.2f}x (cpu {mine[1] / floor[1]:.2f}x)"
            )


if __name__ == "__main__":
    main()
