"""What acting as the sandbox's user costs the file API of a jailed sandbox (needs root).

execd reaches a jailed sandbox's files with the sandbox user's filesystem identity
(``sandpod_execd.files.identity``: per-thread setgroups/setfsgid/setfsuid around each operation).
Printed, not asserted:

- the switch itself: one ``acting()`` block (switch in, switch back) on a worker thread;
- SDK round trips on one jail (small write, read, stat, list; a 16 MiB upload and download),
  through this tree's execd and, with ``--before DIR``, through an older execd (``DIR`` holds
  that commit's ``services/execd/src``, e.g. ``git archive c942f96 services/execd/src | tar -x
  -C DIR``), alternating so host noise hits both alike.

    sudo .venv/bin/python bench/fs_identity.py [--calls 200] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from _platform import pct, platform, remove_runtime, summary
from sandpod import AsyncSandbox
from sandpod_execd.files.identity import Identity, acting
from sandpod_lifecycle.runtime.base import InstanceSpec
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed;
# this tree as its own "before", so the comparison path runs
SMOKE_ARGS = ["--calls", "10", "--before", "."]

MiB = 1024 * 1024


def switch_cost(ident: Identity, calls: int) -> list[float]:
    out: list[float] = []

    def work() -> None:
        for _ in range(calls):
            t0 = time.perf_counter()
            with acting(ident):
                pass
            out.append(time.perf_counter() - t0)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out


Op = Callable[[AsyncSandbox], Awaitable[object]]


def ops(big: Path) -> Iterator[tuple[str, Op]]:
    small = os.urandom(4096)
    yield "write 4 KiB", lambda s: s.fs.write("/workspace/small", small)
    yield "read 4 KiB", lambda s: s.fs.read("/workspace/small")
    yield "stat", lambda s: s.fs.stat("/workspace/small")
    yield "list /usr/bin", lambda s: s.fs.list("/usr/bin")
    yield "upload 16 MiB", lambda s: s.fs.upload(big, "/workspace/big")
    yield "download 16 MiB", lambda s: s.fs.download("/workspace/big", big.with_suffix(".out"))


async def compare(name: str, op: Op, a: AsyncSandbox, b: AsyncSandbox | None, calls: int) -> None:
    runs = max(calls // 20, 5) if "MiB" in name or "list" in name else calls
    for _ in range(3):
        await op(a)
        if b is not None:
            await op(b)
    sa: list[float] = []
    sb: list[float] = []
    for i in range(runs):
        pairs = [(a, sa), (b, sb)]
        for sbx, out in pairs if i % 2 == 0 else pairs[::-1]:  # neither always goes first
            if sbx is None:
                continue
            t0 = time.perf_counter()
            await op(sbx)
            out.append(time.perf_counter() - t0)
    print(summary(f"{name}: this tree", sa))
    if b is not None:
        print(summary(f"{name}: before", sb))
        print(f"{name + ': ratio (p50 now / before)':38} {pct(sa, 50) / pct(sb, 50):6.2f}x")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--before", type=Path, help="an older commit's tree (services/execd/src)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("the local runtime needs root")
    state = Path(tempfile.mkdtemp(prefix="sandpod-fsidbench-", dir="/var/tmp"))
    parent = f"sandpod-bench-{uuid.uuid4().hex[:6]}"
    rt = LocalRuntime(LocalRuntimeConfig(state_dir=state, cgroup_parent=parent))
    sid = "fsid-bench"
    big = state / "big.bin"
    big.write_bytes(os.urandom(16 * MiB))
    try:
        st = await rt.create(InstanceSpec(sandbox_id=sid))
        assert st.jail_file is not None and st.uid is not None and st.gid is not None
        cost = switch_cost(Identity(st.uid, st.gid, ()), args.calls * 50)
        print(summary("acting() switch in + back", cost))
        jail_env = {"SANDPOD_EXECD_JAIL": str(st.jail_file)}
        with contextlib.ExitStack() as stack:
            url_a, _ = stack.enter_context(platform(sandbox=sid, **jail_env))
            a = await AsyncSandbox.connect(sid, nats_url=url_a)
            b = None
            if args.before is not None:
                old_env = {**jail_env, "PYTHONPATH": str(args.before / "services/execd/src")}
                url_b, _ = stack.enter_context(platform(sandbox=sid, **old_env))
                b = await AsyncSandbox.connect(sid, nats_url=url_b)
            try:
                for name, op in ops(big):
                    await compare(name, op, a, b, args.calls)
            finally:
                await a.close()
                if b is not None:
                    await b.close()
    finally:
        await remove_runtime(rt, state)


if __name__ == "__main__":
    asyncio.run(main())
