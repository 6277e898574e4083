"""What entering a local-runtime jail adds to an exec, next to the same exec unjailed (needs root).

Two pairs measured in the same run, alternating so host noise hits both alike:

- spawn: execd's ``spawn()`` + wait of ``true``, bare (the process runtime) and through the jail
  prefix (pid-namespace fork, cgroup join in ``sh``, ``nsenter``, the jail's ``sh`` restoring env);
- SDK: ``exec(["true"])`` round trips through a process-runtime execd on an anonymous NATS (the
  floor of ``bench/exec_latency.py``: NATS + spawn) and through an execd with
  ``SANDPOD_EXECD_JAIL`` on the bus as ``sandpod up`` runs it (operator mode, the ``execd`` and
  ``client`` users): the jailed number carries everything the trust boundaries cost an exec
  (authenticated bus, seccomp, the sandbox user's identity for the cwd check).

    sudo .venv/bin/python bench/jail_exec_latency.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from _platform import auth_platform, pct, platform, remove_runtime, summary
from sandpod import AsyncSandbox
from sandpod_execd.jail import Jail
from sandpod_execd.process import Command, spawn
from sandpod_lifecycle.runtime.base import InstanceSpec
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--calls", "10"]

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/workspace", "LANG": "C.UTF-8"}


async def run_spawn(cmd: Command) -> None:
    proc = spawn(cmd)
    await proc.wait()
    proc.close_pipes()


async def alternate(
    a: Callable[[], Awaitable[object]], b: Callable[[], Awaitable[object]], calls: int
) -> tuple[list[float], list[float]]:
    for _ in range(20):
        await a()
        await b()
    sa: list[float] = []
    sb: list[float] = []
    for _ in range(calls):
        for fn, out in ((a, sa), (b, sb)):
            t0 = time.perf_counter()
            await fn()
            out.append(time.perf_counter() - t0)
    return sa, sb


def report(what: str, floor: list[float], jailed: list[float]) -> None:
    print(summary(f"{what}: unjailed (floor)", floor))
    print(summary(f"{what}: in the jail", jailed))
    print(
        f"{what + ': added p50 / ratio':38} {1000 * (pct(jailed, 50) - pct(floor, 50)):8.3f} ms"
        f"  {pct(jailed, 50) / pct(floor, 50):6.2f}x"
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("the local runtime needs root")
    state = Path(tempfile.mkdtemp(prefix="sandpod-jailbench-", dir="/var/tmp"))
    parent = f"sandpod-bench-{uuid.uuid4().hex[:6]}"
    rt = LocalRuntime(LocalRuntimeConfig(state_dir=state, cgroup_parent=parent))
    sid = "jail-bench"
    try:
        st = await rt.create(InstanceSpec(sandbox_id=sid))
        assert st.jail_file is not None
        jail = Jail.load(st.jail_file, sid)
        bare = Command(argv=("/bin/true",), cwd=str(st.workspace), env=ENV, stdin=False)
        floor, jailed = await alternate(
            lambda: run_spawn(bare),
            lambda: run_spawn(jail.command(("true",), "/workspace", ENV, stdin=False)),
            args.calls,
        )
        report("spawn", floor, jailed)
        jail.close()

        with (
            platform(sandbox="floor") as (url_a, _),
            auth_platform(sandbox=sid, SANDPOD_EXECD_JAIL=str(st.jail_file)) as (url_b, creds),
        ):
            a = await AsyncSandbox.connect("floor", nats_url=url_a)
            b = await AsyncSandbox.connect(sid, nats_url=url_b, nats_creds=creds)
            try:
                floor, jailed = await alternate(
                    lambda: a.exec(["true"]), lambda: b.exec(["true"]), args.calls
                )
            finally:
                await a.close()
                await b.close()
        report("SDK exec", floor, jailed)
    finally:
        await remove_runtime(rt, state)


if __name__ == "__main__":
    asyncio.run(main())
