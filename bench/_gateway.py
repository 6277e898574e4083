"""Start a gateway process on a throwaway platform and mint an API key for it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from _platform import free_port


@contextlib.contextmanager
def gateway(nats_url: str, **extra: str) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """Yield (base URL, API key of tenant "default", the gateway process); ``extra``: more
    environment (settings) for the gateway."""
    port = free_port()
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": nats_url,
        "SANDPOD_GATEWAY_PORT": str(port),
        "SANDPOD_LOG_LEVEL": "warning",
        "SANDPOD_GATEWAY_RATE": "1000000",
        "SANDPOD_GATEWAY_BURST": "1000000",
        **extra,
    }
    proc = subprocess.Popen([sys.executable, "-m", "sandpod_gateway"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 20
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > end or proc.poll() is not None:
                raise SystemExit("gateway did not start")
            time.sleep(0.05)
        key = subprocess.run(
            [sys.executable, "-m", "sandpod_gateway", "keys", "create", "--tenant", "default"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        yield url, key, proc
    finally:
        proc.terminate()
        proc.wait(15)
