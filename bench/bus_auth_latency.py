"""What the authenticated bus of `sandpod up` costs a warm exec: the same SDK exec round trip on
an anonymous nats-server and on one in operator mode with `sandpod up`'s users (execd with the
``execd`` credential, the SDK with ``client``'s permissions checked by the server on every
message), in interleaved rounds of the same run, so a noisy moment weighs on both alike.

    .venv/bin/python bench/bus_auth_latency.py [--calls 1000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from _platform import auth_platform, pct, platform, summary
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--calls", "20", "--rounds", "1"]


async def samples(sbx: AsyncSandbox, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await sbx.exec(["true"])
        out.append(time.perf_counter() - t0)
    return out


async def ready(url: str, creds: str | None) -> AsyncSandbox:
    end = time.monotonic() + 30
    while True:
        sbx = await AsyncSandbox.connect("bench", nats_url=url, nats_creds=creds)
        try:
            await sbx.ping(timeout=1)
            return sbx
        except Exception:
            await sbx.close()
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.05)


async def main(args: argparse.Namespace) -> None:
    with platform() as (anon_url, _), auth_platform() as (auth_url, creds):
        anon, auth = await ready(anon_url, None), await ready(auth_url, creds)
        print(
            f"warm `exec true` through the SDK, {args.calls} calls each in {args.rounds} "
            "interleaved rounds, 2 cores, nats-server on loopback\n"
        )
        await samples(anon, 50)
        await samples(auth, 50)
        plain: list[float] = []
        authed: list[float] = []
        per_round = max(args.calls // args.rounds, 1)
        for i in range(args.rounds):  # alternate which goes first: no bias to either
            if i % 2:
                authed += await samples(auth, per_round)
            plain += await samples(anon, per_round)
            if not i % 2:
                authed += await samples(auth, per_round)
        print(summary("anonymous NATS (the floor here)", plain))
        print(summary("operator mode, sandpod up's users", authed))
        print(
            f"  -> authenticated/anonymous p50 {pct(authed, 50) / pct(plain, 50):.3f}x, "
            f"p99 {pct(authed, 99) / pct(plain, 99):.3f}x"
        )
        await anon.close()
        await auth.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved measuring rounds")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(parser.parse_args()))
