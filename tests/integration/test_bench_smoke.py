"""Every benchmark in bench/ runs once with tiny sizes, so none of them rots unnoticed.

A benchmark nobody runs breaks silently (an API it calls changes, a flag it passes is refused);
this runs each script as its own process, as a person would, and checks it exits 0 and prints a
ratio (``1.23x``): the line a benchmark exists for. Nothing is timed and no target is asserted --
a loaded CI machine makes numbers meaningless; the smoke run only shows the script still works.

How a script declares its smoke run: a module-level constant in the script,

    SMOKE_ARGS = ["--calls", "10"]

a list of string literals (read here with ``ast``, never by importing the script: a bench's
imports start nothing, but its arguments must not depend on running it). Every ``bench/*.py``
not starting with ``_`` (``_platform.py`` and ``_gateway.py`` are helpers) is found by glob; a
script without ``SMOKE_ARGS`` fails ``test_bench_declares_smoke_args``, so a new benchmark cannot
be forgotten. Scripts start their platforms on free ports in their own temporary state dirs
(bench/_platform.py); each runs in its own session: on a timeout the whole group is killed (a
hung bench is a clear failure here, not a leaked process in a later test), and a bench that
exits leaving a process of its group alive fails.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
RATIO = re.compile(r"\d+\.\d+x\b")
TIMEOUT = 200.0  # seconds for one script; the slowest (kube_claims.py) takes ~30 s on 2 cores


def smoke_args(script: str) -> list[str] | None:
    """The script's ``SMOKE_ARGS`` list, or None when it declares none."""
    tree = ast.parse((BENCH / script).read_text(), filename=script)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "SMOKE_ARGS":
            args = ast.literal_eval(value)
            if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
                raise TypeError(f"{script}: SMOKE_ARGS must be a list of strings, not {args!r}")
            return args
    return None


def _left_in_group(pgid: int) -> list[str]:
    """Processes still alive in the finished bench's process group, killed: a bench must stop
    what it started (once it exits they are reparented, out of the suite's own leak check)."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):  # gone meanwhile
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.info["cmdline"] or [])[:200])
                p.kill()
    return left


def test_every_bench_script_is_found() -> None:
    """The glob sees the benchmarks (an empty list would make every other test vacuous)."""
    assert "exec_latency.py" in SCRIPTS and "before_after.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_declares_smoke_args(script: str) -> None:
    """Each benchmark script says how to run it small (a module-level SMOKE_ARGS list)."""
    assert smoke_args(script) is not None, f"bench/{script} has no SMOKE_ARGS = [...]"


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_smoke_run(script: str, tmp_path: Path) -> None:
    """Each benchmark runs with its tiny sizes, exits 0 and prints a ratio line."""
    args = smoke_args(script)
    if args is None:
        pytest.fail(f"bench/{script} has no SMOKE_ARGS = [...]")
    # A bench starts its own bus and services: no SANDPOD_* setting of this run leaks into it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDPOD_")}
    env["SANDPOD_STATE_DIR"] = str(tmp_path / "state")
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills the platform it started
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"bench/{script} did not finish in {TIMEOUT:.0f} s:\n{out[-3000:]}\n{err[-3000:]}"
        )
    left = _left_in_group(proc.pid)
    assert not left, f"bench/{script} left processes running (killed now): {left}"
    assert proc.returncode == 0, (
        f"bench/{script} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    )
    assert RATIO.search(out), f"bench/{script} printed no ratio line (e.g. 1.23x):\n{out[-3000:]}"
