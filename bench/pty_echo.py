"""Keystroke echo round trip through a Sandpod pty next to the floor measured in the same run.

A keystroke is typed into a terminal and timed until its echo reaches a viewer, the way a user's
terminal sees it: a long-poll ``pty.read`` is already parked at execd (as ``sandpod shell``
keeps one), then ``pty.input`` carries the key, the terminal echoes it, and the parked read
returns it. Keys alternate ``a`` and DEL so the line never grows. Two programs: ``cat`` (the
kernel's line discipline echoes) and an interactive ``bash`` (readline echoes).

Floor = a bare NATS request/reply round trip (to a responder in another process, as execd is)
+ the same keystroke echo on a local pty with no NATS at all. Target: p50 <= 1.5x the floor.
Then a flood: a program printing 32 MiB with no viewer attached finishes at the speed of a local
pty read flat out, because execd drains the terminal into the ring whatever the viewers do.

    .venv/bin/python bench/pty_echo.py [--keys 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import subprocess
import time

from _platform import nats_rtt, pct, platform, summary
from sandpod import AsyncSandbox
from sandpod.pty import AsyncPty

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--keys", "10"]

SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
KEYS = ((b"a", b"a"), (b"\x7f", b"\x08"))  # (typed, what its echo contains)
PROGRAMS = {
    "cat": ["cat"],
    "bash": ["bash", "--norc", "--noprofile", "-i"],
}
PACE = 0.002  # seconds between keys, so the next read is parked at execd as in real typing


def local_echo(argv: list[str], keys: int) -> list[float]:
    """Keystroke echo on a local pty: write one key to the master, read until its echo."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=SANDBOX_ENV, start_new_session=True
    )
    os.close(slave)
    try:
        _settle(master)
        samples = []
        for i in range(keys + 50):
            typed, echo = KEYS[i % 2]
            t0 = time.perf_counter()
            os.write(master, typed)
            seen = b""
            while echo not in seen:
                select.select([master], [], [], 5)
                seen += os.read(master, 4096)
            if i >= 50:  # warm-up
                samples.append(time.perf_counter() - t0)
            time.sleep(PACE)
        return samples
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


def _settle(master: int) -> None:
    """Read whatever the program prints at start (a prompt) until it goes quiet."""
    while select.select([master], [], [], 0.3)[0]:
        os.read(master, 65536)


async def sandpod_echo(sbx: AsyncSandbox, argv: list[str], keys: int) -> list[float]:
    async with await sbx.pty.open(argv) as term:
        await _quiet(term)
        samples = []
        parked = asyncio.create_task(term.read(wait=10))
        for i in range(keys + 50):
            typed, echo = KEYS[i % 2]
            await asyncio.sleep(PACE)
            t0 = time.perf_counter()
            writing = asyncio.create_task(term.write(typed))
            seen = b""
            while True:
                seen += (await parked).data
                parked = asyncio.create_task(term.read(wait=10))  # park the next one at once
                if echo in seen:
                    break
            elapsed = time.perf_counter() - t0
            await writing
            if i >= 50:
                samples.append(elapsed)
        parked.cancel()
        await asyncio.gather(parked, return_exceptions=True)
        return samples


async def _quiet(term: AsyncPty) -> None:
    while (await term.read(wait=0.3)).data:
        pass


FLOOD = 32 * 1024 * 1024
FLOOD_CMD = ["sh", "-c", f"head -c {FLOOD} /dev/zero | tr '\\0' x"]


def local_flood() -> float:
    """Seconds for FLOOD_CMD on a local pty whose master is read as fast as possible."""
    master, slave = os.openpty()
    t0 = time.perf_counter()
    proc = subprocess.Popen(FLOOD_CMD, stdin=slave, stdout=slave, stderr=slave, env=SANDBOX_ENV)
    os.close(slave)
    with contextlib.suppress(OSError):  # EIO once the program is gone
        while os.read(master, 1 << 16):
            pass
    proc.wait()
    os.close(master)
    return time.perf_counter() - t0


async def sandpod_flood(sbx: AsyncSandbox) -> float:
    """Seconds for FLOOD_CMD on a Sandpod pty with no viewer at all (execd drains the ring)."""
    t0 = time.perf_counter()
    async with await sbx.pty.open(FLOOD_CMD) as term:
        # polling pty.get is the point: a viewer would be reading, and none may here
        while (await term.info()).running:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        return time.perf_counter() - t0


async def main(args: argparse.Namespace) -> None:
    with platform() as (url, _execd):
        print(f"pty keystroke echo, {args.keys} keys each, 2 cores, nats-server on loopback\n")
        rtt = await nats_rtt(url, args.keys)
        print(summary("floor: bare NATS request/reply", rtt))
        sbx = await AsyncSandbox.connect("bench", nats_url=url)
        for name, argv in PROGRAMS.items():
            local = local_echo(argv, args.keys)
            remote = await sandpod_echo(sbx, argv, args.keys)
            floor50 = pct(rtt, 50) + pct(local, 50)
            floor99 = pct(rtt, 99) + pct(local, 99)
            print(summary(f"floor: local pty echo ({name})", local))
            print(summary(f"sandpod pty echo ({name}, SDK)", remote))
            ratio50, ratio99 = pct(remote, 50) / floor50, pct(remote, 99) / floor99
            verdict = "OK" if ratio50 <= 1.5 else "ABOVE TARGET"
            print(
                f"  -> floor p50 {floor50 * 1000:.3f} ms; sandpod/floor p50 {ratio50:.2f}x "
                f"(target <= 1.5x: {verdict}), p99 {ratio99:.2f}x\n"
            )
        flood_local, flood_remote = local_flood(), await sandpod_flood(sbx)
        mib = FLOOD / 2**20
        print(
            f"{mib:.0f} MiB of output, nobody reading: sandpod pty {flood_remote:.2f} s "
            f"({mib / flood_remote:.0f} MiB/s) vs local pty read flat out {flood_local:.2f} s "
            f"({mib / flood_local:.0f} MiB/s): {flood_remote / flood_local:.2f}x; "
            "the program never waits for viewers"
        )
        await sbx.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1000)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(parser.parse_args()))
