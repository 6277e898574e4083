"""Gateway: files streamed both ways (Range, hashes, bounded memory) and the metadata ops."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from gateway_harness import (  # noqa: F401
    Gateway,
    GatewayProcess,
    gateway,
    gateway_procs,
    mint_key,
    start_gateway,
)

from conftest import Execd

__all__: list[str] = []


def _dir() -> str:
    return f"/workspace/gw-{uuid.uuid4().hex[:8]}"


async def test_upload_download_roundtrip_and_range(gateway: Gateway, shared_execd: Execd) -> None:
    """PUT writes the raw body; GET returns it; Range gives 206 with Content-Range."""
    key = await mint_key(gateway, "default")
    data = os.urandom(3 * 1024 * 1024 + 17)  # several NATS messages
    path = f"{_dir()}/blob.bin"
    async with gateway.client(key) as c:
        r = await c.put("/v1/sandboxes/shared/files/content", params={"path": path}, content=data)
        assert r.status_code == 201, r.text
        assert r.json()["size"] == len(data)
        r = await c.get("/v1/sandboxes/shared/files/content", params={"path": path})
        assert r.status_code == 200 and r.content == data
        assert r.headers["accept-ranges"] == "bytes"
        r = await c.get(
            "/v1/sandboxes/shared/files/content",
            params={"path": path},
            headers={"range": "bytes=1048570-2097160"},
        )
        assert r.status_code == 206 and r.content == data[1048570:2097161]
        assert r.headers["content-range"] == f"bytes 1048570-2097160/{len(data)}"
        r = await c.get(
            "/v1/sandboxes/shared/files/content",
            params={"path": path},
            headers={"range": "bytes=-10"},
        )
        assert r.content == data[-10:]
        r = await c.get(
            "/v1/sandboxes/shared/files/content",
            params={"path": path},
            headers={"range": f"bytes={len(data)}-"},
        )
        assert r.status_code == 416


async def test_upload_hash_mismatch_leaves_file_untouched(
    gateway: Gateway, shared_execd: Execd
) -> None:
    """An X-Content-SHA256 that does not match the body is refused and nothing is written."""
    key = await mint_key(gateway, "default")
    path = f"{_dir()}/x.txt"
    async with gateway.client(key) as c:
        r = await c.put(
            "/v1/sandboxes/shared/files/content",
            params={"path": path},
            content=b"hello",
            headers={"x-content-sha256": "0" * 64},
        )
        assert r.status_code == 400
        r = await c.get("/v1/sandboxes/shared/files/stat", params={"path": path})
        assert (r.status_code, r.json()["code"]) == (404, "fs.not_found")


async def test_metadata_ops(gateway: Gateway, shared_execd: Execd) -> None:
    """mkdir, list, stat, move, chmod, search and remove map to the fs family."""
    key = await mint_key(gateway, "default")
    d = _dir()
    s = "/v1/sandboxes/shared/files"
    async with gateway.client(key) as c:
        assert (await c.post(f"{s}/mkdir", json={"path": f"{d}/sub"})).status_code == 201
        await c.put(f"{s}/content", params={"path": f"{d}/sub/a.py"}, content=b"x = 'needle'\n")
        listing = (await c.get(s, params={"path": d, "depth": 2})).json()
        assert sorted(e["name"] for e in listing["entries"]) == ["a.py", "sub"]
        r = await c.post(f"{s}/move", json={"src": f"{d}/sub/a.py", "dst": f"{d}/b.py"})
        assert r.json()["path"] == f"{d}/b.py"
        r = await c.post(f"{s}/chmod", json={"path": f"{d}/b.py", "mode": 0o700})
        assert r.json()["permissions"] == "-rwx------"
        hits = (await c.post(f"{s}/search", json={"query": "needle", "path": d})).json()
        assert [m["line"] for m in hits["matches"]] == [1]
        assert (await c.get(f"{s}/stat", params={"path": f"{d}/b.py"})).json()["size"] == 13
        r = await c.delete(s, params={"path": d, "recursive": "true"})
        assert r.json()["existed"] is True
        r = await c.get(f"{s}/stat", params={"path": d})
        assert r.status_code == 404


async def _body(size: int, digest: hashlib._Hash) -> AsyncIterator[bytes]:
    block = os.urandom(1 << 20)
    sent = 0
    while sent < size:
        piece = block[: min(len(block), size - sent)]
        digest.update(piece)
        sent += len(piece)
        yield piece


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.timeout(600)
async def test_large_transfer_streams_with_bounded_memory(
    gateway_procs: Callable[..., GatewayProcess], shared_execd: Execd, start_gateway: object
) -> None:
    """1 GiB up and down through a gateway process: hashes match and its peak RSS stays far
    below the file size (the body is streamed, never held); rates: bench/gateway_transfer.py."""
    gp = gateway_procs()
    size = 1 << 30
    # Keys go in the default bucket that the child process reads.
    from sandpod_bus import Bus, BusSettings
    from sandpod_gateway.keys import KeyStore

    bus = await Bus.connect(BusSettings(url=shared_execd.nats_url))
    try:
        key, _ = await (await KeyStore.open(bus, "sandpod")).create("default")
    finally:
        await bus.drain()
    up = hashlib.sha256()
    path = f"{_dir()}/big.bin"
    async with httpx.AsyncClient(
        base_url=gp.url, timeout=300, headers={"authorization": f"Bearer {key}"}
    ) as c:
        r = await c.put(
            "/v1/sandboxes/shared/files/content", params={"path": path}, content=_body(size, up)
        )
        assert r.status_code == 201, r.text
        down = hashlib.sha256()
        got = 0
        async with c.stream(
            "GET", "/v1/sandboxes/shared/files/content", params={"path": path}
        ) as r:
            async for chunk in r.aiter_bytes():
                down.update(chunk)
                got += len(chunk)
        await c.delete("/v1/sandboxes/shared/files", params={"path": path})
    assert got == size and down.hexdigest() == up.hexdigest()
    peak = _peak_rss_mib(gp.proc.pid)
    assert peak < 160, f"gateway peak RSS {peak:.0f} MiB for a {size >> 20} MiB transfer"


async def test_a_directory_travels_as_a_tar_both_ways(
    gateway: Gateway, shared_execd: Execd
) -> None:
    """GET …/files/archive streams a directory's tar (gzip too); PUT unpacks one into a new
    directory; errors are typed statuses; another tenant's key gets nothing."""
    import io
    import tarfile

    key = await mint_key(gateway, "default")
    src, dst = _dir(), _dir()
    blob = os.urandom(2 * 1024 * 1024 + 3)
    async with gateway.client(key) as c:
        for name, data in (("a/blob", blob), ("b.txt", b"bee")):
            r = await c.put(
                "/v1/sandboxes/shared/files/content", params={"path": f"{src}/{name}"}, content=data
            )
            assert r.status_code == 201, r.text
        r = await c.get("/v1/sandboxes/shared/files/archive", params={"path": src})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/x-tar"
        with tarfile.open(fileobj=io.BytesIO(r.content)) as tf:
            member = tf.extractfile("./a/blob")
            assert member is not None and member.read() == blob
        tar = r.content
        r = await c.get("/v1/sandboxes/shared/files/archive", params={"path": src, "gzip": "true"})
        assert r.status_code == 200 and r.content[:2] == b"\x1f\x8b"
        r = await c.put("/v1/sandboxes/shared/files/archive", params={"path": dst}, content=tar)
        assert r.status_code == 201, r.text
        assert r.json() == {"path": dst, "received": len(tar)}
        r = await c.get("/v1/sandboxes/shared/files/content", params={"path": f"{dst}/a/blob"})
        assert r.content == blob
        r = await c.get("/v1/sandboxes/shared/files/archive", params={"path": f"{src}/nope"})
        assert r.status_code == 404 and r.json()["code"] == "fs.not_found"
        r = await c.put(
            "/v1/sandboxes/shared/files/archive", params={"path": dst}, content=b"not a tar" * 99
        )
        assert r.status_code == 422 and r.json()["code"] == "fs.archive_failed"
    other = await mint_key(gateway, "other")
    async with gateway.client(other) as c:
        r = await c.get("/v1/sandboxes/shared/files/archive", params={"path": src})
        assert r.status_code == 404 and r.json()["code"] == "sandbox.not_found"
