"""Pull + unpack of a multi-layer image from a loopback registry, next to a floor measured in the
same run: the same blobs fetched with a plain HTTP client (httpx, no auth, no hashing) and
unpacked with ``tar -xzf``, one after the other.

The image (``--layers`` layers of ``--mb`` MiB uncompressed each, half incompressible 1 MiB files
and half small text files, gzip level 1) is built here and pushed to Debian's ``docker-registry``
started on a free 127.0.0.1 port, in a temp dir. Each round pulls into a fresh store
(``ImageStore.pull``: manifest and config verified, every blob sha256-checked while it streams,
unpacked by ``sandpod_image.layers`` in a thread, three layers in flight) and runs the floor into
a fresh directory, a layer at a time (the target's floor) and three at a time (the same
concurrency as the pull, a stricter floor); the medians are printed with both ratios (target:
at most 1.2x against the first).

    .venv/bin/python bench/image_pull.py [--layers 5] [--mb 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sandpod_image.blobs import digest_bytes
from sandpod_image.registry import Registry
from sandpod_image.store import ImageStore

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--layers", "2", "--mb", "2", "--rounds", "1"]

MiB = 1 << 20
REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"
CONFIG = """\
version: 0.1
log: {{level: error, accesslog: {{disabled: true}}}}
storage: {{filesystem: {{rootdirectory: {data}}}}}
http: {{addr: "127.0.0.1:{port}"}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def layer_blob(index: int, mb: int) -> tuple[bytes, bytes]:
    """(gzip blob, uncompressed tar) of about ``mb`` MiB: big random files and small text ones."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(max(1, mb // 2)):
            data = os.urandom(MiB)
            info = tarfile.TarInfo(f"l{index}/big/{i}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        line = f"layer {index} line of text for a small file, fairly compressible\n".encode()
        for i in range(max(1, mb * 256 // 2)):  # 4 KiB files: half the bytes
            data = line * (4096 // len(line))
            info = tarfile.TarInfo(f"l{index}/small/{i // 100}/{i}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw, compresslevel=1, mtime=0), raw


async def push(host: str, layers: list[tuple[bytes, bytes]], tmp: Path) -> None:
    import json

    blobs = [b for b, _ in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [digest_bytes(raw) for _, raw in layers]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest_bytes(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest_bytes(b),
                    "size": len(b),
                }
                for b in blobs
            ],
        }
    ).encode()
    async with Registry(host) as reg:
        for data in [config, *blobs]:
            path = tmp / "upload"
            path.write_bytes(data)
            await reg.push_blob("bench/big", digest_bytes(data), path)
        await reg.put_manifest(
            "bench/big", "v1", manifest, "application/vnd.oci.image.manifest.v1+json"
        )


async def ours(host: str, root: Path) -> float:
    start = time.perf_counter()
    await ImageStore(root).pull(f"{host}/bench/big:v1")
    return time.perf_counter() - start


def fetch_and_untar(client: httpx.Client, host: str, digest: str, root: Path, i: int) -> None:
    path = root / f"{i}.tgz"
    url = f"http://{host}/v2/bench/big/blobs/{digest}"
    with client.stream("GET", url, follow_redirects=True) as resp, path.open("wb") as f:
        for chunk in resp.iter_raw(MiB):
            f.write(chunk)
    out = root / f"l{i}"
    out.mkdir()
    subprocess.run(["tar", "-xzf", str(path), "-C", str(out)], check=True)


def floor(host: str, digests: list[str], root: Path, *, parallel: int = 1) -> float:
    """The floor: each blob fetched then untarred; ``parallel`` layers at a time."""
    root.mkdir()
    start = time.perf_counter()
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(parallel) as pool:
        jobs = [
            pool.submit(fetch_and_untar, client, host, d, root, i) for i, d in enumerate(digests)
        ]
        for job in jobs:
            job.result()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--mb", type=int, default=48, help="MiB per layer, uncompressed")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not Path(REGISTRY_BIN).exists():
        sys.exit("docker-registry missing: apt-get install docker-registry (Debian)")
    with tempfile.TemporaryDirectory(prefix="image-pull-bench-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        (tmp / "config.yml").write_text(CONFIG.format(data=tmp / "data", port=port))
        proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(tmp / "config.yml")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            run(f"127.0.0.1:{port}", args, tmp)
        finally:
            proc.terminate()
            proc.wait(10)


def wait_for(host: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://{host}/v2/", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    sys.exit(f"docker-registry did not answer on {host}")


def run(host: str, args: argparse.Namespace, tmp: Path) -> None:
    wait_for(host)
    layers = [layer_blob(i, args.mb) for i in range(args.layers)]
    total_raw = sum(len(raw) for _, raw in layers)
    total_blob = sum(len(b) for b, _ in layers)
    asyncio.run(push(host, layers, tmp))
    digests = [digest_bytes(b) for b, _ in layers]
    del layers
    print(
        f"image: {args.layers} layers, {total_raw / MiB:.0f} MiB unpacked, "
        f"{total_blob / MiB:.0f} MiB of gzip blobs"
    )
    mine: list[float] = []
    base: list[float] = []
    base3: list[float] = []
    for r in range(args.rounds):
        # Alternate who goes first, and flush dirty pages before each side: no side pays for
        # another's writeback.
        order = ("floor", "floor3", "ours")
        for side in order if r % 2 == 0 else order[::-1]:
            os.sync()
            if side == "floor":
                base.append(floor(host, digests, tmp / f"floor-{r}"))
            elif side == "floor3":
                base3.append(floor(host, digests, tmp / f"floor3-{r}", parallel=3))
            else:
                mine.append(asyncio.run(ours(host, tmp / f"store-{r}")))
        for name in ("floor", "floor3", "store"):
            shutil.rmtree(tmp / f"{name}-{r}")
        print(
            f"round {r + 1}: floor {base[-1]:.2f} s, floor x3 {base3[-1]:.2f} s, "
            f"sandpod {mine[-1]:.2f} s"
        )
    f, f3, m = statistics.median(base), statistics.median(base3), statistics.median(mine)
    mib = total_raw / MiB
    print(f"floor (httpx GET + tar -xzf, a layer at a time): {f:.2f} s ({mib / f:.0f} MiB/s)")
    print(f"floor, 3 layers at a time (as sandpod does):     {f3:.2f} s ({mib / f3:.0f} MiB/s)")
    print(f"sandpod ImageStore.pull (verified, 3 in flight): {m:.2f} s ({mib / m:.0f} MiB/s)")
    print(f"ratio vs 3-at-a-time floor: {m / f3:.2f}x")
    print(f"ratio: {m / f:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
