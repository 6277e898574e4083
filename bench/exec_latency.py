"""Warm exec round trip through the SDK next to the floor measured in the same run.

Floor = a bare NATS request/reply round trip (to a responder in another process, as execd is)
+ a bare asyncio subprocess spawn of the same command. Target: SDK exec p50 <= 1.5x the floor.
Floor and Sandpod samples are taken in interleaved rounds, so a noisy moment on a shared machine
weighs on both alike instead of on whichever happened to run then.
Then 64 concurrent callers: exec/s through Sandpod next to spawn-only exec/s.

    .venv/bin/python bench/exec_latency.py [--calls 1000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from _platform import echo_responder, pct, platform, summary
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--calls", "20", "--concurrency", "2", "--rounds", "1"]

# The environment execd gives commands (locale included: `date` reads locale files with it).
SANDBOX_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
}


async def spawn_once(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=SANDBOX_ENV,
        start_new_session=True,
    )
    await proc.communicate()


async def spawn_samples(argv: list[str], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await spawn_once(argv)
        samples.append(time.perf_counter() - t0)
    return samples


async def sdk_samples(sbx: AsyncSandbox, argv: list[str], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        r = await sbx.exec(argv)
        samples.append(time.perf_counter() - t0)
        assert r.exit_code == 0
    return samples


async def concurrent(n_calls: int, concurrency: int, call) -> float:  # type: ignore[no-untyped-def]
    queue = iter(range(n_calls))

    async def worker() -> None:
        for _ in queue:
            await call()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n_calls / (time.perf_counter() - t0)


async def main(args: argparse.Namespace) -> None:
    with platform() as (url, _execd):
        print(
            f"exec latency, {args.calls} warm calls each in {args.rounds} interleaved rounds, "
            "2 cores, nats-server on loopback\n"
        )
        sbx = await AsyncSandbox.connect("bench", nats_url=url)
        programs = (["true"], ["date"])
        rtt: list[float] = []
        spawn: dict[str, list[float]] = {argv[0]: [] for argv in programs}
        sdk: dict[str, list[float]] = {argv[0]: [] for argv in programs}
        per_round = max(args.calls // args.rounds, 1)
        async with echo_responder(url) as echo:
            for argv in programs:  # warm up both paths
                await spawn_samples(argv, 20)
                await sdk_samples(sbx, argv, 50)
            for _ in range(args.rounds):
                rtt += await echo(per_round)
                for argv in programs:
                    spawn[argv[0]] += await spawn_samples(argv, per_round)
                    sdk[argv[0]] += await sdk_samples(sbx, argv, per_round)
        print(summary("floor: bare NATS request/reply", rtt))
        for argv in programs:
            name = argv[0]
            floor50 = pct(rtt, 50) + pct(spawn[name], 50)
            floor99 = pct(rtt, 99) + pct(spawn[name], 99)
            print(summary(f"floor: asyncio spawn of {name!r}", spawn[name]))
            print(summary(f"sandpod exec {name!r} (SDK)", sdk[name]))
            ratio50 = pct(sdk[name], 50) / floor50
            ratio99 = pct(sdk[name], 99) / floor99
            verdict = "OK" if ratio50 <= 1.5 else "ABOVE TARGET"
            print(
                f"  -> floor p50 {floor50 * 1000:.3f} ms; sandpod/floor p50 {ratio50:.2f}x "
                f"(target <= 1.5x: {verdict}), p99 {ratio99:.2f}x\n"
            )
        n = args.concurrency * 30
        spawn_rate = await concurrent(n, args.concurrency, lambda: spawn_once(["true"]))
        sdk_rate = await concurrent(n, args.concurrency, lambda: sbx.exec(["true"]))
        print(
            f"{args.concurrency} concurrent callers, {n} calls of 'true':\n"
            f"  floor: spawn-only        {spawn_rate:8.0f} exec/s\n"
            f"  sandpod exec (SDK)       {sdk_rate:8.0f} exec/s  "
            f"({sdk_rate / spawn_rate:.2f}x of spawn-only)"
        )
        await sbx.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved measuring rounds")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(parser.parse_args()))
