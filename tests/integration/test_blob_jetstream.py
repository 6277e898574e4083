"""The JetStream blob store beyond the shared contract suite: a nats-server killed mid-download,
and objects nats itself considers intact but whose bytes do not match their key."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_blob_contract import blob

from conftest import NatsServer
from sandpod_blobs import BlobRef, JetStreamBlobStore, VerifiedFile
from sandpod_bus import Bus, BusSettings
from sandpod_contract.errors import BlobUnavailable


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own, to kill."""
    server = NatsServer(tmp_path / "js")
    server.start()
    yield server
    server.stop()


async def test_server_killed_mid_download(
    private_nats: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-server dying while a blob streams gives BlobUnavailable (retryable) and leaves no
    file, whole or partial, at the destination."""
    bus = await Bus.connect(BusSettings(url=private_nats.url, max_reconnect_attempts=0))
    try:
        store = await JetStreamBlobStore.open(bus, "killed")
        data = os.urandom(3 * 1024 * 1024)  # 24 chunks: one request each
        src, digest = blob(tmp_path, data)
        await store.put_file(src)
        real_write = VerifiedFile.write

        def write_then_kill(self: VerifiedFile, chunk: bytes) -> None:
            real_write(self, chunk)
            assert private_nats.proc is not None
            private_nats.proc.kill()  # after the first chunk has landed in the temp file
            private_nats.proc.wait(10)

        monkeypatch.setattr(VerifiedFile, "write", write_then_kill)
        dest = tmp_path / "restore" / "layer"
        dest.parent.mkdir()
        with pytest.raises(BlobUnavailable) as err:
            await store.get_file(digest, dest)
        assert err.value.retryable
        assert list(dest.parent.iterdir()) == []
    finally:
        await bus.close()


async def test_list_skips_objects_that_are_not_blobs(nats: NatsServer, tmp_path: Path) -> None:
    """Objects in the bucket under names that are not digests (another writer's) are not
    listed as blobs, and cannot be asked for as one."""
    bus = await Bus.connect(BusSettings(url=nats.url))
    try:
        bucket = await bus.objects(f"mixed-{os.getpid()}-{tmp_path.name[-8:]}")
        await bucket.put_stream("notes.txt", io.BytesIO(b"not a blob"))
        await bucket.put_stream("sha256:XYZ", io.BytesIO(b"nor this"))
        store = JetStreamBlobStore(bucket)
        src, digest = blob(tmp_path, b"a blob")
        await store.put_file(src)
        assert await store.list() == [BlobRef(digest, 6)]
    finally:
        await bus.close()
