"""Runtime egress policy updates: from ``sbx.network.update(...)`` to the runtime having applied
it (the reply waits for ``status.network`` to show the new generation).

The path: the set_network request writes ``spec.network``, the reconciler's watch queues the
sandbox, a pass calls the driver's ``apply_network`` and records ``status.network``, which the
waiting request sees through its own watch. The floor, measured in the same run, is one
control-plane round trip that reads the policy (``sbx.network.get()``: NATS + a store read).
Target (issue 15): effective within 1 s; the ratio to the floor says how much the watch path adds.

    sudo .venv/bin/python bench/network_update.py [--runtime local|process] [--updates 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from _platform import lifecycle, pct, summary
from sandpod import AsyncSandbox

SMOKE_ARGS = ["--updates", "3", "--runtime", "process"]
POLICIES = (
    {"mode": "allowlist", "allow": ["pypi.example.org:443", "10.20.0.0/16"]},
    {"mode": "public", "allow": [], "deny": ["*.bad.example"]},
    {"mode": "deny-all", "allow": [], "deny": []},
)


async def measure(url: str, count: int) -> tuple[list[float], list[float]]:
    """(floor samples, update samples) on one fresh sandbox."""
    async with await AsyncSandbox.create(nats_url=url) as sbx:
        floor, updates = [], []
        for _ in range(count + 5):
            t0 = time.perf_counter()
            await sbx.network.get()
            floor.append(time.perf_counter() - t0)
        for i in range(count):
            policy = POLICIES[i % len(POLICIES)]
            t0 = time.perf_counter()
            view = await sbx.network.update(**policy)  # type: ignore[arg-type]
            took = time.perf_counter() - t0
            if not view.applied:
                raise SystemExit(f"update {i} not applied within the wait: {view}")
            updates.append(took)
        await sbx.kill()
    return floor, updates


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        async with lifecycle(Path(tmp), args.runtime) as url:
            floor, updates = await measure(url, args.updates)
    print(f"runtime: {args.runtime}")
    print(summary("floor: read the policy (control-plane round trip)", floor[5:]))
    print(summary("update -> applied by the runtime", updates))
    p50, p99 = pct(updates, 50), pct(updates, 99)
    print(
        f"  -> p50 {p50 / pct(floor[5:], 50):.2f}x the floor; target applied within 1 s: "
        f"{'OK' if p99 <= 1.0 else 'ABOVE'} (p99 {p99 * 1000:.1f} ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--runtime",
        choices=["local", "process"],
        default="local" if os.geteuid() == 0 else "process",
    )
    parser.add_argument("--updates", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
