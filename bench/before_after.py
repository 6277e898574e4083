"""Run one benchmark on an older commit and on this tree, alternately, and print both side by side.

A change's cost is only readable next to the code it changes, measured in the same run on the same
(shared, noisy) machine: the old commit gets its own git worktree and virtualenv under
``~/.cache/sandpod/bench-base/<commit>`` (built once with ``make install``, progress shown), then
the benchmark runs ``--rounds`` times in each tree, alternating, so a noisy moment weighs on both.
Every ``p50`` line both runs print is shown with the old value, the new value and new/old.

    .venv/bin/python bench/before_after.py --base c942f96 exec_latency.py -- --calls 300
    .venv/bin/python bench/before_after.py --base c942f96 jail_exec_latency.py
    .venv/bin/python bench/before_after.py --base-tree ../other-worktree exec_latency.py

``--base-tree`` compares with a tree that is already checked out and installed (another worktree
with its own .venv) instead of building one; the smoke run compares this tree with itself.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandpod" / "bench-base"
P50 = re.compile(r"^(?P<name>.+?)\s+p50\s+(?P<value>[0-9.]+) ms")
# The smoke run (tests/integration/test_bench_smoke.py): this tree against itself, one round of a
# cheap benchmark -- the comparison, the parsing and the ratio table, without building a base.
SMOKE_ARGS = ["--base-tree", ".", "--rounds", "1", "watch_latency.py", "--", "--count", "3"]


def base_tree(commit: str) -> Path:
    """A worktree of ``commit`` with its own installed .venv (made once, reused after)."""
    full = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = CACHE / full[:12]
    if not (tree / ".venv" / "bin" / "python").exists():
        if not tree.exists():
            print(f"== making a worktree of {full[:12]} in {tree}", flush=True)
            CACHE.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), full],
                check=True,
            )
        print(f"== installing {full[:12]} (make install; once)", flush=True)
        subprocess.run(["make", "-C", str(tree), "install"], check=True, stdout=sys.stderr)
    return tree


def run(tree: Path, bench: str, args: list[str]) -> dict[str, float]:
    """Run ``bench`` in ``tree``; return its p50 lines (name -> ms)."""
    out = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), str(tree / "bench" / bench), *args],
        check=False,
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"{bench} failed in {tree}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    found = {}
    for line in out.stdout.splitlines():
        if m := P50.match(line):
            found[m["name"].strip()] = float(m["value"])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    base = ap.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", help="the older commit to compare with")
    base.add_argument(
        "--base-tree", type=Path, help="an installed tree (with .venv) to compare with instead"
    )
    ap.add_argument("--rounds", type=int, default=3, help="runs per tree, alternating")
    ap.add_argument("bench", help="a script in bench/, e.g. exec_latency.py")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    opts = ap.parse_args()
    opts.args = [a for a in opts.args if a != "--"]
    old_tree = opts.base_tree.resolve() if opts.base_tree else base_tree(opts.base)
    if not (old_tree / ".venv" / "bin" / "python").exists():
        sys.exit(f"{old_tree} has no .venv/bin/python (make install there first)")
    old: dict[str, list[float]] = {}
    new: dict[str, list[float]] = {}
    for i in range(opts.rounds):
        for label, tree, into in (("base", old_tree, old), ("this tree", ROOT, new)):
            print(f"== round {i + 1}/{opts.rounds}: {opts.bench} on {label}", flush=True)
            for name, value in run(tree, opts.bench, opts.args).items():
                into.setdefault(name, []).append(value)
    print(f"\n{opts.bench}: median of {opts.rounds} runs' p50 each (ms)")
    print(f"{'':38} {'base':>9} {'this tree':>9} {'ratio':>7}")
    for name, values in new.items():
        now = statistics.median(values)
        if name in old:
            was = statistics.median(old[name])
            print(f"{name[:38]:38} {was:9.3f} {now:9.3f} {now / was:6.2f}x")
        else:
            print(f"{name[:38]:38} {'-':>9} {now:9.3f}")


if __name__ == "__main__":
    main()
