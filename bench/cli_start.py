"""How long the ``sandpod`` command takes to start, next to Python's own start in the same run.

Floor = ``python -c pass`` (the interpreter and ``site``, nothing of ours). Measured, each as a
fresh process: ``python -c 'import sandpod'``, ``sandpod --help`` and ``sandpod exec default --
true`` end to end (find the client credential in ``$SANDPOD_STATE_DIR/nats-auth``, connect with
it, run ``true`` in the sandbox, exit) against a throwaway platform on free ports (nats-server in
operator mode, as ``sandpod up`` runs it, and one execd). Targets: ``--help`` <= 8x the floor,
``exec`` <= 20x. For reference, what no Sandpod code can go below: a bare nats-py program that
connects with the same credential, sends one request to the sandbox's execd and closes (aiohttp
skipped as the bus skips it).

The samples are taken in interleaved rounds, so a noisy moment on a shared machine weighs on the
floor and the commands alike. Then the largest cumulative entries of ``python -X importtime`` for
each command, and whether aiohttp was imported (it must not be: nats-py needs it for ``ws://``).

    .venv/bin/python bench/cli_start.py [--rounds 15] [--top 12] [--base OTHER/.venv]

``--base`` also times another installation's ``import sandpod``, ``--help`` and ``exec`` (e.g.
a checkout of main) in the same interleaved rounds: before and after side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from _platform import auth_platform

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--rounds", "2", "--top", "3"]

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
PY = sys.executable
TARGETS = {"sandpod --help": 8.0, "sandpod exec default -- true": 20.0}

# One request/reply over nats-py alone: connect (nkeys signing the nonce), request, close.
BARE_NATS = """
import asyncio, os, sys
sys.modules["aiohttp"] = None  # as sandpod_bus._natspy: the WebSocket transport stays out
import nats
async def main():
    creds = os.path.join(os.environ["SANDPOD_STATE_DIR"], "nats-auth", "client.creds")
    nc = await nats.connect(os.environ["SANDPOD_NATS_URL"], user_credentials=creds)
    await nc.request("sandpod.sbx.default.sys.ping", b"", timeout=5)
    await nc.close()
asyncio.run(main())
"""


def once(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    run = subprocess.run(
        argv, check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    took = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"{argv} exited {run.returncode}: {run.stderr.decode()}")
    return took


def importtime(argv: list[str], env: dict[str, str], top: int) -> list[str]:
    """The ``top`` largest cumulative import times of ``python -X importtime argv``."""
    run = subprocess.run(
        [PY, "-X", "importtime", *argv], env=env, capture_output=True, text=True, check=True
    )
    rows = []
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = (part.strip() for part in line[12:].split("|"))
            rows.append((int(cumulative), name))
    rows.sort(reverse=True)
    return [f"{us / 1000:8.1f} ms  {name}" for us, name in rows[:top]]


def imports_aiohttp(argv: list[str], env: dict[str, str]) -> bool:
    run = subprocess.run(
        [PY, "-X", "importtime", *argv], env=env, capture_output=True, text=True, check=True
    )
    return any(line.rstrip().endswith("| aiohttp") for line in run.stderr.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--base", type=Path, help="another virtualenv to time alongside")
    opts = parser.parse_args()

    with auth_platform("default") as (url, creds):
        # As after `sandpod up`: the CLI finds <state dir>/nats-auth/client.creds by itself.
        env = {k: v for k, v in os.environ.items() if k != "SANDPOD_NATS_CREDS"}
        env.update(SANDPOD_NATS_URL=url, SANDPOD_STATE_DIR=str(Path(creds).parent.parent))
        cases = {
            "python -c pass": [PY, "-c", "pass"],
            "import sandpod": [PY, "-c", "import sandpod"],
            "sandpod --help": [SANDPOD, "--help"],
            "sandpod exec default -- true": [SANDPOD, "exec", "default", "--", "true"],
            "bare nats-py request (ref.)": [PY, "-c", BARE_NATS],
        }
        if opts.base is not None:
            base_py, base_cli = (
                str(opts.base / "bin" / "python"),
                str(opts.base / "bin" / "sandpod"),
            )
            cases["base: import sandpod"] = [base_py, "-c", "import sandpod"]
            cases["base: sandpod --help"] = [base_cli, "--help"]
            cases["base: sandpod exec default -- true"] = [
                base_cli,
                "exec",
                "default",
                "--",
                "true",
            ]
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for argv in cases.values():  # warm: bytecode caches written, files in the page cache
            once(argv, env)
        for _ in range(opts.rounds):
            for name, argv in cases.items():
                samples[name].append(once(argv, env))

        floor = statistics.median(samples["python -c pass"])
        print(f"median of {opts.rounds} interleaved rounds, each a fresh process")
        for name, values in samples.items():
            median = statistics.median(values)
            line = f"{name:36} {median * 1000:8.1f} ms  {median / floor:6.1f}x floor"
            if name in TARGETS:
                verdict = "ok" if median / floor <= TARGETS[name] else "OVER"
                line += f"  (target <= {TARGETS[name]:g}x: {verdict})"
            print(line)

        for name, argv in [
            ("import sandpod", ["-c", "import sandpod"]),
            ("sandpod --help", ["-m", "sandpod", "--help"]),
            ("sandpod exec default -- true", ["-m", "sandpod", "exec", "default", "--", "true"]),
        ]:
            aiohttp = "imports aiohttp" if imports_aiohttp(argv, env) else "no aiohttp"
            print(f"\n-X importtime, {name} (largest cumulative; {aiohttp}):")
            print("\n".join(importtime(argv, env, opts.top)))


if __name__ == "__main__":
    main()
