"""Template builds: a warm-cache rebuild per step, and a cold ``run`` step vs the same command.

Through a real lifecycle (local runtime, needs root) on a real nats-server, on a base of a few
host programs (the test suite's ``buildbase``, one copy):

- warm: a template of ``--steps`` steps (run, env and workdir) is built once, then re-applied
  as a new generation with the same steps (its idle timeout changes): every step is a cache
  hit. Reported per step, next to the floor measured in the same run -- applying a template
  without a build and reading it back (the API round trips every build pays). Target (issue):
  <= 100 ms per cached step.
- cold: a ``run`` step writing ``--mb`` 1 MiB files (``dd``, no network), a new nonce each round
  so it never hits the cache, vs the floor: the same command exec'd in a sandbox of the base
  (create not counted). The difference is the builder's create, commit and destroy.

    sudo .venv/bin/python bench/template_build.py [--rounds 5 --steps 10 --mb 50]
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

from _platform import NATS_BIN, _wait_port, free_port, pct, summary
from sandpod import AsyncSandbox
from sandpod.errors import SandpodError
from sandpod.templates import AsyncTemplates, Template

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "integration"))
from buildbase import minimal_rootfs

SMOKE_ARGS = ["--rounds", "1", "--steps", "2", "--mb", "1"]


def _warm_template(base: Path, steps: int, idle: int) -> Template:
    t = Template("warm").workdir("/w")
    for i in range(steps - 1):
        if i % 3 == 0:
            t.run(f"echo {i} > /w/f{i}")
        else:
            t.env({f"V{i}": str(i)})
    t.spec_extra = {"rootfs": str(base), "idleTimeoutSeconds": idle}
    return t


async def warm(client: AsyncTemplates, base: Path, steps: int, rounds: int) -> list[float]:
    await client.build(_warm_template(base, steps, 100), timeout=600)
    samples = []
    for r in range(rounds):
        t0 = time.perf_counter()
        await client.build(_warm_template(base, steps, 101 + r), timeout=600)
        samples.append((time.perf_counter() - t0) / steps)
    return samples


async def floor_apply(client: AsyncTemplates, base: Path, rounds: int) -> list[float]:
    samples = []
    for r in range(rounds):
        obj = {
            "kind": "SandboxTemplate",
            "metadata": {"name": "plain"},
            "spec": {"rootfs": str(base), "idleTimeoutSeconds": 200 + r},
        }
        t0 = time.perf_counter()
        await client.apply(obj)
        await client.get("plain")
        samples.append(time.perf_counter() - t0)
    return samples


def _write(mb: int, nonce: str) -> str:
    """``mb`` files of 1 MiB in /data (no network: dd from /dev/zero)."""
    each = "dd if=/dev/zero of=/data/f$i bs=1M count=1 2>/dev/null"
    return f"mkdir -p /data && for i in $(seq {mb}); do {each}; done; echo {nonce}"


async def cold(client: AsyncTemplates, base: Path, mb: int, rounds: int) -> list[float]:
    """Each round a new nonce: the run step misses (its workdir step hits from round 2)."""
    samples = []
    for r in range(rounds):
        t = Template("cold").workdir("/data").run(_write(mb, f"round-{r}-{time.time_ns()}"))
        t.spec_extra = {"rootfs": str(base)}
        t0 = time.perf_counter()
        await client.build(t, timeout=600)
        samples.append(time.perf_counter() - t0)
    return samples


async def floor_exec(url: str, mb: int, rounds: int) -> list[float]:
    samples = []
    sbx = await AsyncSandbox.create(template="plain", nats_url=url, wait=60)
    async with sbx:
        for r in range(rounds):
            t0 = time.perf_counter()
            # /workspace: on the sandbox's disk, as a run step's writable layer is
            command = _write(mb, f"floor-{r}").replace("/data", f"/workspace/d{r}")
            got = await sbx.exec("/workspace", command)
            samples.append(time.perf_counter() - t0)
            if got.exit_code != 0:
                raise SystemExit(f"the floor's command failed: {got.stderr}")
        await sbx.kill()
    return samples


async def main(rounds: int, steps: int, mb: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"nats://127.0.0.1:{port}"
        nats = subprocess.Popen(
            [str(NATS_BIN), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", f"{tmp}/js"],
            stderr=subprocess.DEVNULL,
        )
        _wait_port(port)
        env = {
            **os.environ,
            "SANDPOD_NATS_URL": url,
            "SANDPOD_STATE_DIR": f"{tmp}/state",
            "SANDPOD_LOG_LEVEL": "warning",
            "SANDPOD_RUNTIME": "local",
            "SANDPOD_DESTROY_ON_EXIT": "true",
        }
        lc = subprocess.Popen(
            [sys.executable, "-m", "sandpod_lifecycle"], env=env, stderr=subprocess.DEVNULL
        )
        base = minimal_rootfs(Path(tmp) / "rootfs")
        try:
            while True:
                try:
                    await AsyncSandbox.list(nats_url=url)
                    break
                except SandpodError:
                    await asyncio.sleep(0.05)
            async with await AsyncTemplates.connect(nats_url=url) as client:
                floor = await floor_apply(client, base, rounds)
                per_step = await warm(client, base, steps, rounds)
                built = await cold(client, base, mb, rounds)
            exec_floor = await floor_exec(url, mb, rounds)
        finally:
            lc.terminate()
            lc.wait()
            nats.terminate()
            nats.wait()
    print(f"template builds ({rounds} rounds, local runtime)\n")
    print(summary("floor: apply + get, no build", floor))
    print(summary(f"warm rebuild, per cached step ({steps})", per_step))
    verdict = "OK" if pct(per_step, 50) <= 0.1 else "ABOVE TARGET"
    print(
        f"  -> p50 {pct(per_step, 50) * 1000:.1f} ms per cached step; target <= 100 ms: {verdict}"
    )
    print(summary(f"floor: exec writing {mb} MiB in a sandbox", exec_floor))
    print(summary(f"cold run step writing {mb} MiB", built))
    print(f"  -> p50 {pct(built, 50) / pct(exec_floor, 50):.2f}x the same command in a sandbox")


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("template builds need the local runtime: run as root")
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mb", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.steps, args.mb))
