"""A busy or flaky registry does not fail a pull: retries with backoff, and resumed downloads.

The registry is Debian's docker-registry on loopback behind :class:`FlakyFront`, which answers
503 or breaks a blob download mid-way when a test asks it to. The retry waits go through an
injected ``sleep`` that records them, so no test waits for real backoff.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from oci_images import build_image, push_image
from registry import FlakyFront, TestRegistry
from sandpod_contract.errors import ImageError
from sandpod_image.registry import Registry, RetryPolicy
from sandpod_image.store import ImageStore


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlakyFront]:
    reg = TestRegistry(tmp_path_factory.mktemp("registry"))
    reg.start()
    gate = FlakyFront(reg)
    gate.start()
    yield gate
    gate.stop()
    reg.stop()


class Waits:
    """A ``sleep`` that returns at once and remembers what it was asked to wait."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


async def _pushed(front: FlakyFront, tmp_path: Path, size: int) -> tuple[str, str, bytes]:
    """An image with one layer of ``size`` incompressible bytes, pushed straight to the
    registry (not through the front). Returns (repo, layer digest, layer blob)."""
    repo = f"retry/{uuid.uuid4().hex[:8]}"
    data = (uuid.uuid4().bytes * (size // 16 + 1))[:size]
    image = build_image([{"data.bin": data}], compress=False)
    async with Registry(front.upstream.host) as direct:
        await push_image(direct, repo, "v1", image, tmp_path)
    digest = image.layer_digests[0]
    return repo, digest, image.blobs[digest]


async def test_busy_answers_are_retried_with_backoff(front: FlakyFront, tmp_path: Path) -> None:
    """Three 503s in a row (Retry-After: 0) are waited out; the pull succeeds, verified."""
    repo, digest, blob = await _pushed(front, tmp_path, 4096)
    waits = Waits()
    front.busy = 3
    async with Registry(front.host, sleep=waits) as reg:
        await reg.fetch_blob(repo, digest, tmp_path / "blob", tmp_dir=tmp_path / "tmp")
    assert (tmp_path / "blob").read_bytes() == blob
    assert waits.delays == [0.0, 0.0, 0.0]  # Retry-After honoured, one wait per 503
    assert front.busy == 0


async def test_a_registry_busy_for_longer_than_the_policy_is_a_retryable_error(
    front: FlakyFront, tmp_path: Path
) -> None:
    """When every try is refused the caller gets image.error (retryable), after the policy's
    tries and backoff waits (capped), never a hang."""
    repo, digest, _ = await _pushed(front, tmp_path, 1024)
    waits = Waits()
    front.busy = 10
    policy = RetryPolicy(attempts=3, base_delay=0.5, max_delay=0.75)
    try:
        async with Registry(front.host, sleep=waits, retry=policy) as reg:
            with pytest.raises(ImageError) as err:
                await reg.fetch_blob(repo, digest, tmp_path / "blob", tmp_dir=tmp_path / "tmp")
    finally:
        front.busy = 0
    assert err.value.retryable and "503" in str(err.value)
    assert len(waits.delays) == 2  # 3 tries, 2 waits between them
    assert not (tmp_path / "blob").exists()


async def test_a_broken_download_resumes_from_the_bytes_it_has(
    front: FlakyFront, tmp_path: Path
) -> None:
    """A blob download cut after 1 MiB continues with a Range request from there, and the
    stored blob is still verified whole."""
    size = 3 << 20
    repo, digest, blob = await _pushed(front, tmp_path, size)
    cut = 1 << 20
    front.cut_blob_after = cut
    front.seen.clear()
    async with Registry(front.host, sleep=Waits()) as reg:
        await reg.fetch_blob(
            repo, digest, tmp_path / "blob", tmp_dir=tmp_path / "tmp", size=len(blob)
        )
    assert (tmp_path / "blob").read_bytes() == blob
    ranges = [rng for method, path, rng in front.seen if method == "GET" and digest in path]
    assert ranges[0] == ""
    assert len(ranges) == 2 and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert int(ranges[1].removeprefix("bytes=").rstrip("-")) >= 1  # what arrived before the cut


async def test_a_pull_through_a_flaky_registry_lands_in_the_store(
    front: FlakyFront, tmp_path: Path
) -> None:
    """End to end: the node's store pulls an image while the registry is busy and breaks a
    layer's download; the image is stored and its layer unpacked."""
    repo, _, _ = await _pushed(front, tmp_path, 2 << 20)
    front.busy = 2
    front.cut_blob_after = 4096
    store = ImageStore(tmp_path / "store")
    image = await store.pull(f"{front.host}/{repo}:v1")
    assert image.layers
    assert front.cut_blob_after is None  # the cut happened
