"""Cold create -> first exec completed, through the lifecycle service (local runtime by default).

The floor, measured in the same run, is starting an execd process until it answers a ping (what a
cold sandbox costs when each gets its own daemon). The local runtime's node execd serves new
sandboxes without a new process, so it should sit well under it. Target (issue): p50 <= 300 ms.

With the local runtime the same run measures both bases: sandboxes of the default template (the
Debian root filesystem of ``sandpod_image.debian``, built into ``~/.cache/sandpod/rootfs`` if
missing, or ``SANDPOD_DEFAULT_ROOTFS``) next to sandboxes of a ``rootfs: /`` template (the host
root, as before the default base existed), alternating so load hits both alike. Target (issue
14): default-base p50 within 1.1x of host-root. Then ``--keep`` sandboxes of the default base
stay up at once and the disk each adds is measured: blocks allocated under its jail directory
(writable layer, workspace, its disk image if quotas are on), never a copy of the base.

    .venv/bin/python bench/sandbox_create.py [--count 20] [--keep 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _platform import lifecycle, pct, summary
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import SandpodError
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--count", "2", "--keep", "2"]


async def _answers(url: str, sandbox: str) -> None:
    while True:
        try:
            async with await AsyncSandbox.connect(sandbox, nats_url=url) as sbx:
                await sbx.ping(timeout=0.5)
                return
        except SandpodError:
            await asyncio.sleep(0.005)


async def floor_samples(url: str, state: str, count: int) -> list[float]:
    samples = []
    for i in range(count):
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": url,
            "SANDPOD_SANDBOX_ID": f"floor-{i}",
            "SANDPOD_STATE_DIR": state,
            "SANDPOD_LOG_LEVEL": "warning",
        }
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_execd"], env=env, stderr=subprocess.DEVNULL
        )
        await _answers(url, f"floor-{i}")
        samples.append(time.perf_counter() - t0)
        proc.terminate()
        proc.wait()
    return samples


async def create_one(url: str, template: str | None) -> float:
    t0 = time.perf_counter()
    sbx = await AsyncSandbox.create(nats_url=url, template=template)
    async with sbx:
        r = await sbx.exec(["true"])
        elapsed = time.perf_counter() - t0
        if r.exit_code != 0:
            raise RuntimeError(f"first exec failed: {r.stderr}")
        await sbx.kill()
    return elapsed


async def create_samples(url: str, count: int, templates: list[str | None]) -> list[list[float]]:
    """``count`` creates per template, interleaved (one of each in turn)."""
    samples: list[list[float]] = [[] for _ in templates]
    for _ in range(count):
        for i, template in enumerate(templates):
            samples[i].append(await create_one(url, template))
    return samples


async def apply_template(url: str, name: str, spec: dict[str, object]) -> str:
    """Apply the template ``name`` with ``spec``; returns its name."""
    obj = {"kind": "SandboxTemplate", "metadata": {"name": name}, "spec": spec}
    async with await AsyncSandbox.connect("x", nats_url=url) as s:
        await api_call(
            s.bus, s.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
        )
    return name


async def host_root_template(url: str) -> str:
    return await apply_template(url, "hostroot", {"rootfs": "/"})


def allocated(path: Path) -> int:
    """Bytes allocated below ``path`` (sparse files count what they hold; mounts not crossed)."""
    if not path.exists():
        return 0
    total = 0
    dev = path.stat().st_dev
    for dirpath, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(dirpath, d)).st_dev == dev]
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


async def disk_per_sandbox(url: str, jails: Path, keep: int, template: str | None = None) -> float:
    """Mean bytes each of ``keep`` live sandboxes of ``template`` (None: the default base) adds
    under the jails directory."""
    before = allocated(jails)
    held = [await AsyncSandbox.create(nats_url=url, template=template) for _ in range(keep)]
    try:
        for sbx in held:
            await sbx.exec(["true"])
        return (allocated(jails) - before) / keep
    finally:
        for sbx in held:
            async with sbx:
                await sbx.kill()


async def main(count: int, runtime: str, keep: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with lifecycle(Path(tmp), runtime) as url:
            floor = await floor_samples(url, tmp, count)
            templates: list[str | None] = [None]
            if runtime == "local":
                templates.append(await host_root_template(url))
            created = await create_samples(url, count, templates)
            disk = None
            if keep and runtime == "local":
                disk = await disk_per_sandbox(url, Path(tmp, "jails"), keep)
    report(count, runtime, floor, created, disk)


def report(
    count: int, runtime: str, floor: list[float], created: list[list[float]], disk: float | None
) -> None:
    print(f"cold create -> first exec, {count} sandboxes one after another ({runtime} runtime)\n")
    print(summary("floor: start execd until it answers", floor))
    default = created[0]
    print(summary("create + first exec (default base)", default))
    ratio = pct(default, 50) / pct(floor, 50)
    verdict = "OK" if pct(default, 50) <= 0.3 else "ABOVE TARGET"
    print(f"  -> p50 {ratio:.2f}x the floor; target p50 <= 300 ms: {verdict}")
    if len(created) > 1:
        host = created[1]
        print(summary("create + first exec (rootfs: /, host)", host))
        ratio = pct(default, 50) / pct(host, 50)
        verdict = "OK" if ratio <= 1.1 else "ABOVE TARGET"
        print(f"  -> default base p50 {ratio:.2f}x the host root's; target <= 1.1x: {verdict}")
    if disk is not None:
        print(f"disk per additional default-base sandbox: {disk / 1e6:.2f} MB allocated")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--runtime", choices=["local", "process"], default="local")
    parser.add_argument("--keep", type=int, default=5, help="live sandboxes for the disk figure")
    args = parser.parse_args()
    asyncio.run(main(args.count, args.runtime, args.keep))
