"""Snapshot blobs through each BlobStore: put and get MB/s and the peak RSS while doing it.

The floor is copying the same file in this process (1 MiB reads and writes, no store), measured
in the same run. Stores: the JetStream object store (a nats-server of its own) and S3 (a
versitygw of its own, built by `make s3test`). Peak RSS is the process's high-water mark, reset
before each operation (/proc/self/clear_refs): it shows memory stays bounded however big the blob.

    .venv/bin/python bench/blob_store.py [--mib 512]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from sandpod_blobs import BlobStore, JetStreamBlobStore, S3BlobStore, S3Settings
from sandpod_bus import Bus, BusSettings

SMOKE_ARGS = ["--mib", "8"]

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parent.parent
NATS_BIN = Path(sysconfig.get_path("scripts")) / "nats-server"


def versitygw() -> Path:
    if explicit := os.environ.get("SANDPOD_VERSITYGW_BIN"):
        return Path(explicit)
    version = (REPO / "deploy/s3test/versitygw-version").read_text().strip()
    root = Path(os.environ.get("SANDPOD_S3TEST_DIR") or Path.home() / ".cache/sandpod/s3test")
    return root / f"versitygw-{version}" / "bin" / "versitygw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.02)
    raise SystemExit(f"nothing listens on port {port} after 20 s")


@contextlib.contextmanager
def server(argv: list[str], port: int) -> Iterator[None]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_blob(path: Path, mib: int) -> None:
    with path.open("wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MiB))


def floor_mb_s(src: Path, mib: int) -> float:
    dest = src.with_suffix(".copy")
    t0 = time.perf_counter()
    with src.open("rb") as i, dest.open("wb") as o:
        while block := i.read(MiB):
            o.write(block)
        o.flush()
        os.fsync(o.fileno())
    took = time.perf_counter() - t0
    dest.unlink()
    return mib / took


async def timed(op: Callable[[], Awaitable[object]], mib: int) -> tuple[float, float]:
    peak_rss_reset()
    t0 = time.perf_counter()
    await op()
    return mib / (time.perf_counter() - t0), peak_rss_mib()


async def measure(name: str, store: BlobStore, src: Path, mib: int, floor: float) -> None:
    ref = await store.put_file(src)
    await store.delete(ref.digest)
    put_rate, put_rss = await timed(lambda: store.put_file(src), mib)
    dest = src.with_suffix(".back")
    get_rate, get_rss = await timed(lambda: store.get_file(ref.digest, dest), mib)
    dest.unlink()
    print(
        f"{name:9} put {put_rate:7.1f} MB/s ({put_rate / floor:.2f}x the floor), peak RSS "
        f"{put_rss:5.0f} MiB | get {get_rate:7.1f} MB/s ({get_rate / floor:.2f}x), peak RSS "
        f"{get_rss:5.0f} MiB"
    )


async def main(mib: int) -> None:
    if not os.access(versitygw(), os.X_OK):
        raise SystemExit(f"{versitygw()} missing: build it with `make s3test`")
    with tempfile.TemporaryDirectory(prefix="blob-bench-") as tmp:
        work = Path(tmp)
        src = work / "blob"
        make_blob(src, mib)
        floor = floor_mb_s(src, mib)
        print(f"blob: {mib} MiB; floor (copy the file in-process): {floor:.1f} MB/s")

        nats_port = free_port()
        nats_argv = [str(NATS_BIN), "-a", "127.0.0.1", "-p", str(nats_port), "-js"]
        with server([*nats_argv, "-sd", str(work / "js")], nats_port):
            bus = await Bus.connect(BusSettings(url=f"nats://127.0.0.1:{nats_port}"))
            try:
                js = await JetStreamBlobStore.open(bus, "bench")
                await measure("jetstream", js, src, mib, floor)
            finally:
                await bus.close()

        s3_port, key, secret = free_port(), "bench", secrets.token_hex(16)
        (work / "s3").mkdir()
        s3_argv = [str(versitygw()), "--access", key, "--secret", secret]
        s3_argv += ["--port", f"127.0.0.1:{s3_port}", "posix", str(work / "s3")]
        with server(s3_argv, s3_port):
            settings = S3Settings(
                endpoint=f"http://127.0.0.1:{s3_port}",
                bucket="bench",
                access_key_id=key,
                secret_access_key=secret,
            )
            async with S3BlobStore(settings) as s3:
                await s3.ensure_bucket()
                await measure("s3", s3, src, mib, floor)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="blob size in MiB")
    args = parser.parse_args()
    asyncio.run(main(args.mib))
    sys.exit(0)
