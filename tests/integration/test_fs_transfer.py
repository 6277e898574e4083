"""Streamed file transfer: large round trips in bounded execd memory, and the upload protocol
(ordering, idempotent re-sends, gaps, verification, abort, idle sweep, bounds)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psutil
import pytest

from conftest import Execd, NatsServer, wait_until
from sandpod import AsyncSandbox
from sandpod_contract.errors import (
    BadRequest,
    Busy,
    FsAlreadyExists,
    FsIsADirectory,
    FsUploadNotFound,
)
from sandpod_contract.messages.fs import (
    FsEntry,
    FsUpload,
    FsUploadRef,
    FsUploadStatus,
    FsWriteChunk,
    FsWriteCommit,
    FsWriteOpen,
)

MiB = 1024 * 1024


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _temp_files(host: Path) -> list[str]:
    return [p.name for p in host.iterdir() if p.name.startswith(".sandpod-")]


@pytest.fixture
def where(state_dir: Path) -> tuple[str, Path]:
    """A fresh directory of the shared sandbox: (sandbox path, host path)."""
    name = f"fst-{uuid.uuid4().hex[:10]}"
    host = state_dir / "workspaces" / "shared" / name
    host.mkdir(parents=True)
    return f"/workspace/{name}", host


async def test_large_round_trip_matches_and_execd_memory_stays_small(
    nats: NatsServer, start_execd: Callable[..., Execd], state_dir: Path
) -> None:
    """1 GiB written then read back through the SDK keeps its SHA-256 while execd's peak RSS
    grows by far less than the file (chunks are streamed, never held whole)."""
    execd = start_execd()
    sid = execd.ids[0]
    size = 1024 * MiB
    block = hashlib.sha256(b"seed").digest() * (MiB // 32)  # 1 MiB, deterministic
    sent = hashlib.sha256()

    async def source() -> AsyncIterator[bytes]:
        for i in range(size // MiB):
            piece = i.to_bytes(8, "big") + block[8:]
            sent.update(piece)
            yield piece

    proc = psutil.Process(execd.proc.pid)
    rss_before = proc.memory_info().rss
    async with await AsyncSandbox.connect(sid, nats_url=nats.url) as sbx:
        info = await sbx.fs.write("big.bin", source())
        assert info.size == size
        got = hashlib.sha256()
        async with sbx.fs.read_stream("big.bin") as reader:
            async for chunk in reader:
                got.update(chunk)
    assert got.hexdigest() == sent.hexdigest()
    on_disk = state_dir / "workspaces" / sid / "big.bin"
    assert on_disk.stat().st_size == size
    growth = _vm_kib(execd.proc.pid, "VmHWM") * 1024 - rss_before
    assert growth < 48 * MiB, f"execd peak RSS grew by {growth / MiB:.1f} MiB"
    on_disk.unlink()


async def _open(sbx: AsyncSandbox, path: str, **kw: object) -> str:
    up = await sbx.channel.call("fs", "write_open", FsWriteOpen(path=path, **kw), FsUpload, 5)  # type: ignore[arg-type]
    return up.upload_id


async def _chunk(sbx: AsyncSandbox, upload_id: str, offset: int, data: bytes) -> int:
    req = FsWriteChunk(upload_id=upload_id, offset=offset, data=data)
    return (await sbx.channel.call("fs", "write_chunk", req, FsUploadStatus, 10)).received


async def test_chunks_reorder_resend_and_gaps(sbx: AsyncSandbox, where: tuple[str, Path]) -> None:
    """A chunk that overtakes its predecessor waits for it; a re-sent chunk is skipped; an
    overlapping one adds only its new tail; a gap that never fills is refused."""
    d, host = where
    up = await _open(sbx, f"{d}/f.txt")
    ahead = asyncio.create_task(_chunk(sbx, up, 5, b"world"))
    await asyncio.sleep(0)  # the task publishes its request...
    await sbx.bus.flush()  # ...and the server has it before the next one
    assert await _chunk(sbx, up, 0, b"hello") == 5  # applied while "world" waited for it
    assert await ahead == 10
    assert await _chunk(sbx, up, 0, b"hello") == 10  # a re-send changes nothing
    assert await _chunk(sbx, up, 8, b"ld!!") == 12  # overlap: only "!!" is new
    with pytest.raises(BadRequest) as caught:
        await _chunk(sbx, up, 100, b"gap")
    assert caught.value.details["received"] == 12
    entry = await sbx.channel.call(
        "fs",
        "write_commit",
        FsWriteCommit(upload_id=up, size=12, sha256=hashlib.sha256(b"helloworld!!").hexdigest()),
        FsEntry,
        5,
    )
    assert entry.size == 12 and (host / "f.txt").read_bytes() == b"helloworld!!"
    assert _temp_files(host) == []
    with pytest.raises(FsUploadNotFound):
        await _chunk(sbx, up, 12, b"late")


async def test_a_mismatched_commit_or_an_abort_leaves_the_target_untouched(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """A wrong size or SHA-256 at commit aborts the upload; abort removes the temporary file and
    is idempotent; a failing writer context aborts instead of committing."""
    d, host = where
    (host / "keep.txt").write_text("original")
    for size, sha in ((999, None), (None, "0" * 64)):
        up = await _open(sbx, f"{d}/keep.txt")
        await _chunk(sbx, up, 0, b"replacement")
        assert len(_temp_files(host)) == 1
        req = FsWriteCommit(upload_id=up, size=size, sha256=sha)
        with pytest.raises(BadRequest):
            await sbx.channel.call("fs", "write_commit", req, FsEntry, 5)
        assert (host / "keep.txt").read_text() == "original" and _temp_files(host) == []
    up = await _open(sbx, f"{d}/keep.txt")
    await _chunk(sbx, up, 0, b"x" * 10)
    status = await sbx.channel.call(
        "fs", "write_abort", FsUploadRef(upload_id=up), FsUploadStatus, 5
    )
    assert status.received == 10 and _temp_files(host) == []
    await sbx.channel.call("fs", "write_abort", FsUploadRef(upload_id=up), FsUploadStatus, 5)

    async def fail_midway() -> None:
        async with sbx.fs.open_writer(f"{d}/keep.txt", chunk_size=4) as w:
            await w.write(b"partial content")
            raise RuntimeError("caller failed")

    with pytest.raises(RuntimeError):
        await fail_midway()
    assert (host / "keep.txt").read_text() == "original" and _temp_files(host) == []


async def test_idle_uploads_are_swept_and_open_uploads_are_bounded(
    nats: NatsServer, start_execd: Callable[..., Execd], state_dir: Path
) -> None:
    """An upload idle past the idle timeout is aborted (temp file removed), shutdown aborts open
    uploads, and the 65th open upload is refused with busy."""
    execd = start_execd(SANDPOD_EXECD_ABANDON_AFTER="0.5")
    sid = execd.ids[0]
    host = state_dir / "workspaces" / sid
    async with await AsyncSandbox.connect(sid, nats_url=nats.url) as sbx:
        up = await _open(sbx, "idle.bin")
        await _chunk(sbx, up, 0, b"abc")
        assert len(_temp_files(host)) == 1
        await asyncio.to_thread(wait_until, lambda: not _temp_files(host), 10, "the idle sweep")
        with pytest.raises(FsUploadNotFound):
            await _chunk(sbx, up, 3, b"d")
        up = await _open(sbx, "open-at-shutdown.bin")
        await _chunk(sbx, up, 0, b"abc")
    assert len(_temp_files(host)) == 1
    assert execd.stop() == 0
    assert _temp_files(host) == []  # shutdown aborts open uploads
    execd = start_execd()
    sid = execd.ids[0]
    async with await AsyncSandbox.connect(sid, nats_url=nats.url) as sbx:
        ids = [await _open(sbx, f"u{i}") for i in range(64)]
        with pytest.raises(Busy):
            await _open(sbx, "one-too-many")
        for up in ids:
            await sbx.channel.call(
                "fs", "write_abort", FsUploadRef(upload_id=up), FsUploadStatus, 5
            )
        await sbx.fs.write("after.txt", b"x" * (600 * 1024))  # an upload fits again
    assert _temp_files(state_dir / "workspaces" / sid) == []


async def test_open_checks_the_target_before_any_data_is_sent(
    sbx: AsyncSandbox, where: tuple[str, Path]
) -> None:
    """write_open fails at once for an existing path with exclusive, or a directory target."""
    d, host = where
    (host / "exists").write_text("")
    with pytest.raises(FsAlreadyExists):
        await _open(sbx, f"{d}/exists", exclusive=True)
    with pytest.raises(FsIsADirectory):
        await _open(sbx, d)
    assert _temp_files(host) == []
