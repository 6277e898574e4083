"""What a Pod snapshot's root-filesystem part costs: execd's walk for entries changed since it
started (``sandpod_execd.snaptar``, run while the sandbox's commands are frozen), next to
``find -xdev -cnewer`` -- the same walk and test in C -- over the same tree in the same run.

The tree is a root filesystem: ``--root DIR`` (the host's ``/usr`` is a large one), else the
default Debian base Sandpod prepares (``~/.cache/sandpod/rootfs``) when there is one, else a
synthetic tree of ``--entries`` files. A few files are changed after the reference moment, so
both sides find the same entries; the page cache is warm for both (best of ``--runs``).

    .venv/bin/python bench/pod_root_walk.py [--root DIR] [--runs 5] [--entries 20000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sandpod_execd.snaptar import _changed

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--entries", "300", "--runs", "1", "--synthetic"]


def _default_root() -> Path | None:
    cache = Path.home() / ".cache" / "sandpod" / "rootfs"
    found = sorted(cache.glob("debian-*/fs")) if cache.is_dir() else []
    return found[-1] if found else None


def _synthetic(root: Path, entries: int) -> None:
    for i in range(entries):
        d = root / f"d{i % 100}" / f"s{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(b"x" * (i % 512))


def _walk(root: Path, since_ns: int) -> tuple[float, int]:
    t = time.perf_counter()
    changed, _ = _changed(root, since_ns, frozenset())
    return time.perf_counter() - t, len(changed)


def _find(root: Path, ref: Path) -> tuple[float, int]:
    t = time.perf_counter()
    out = subprocess.run(
        ["find", str(root), "-xdev", "-cnewer", str(ref)], capture_output=True, check=True
    ).stdout
    return time.perf_counter() - t, len(out.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--synthetic", action="store_true", help="never the Debian base")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pod-root-walk-") as tmp:
        root = args.root or (None if args.synthetic else _default_root())
        if root is None:
            root = Path(tmp) / "root"
            _synthetic(root, args.entries)
        ref = Path(tmp) / "ref"
        ref.write_text("")
        since_ns = ref.lstat().st_ctime_ns + 1
        # changed after the reference, where the walk is: only under a tree we made
        changes = Path(tmp) / "root" if root == Path(tmp) / "root" else None
        if changes is not None:
            for i in range(5):
                (changes / f"d{i}" / "new").write_text("changed")
        entries = sum(1 for _ in root.rglob("*"))
        walks = [_walk(root, since_ns) for _ in range(args.runs)]
        finds = [_find(root, ref) for _ in range(args.runs)]
    walk, found_w = min(walks)[0], walks[0][1]
    find, found_f = min(finds)[0], finds[0][1]
    print(f"tree: {root} ({entries} entries); changed: walk {found_w}, find {found_f}")
    print(f"execd walk   best of {args.runs}: {walk * 1000:8.1f} ms")
    print(f"floor: find  best of {args.runs}: {find * 1000:8.1f} ms")
    median = statistics.median(w for w, _ in walks)
    print(f"ratio {walk / find:.2f}x (median walk {median * 1000:.1f} ms)")
    if found_w != found_f:  # the same test on the same tree: a disagreement is a bug
        raise SystemExit(f"the walk found {found_w} changed entries, find {found_f}")


if __name__ == "__main__":
    main()
