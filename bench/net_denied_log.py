"""What logging refused connections costs: a refused-connect flood with and without NFLOG.

Needs root. Two installations side by side on this host, each with one ``deny-all`` jail (the
host root as base): one logs refusals to its NFLOG group and runs the lifecycle's reader
(``DenialLog``, publishing into a counter), the other only counts them (``log_denials=False``,
the floor). Each round (in ABBA order: whoever goes first is not favoured) a flood of
``--connections`` non-blocking TCP connects to the fake internet (``tests/fakenet.py``) runs in
each jail's network namespace; printed per setup (median of ``--rounds``): wall time, the
flooder's own CPU (the kernel drops its SYNs in its context), the whole host's busy CPU
(``/proc/stat``, softirqs included), this process's CPU (the reader), and how many log
messages were read (bounded by the per-sandbox ``limit``).

    sudo .venv/bin/python bench/net_denied_log.py [--connections 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from prometheus_client import CollectorRegistry

from fakenet import FakeNet
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.denials import DenialLog
from sandpod_lifecycle.network.egress import Egress, EgressSettings
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.runtime.base import InstanceSpec
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--connections", "200", "--rounds", "1"]

FLOOD = r"""
import os, socket, sys, time
host, n = sys.argv[1], int(sys.argv[2])
t0, c0 = time.perf_counter(), os.times()
for start in range(0, n, 200):
    socks = []
    for i in range(start, min(n, start + 200)):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, 1024 + i % 60000))
        socks.append(s)
    for s in socks:
        s.close()
c1 = os.times()
print(time.perf_counter() - t0, (c1.user - c0.user) + (c1.system - c0.system))
"""


def busy_jiffies() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


@contextlib.asynccontextmanager
async def installation(state: Path, *, log: bool) -> AsyncIterator[tuple[LocalRuntime, Egress]]:
    ident = uuid.uuid4().hex[:10]
    (state / ident).mkdir()  # a missing state dir means a dead installation to the next start
    settings = EgressSettings(registry=state / "net-ranges.json", log_denials=log)
    egress = Egress(settings, ident, state / ident, state / ident / "net")
    config = LocalRuntimeConfig(
        state_dir=state / ident / "jails", cgroup_parent=f"sandpod-bd-{ident}"
    )
    rt = LocalRuntime(config, egress=egress)
    await egress.start()
    try:
        yield rt, egress
    finally:
        for sid in await rt.list():
            await rt.destroy(sid)
        await egress.stop()


async def flood(holder: int, target: str, n: int) -> tuple[float, float, float, float]:
    """(wall s, flooder CPU s, host busy CPU s, this process's CPU s) of one flood."""
    hz = os.sysconf("SC_CLK_TCK")
    busy, mine = busy_jiffies(), time.process_time()
    proc = await asyncio.create_subprocess_exec(
        "nsenter",
        f"--target={holder}",
        "--net",
        "--",
        sys.executable,
        "-c",
        FLOOD,
        target,
        str(n),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    wall, cpu = (float(x) for x in out.split())
    await asyncio.sleep(0.2)  # the reader's share of the last logs (a measurement, not a sync)
    return wall, cpu, (busy_jiffies() - busy) / hz, time.process_time() - mine


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (veth, nftables, jails, netlink)")
    state = Path(tempfile.mkdtemp(prefix="sandpod-bench-nflog-", dir="/var/tmp"))
    read = 0

    async def count(sandbox_id: str, kind: str, dest: str, rule: str, n: int) -> None:
        nonlocal read
        read += 1

    deny = NetworkPolicy.from_dict({"mode": "deny-all"})
    results: dict[str, list[tuple[float, float, float, float]]] = {"logged": [], "counted": []}
    try:
        with FakeNet() as net:
            async with (
                installation(state, log=True) as (rt1, e1),
                installation(state, log=False) as (rt2, e2),
            ):
                assert e1.log is not None and e1.firewall is not None and e2.log is None
                reader = DenialLog(
                    e1.log, e1.firewall.sandbox_of_log, count, NetworkMetrics(CollectorRegistry())
                )
                task = asyncio.create_task(reader.run())
                a = await rt1.create(
                    InstanceSpec(sandbox_id=f"bd-{uuid.uuid4().hex[:8]}", network=deny)
                )
                b = await rt2.create(
                    InstanceSpec(sandbox_id=f"bd-{uuid.uuid4().hex[:8]}", network=deny)
                )
                assert a.holder_pid and b.holder_pid
                setups = [("logged", a.holder_pid), ("counted", b.holder_pid)]
                for round_ in range(args.rounds):
                    for name, holder in setups[:: 1 if round_ % 2 == 0 else -1]:  # ABBA order
                        results[name].append(await flood(holder, net.public, args.connections))
                reader.close()
                await task
                counted = e1.denied_counts()[a.sandbox_id]
    finally:
        shutil.rmtree(state, ignore_errors=True)
    n = args.connections
    print(f"refused-connect flood, {n} SYNs per round, median of {args.rounds} (ABBA):")
    head = ("wall s", "flooder CPU s", "host busy CPU s", "reader CPU s")
    print(f"  {'':28} {head[0]:>8} {head[1]:>14} {head[2]:>16} {head[3]:>13}")
    for name, label in (("counted", "counted only (floor)"), ("logged", "logged + NFLOG reader")):
        cols = [statistics.median(r[i] for r in results[name]) for i in range(4)]
        print(f"  {label:28} {cols[0]:8.3f} {cols[1]:14.3f} {cols[2]:16.3f} {cols[3]:13.3f}")
    floor = statistics.median(r[2] for r in results["counted"])
    logged = statistics.median(r[2] for r in results["logged"])
    print(f"  host CPU ratio: {logged / floor:.2f}x the floor")
    print(f"  log messages read: {read} for {n * args.rounds} refused SYNs (counter: {counted})")
    print(json.dumps({"read": read, "refused": counted}))


if __name__ == "__main__":
    asyncio.run(main())
