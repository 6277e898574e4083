"""Pulls into the node's image store from a real registry (Debian's docker-registry on loopback).

Every image is built here (layers made with tarfile) and pushed through ``sandpod_image``'s own
push code; then pulled by tag, by digest and through a multi-platform index, with basic and
bearer auth, from offline sources, concurrently, and garbage-collected.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from oci_images import (
    base_image,
    build_image,
    push_image,
    push_index,
    write_docker_save,
    write_oci_layout,
)
from registry import BearerGate, TestRegistry
from sandpod_contract.errors import (
    ImageAuthFailed,
    ImageDigestMismatch,
    ImageInUse,
    ImageNotFound,
)
from sandpod_image.auth import AuthConfig, load_auth_file
from sandpod_image.manifest import Platform
from sandpod_image.progress import Phase, PullProgress
from sandpod_image.registry import Registry
from sandpod_image.store import ImageStore

USERS = {"alice": "wonderland"}
ALICE = AuthConfig(username="alice", password="wonderland")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("registry"))
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("auth-registry"), users=USERS)
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


@pytest.fixture
async def client(registry: TestRegistry) -> AsyncIterator[Registry]:
    async with Registry(registry.host) as reg:
        yield reg


def repo() -> str:
    return f"t/{uuid.uuid4().hex[:10]}"


async def test_pull_by_tag_gives_layers_bottom_first_and_the_config(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """A tag pull unpacks each layer into its own fs dir, bottom first, and reads the config."""
    name, image = repo(), base_image()
    await push_image(client, name, "v1", image, tmp_path / "push")
    ref = f"{registry.host}/{name}:v1"
    resolved = await store.pull(ref)
    assert resolved.digest == image.digest
    assert [p.parent.name for p in resolved.layers] == [d[7:] for d in image.diff_ids]
    assert (resolved.layers[0] / "etc/os-release").read_bytes() == b"ID=test\n"
    assert (resolved.layers[1] / "app/main.py").read_bytes() == b"v1"
    assert resolved.config.env == (("PATH", "/bin"), ("A", "b=c"))
    assert (resolved.config.workdir, resolved.config.user) == ("/app", "1000:1000")
    assert (resolved.config.entrypoint, resolved.config.cmd) == (("python3",), ("main.py",))
    assert store.resolve(ref) == resolved
    assert store.resolve(f"{registry.host}/{name}:other") is None


async def test_pull_by_digest_pins_the_manifest(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """A digest reference pulls exactly that manifest, even after the tag moved."""
    name, old, new = repo(), base_image("old"), base_image("new")
    await push_image(client, name, "v1", old, tmp_path / "a")
    await push_image(client, name, "v1", new, tmp_path / "b")
    resolved = await store.pull(f"{registry.host}/{name}@{old.digest}")
    assert resolved.digest == old.digest
    assert (resolved.layers[1] / "app/main.py").read_bytes() == b"old"


async def test_a_manifest_list_gives_the_asked_platform(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """An index resolves to the platform asked for (variant included), else names what it has."""
    name = repo()
    amd = build_image([{"arch": b"amd64"}], arch="amd64")
    arm = build_image([{"arch": b"arm64"}], arch="arm64")
    arm7 = build_image([{"arch": b"armv7"}], arch="arm")
    entries = [(amd, "amd64", None), (arm, "arm64", "v8"), (arm7, "arm", "v7")]
    index_digest = await push_index(client, name, "multi", entries, tmp_path / "push")
    ref = f"{registry.host}/{name}:multi"
    got = await store.pull(ref, platform=Platform("linux", "arm64"))
    assert (got.layers[0] / "arch").read_bytes() == b"arm64"
    assert (got.digest, got.index_digest) == (arm.digest, index_digest)
    got = await store.pull(ref, platform=Platform.parse("linux/arm/v7"))
    assert (got.layers[0] / "arch").read_bytes() == b"armv7"
    got = await store.pull(ref, platform=Platform("linux", "amd64"))
    assert (got.layers[0] / "arch").read_bytes() == b"amd64"
    with pytest.raises(ImageNotFound, match="linux/amd64, linux/arm64/v8, linux/arm/v7"):
        await store.pull(ref, platform=Platform("linux", "s390x"))


async def test_a_tampered_blob_is_refused_and_nothing_is_kept(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """A layer blob edited in the registry's storage fails its digest; no file of it stays."""
    name, image = repo(), base_image("tamper")
    await push_image(client, name, "v1", image, tmp_path / "push")
    victim = image.layer_digests[1]
    data = bytearray(registry.blob_file(victim).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same length: only the digest can tell
    registry.blob_file(victim).write_bytes(bytes(data))
    with pytest.raises(ImageDigestMismatch) as info:
        await store.pull(f"{registry.host}/{name}:v1")
    assert info.value.details["expected"] == victim
    assert not (store.layout.blob(victim)).exists()
    assert list(store.layout.tmp.iterdir()) == []
    assert not store.layout.layer(image.diff_ids[1]).exists()
    assert store.resolve(f"{registry.host}/{name}:v1") is None


async def test_a_wrong_diff_id_is_refused(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """A config naming another diff_id than the layer unpacks to: refused, the layer not kept."""
    name, image = repo(), base_image("diff")
    config = json.loads(image.config)
    config["rootfs"]["diff_ids"][0] = "sha256:" + "0" * 64
    forged = build_image([{"x": b"1"}])  # a carrier for the rewritten documents
    forged.config = json.dumps(config).encode()
    forged.blobs = {**image.blobs}
    doc = json.loads(image.manifest)
    from oci_images import sha

    forged.blobs[sha(forged.config)] = forged.config
    doc["config"] = {**doc["config"], "digest": sha(forged.config), "size": len(forged.config)}
    forged.manifest, forged.media_type = json.dumps(doc).encode(), image.media_type
    await push_image(client, name, "v1", forged, tmp_path / "push")
    with pytest.raises(ImageDigestMismatch):
        await store.pull(f"{registry.host}/{name}:v1")
    assert not store.layout.layer(image.diff_ids[0]).exists()


async def test_basic_auth_typed_failures_and_success(
    auth_registry: TestRegistry, store: ImageStore, tmp_path: Path
) -> None:
    """On an htpasswd registry: anonymous and wrong passwords are image.auth_failed; the
    credentials from a config.json file pull."""
    name, image = repo(), base_image()
    async with Registry(auth_registry.host, auth=ALICE) as reg:
        await push_image(reg, name, "v1", image, tmp_path / "push")
    ref = f"{auth_registry.host}/{name}:v1"
    with pytest.raises(ImageAuthFailed, match="needs credentials"):
        await store.pull(ref)
    with pytest.raises(ImageAuthFailed) as info:
        await store.pull(ref, auth=AuthConfig(username="alice", password="nope"))
    assert info.value.details == {"registry": auth_registry.host, "status": 401}
    auth_file = tmp_path / "config.json"
    import base64

    token = base64.b64encode(b"alice:wonderland").decode()
    auth_file.write_text(json.dumps({"auths": {f"http://{auth_registry.host}": {"auth": token}}}))
    authed = ImageStore(tmp_path / "authed", auth_file=load_auth_file(auth_file))
    resolved = await authed.pull(ref)
    assert resolved.digest == image.digest


async def test_bearer_token_auth_through_a_token_endpoint(
    registry: TestRegistry, client: Registry, tmp_path: Path
) -> None:
    """Behind a Bearer challenge: a token is fetched with the credentials (or an identity
    token, OAuth2-style) for the pull scope; wrong ones are image.auth_failed; an
    anonymous-token registry pulls anonymously."""
    name, image = repo(), base_image("bearer")
    await push_image(client, name, "v1", image, tmp_path / "push")
    gate = BearerGate(registry, USERS)
    gate.start()
    try:
        ref = f"{gate.host}/{name}:v1"
        got = await ImageStore(tmp_path / "a").pull(ref, auth=ALICE)
        assert got.digest == image.digest
        assert gate.token_requests[0] == {"service": "gate", "scope": f"repository:{name}:pull"}
        with pytest.raises(ImageAuthFailed, match="token endpoint"):
            await ImageStore(tmp_path / "b").pull(
                ref, auth=AuthConfig(username="alice", password="x")
            )
        with pytest.raises(ImageAuthFailed):
            await ImageStore(tmp_path / "c").pull(ref)
        refresh = AuthConfig(identity_token="refresh-me")
        assert (await ImageStore(tmp_path / "e").pull(ref, auth=refresh)).digest == image.digest
        assert gate.token_requests[-1]["grant_type"] == "refresh_token"
        with pytest.raises(ImageAuthFailed):
            await ImageStore(tmp_path / "f").pull(ref, auth=AuthConfig(identity_token="stale"))
        gate.anonymous = True
        assert (await ImageStore(tmp_path / "d").pull(ref)).digest == image.digest
    finally:
        gate.stop()


async def test_unknown_tag_and_repository_are_not_found(
    registry: TestRegistry, store: ImageStore
) -> None:
    """A missing tag or repository is image.not_found, naming the reference."""
    with pytest.raises(ImageNotFound):
        await store.pull(f"{registry.host}/{repo()}:nope")


async def test_two_images_sharing_a_layer_store_it_once(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """The shared base layer is fetched and unpacked once and is the same directory for both."""
    name = repo()
    one, two = base_image("one"), base_image("two")
    await push_image(client, name, "one", one, tmp_path / "a")
    await push_image(client, name, "two", two, tmp_path / "b")
    events: list[PullProgress] = []
    a = await store.pull(f"{registry.host}/{name}:one")
    b = await store.pull(f"{registry.host}/{name}:two", progress=events.append)
    assert a.layers[0] == b.layers[0] and a.layers[1] != b.layers[1]
    assert len(list(store.layout.layers.iterdir())) == 3
    base = [e.phase for e in events if e.layer == one.layer_digests[0]]
    assert base == [Phase.CACHED]


async def test_gc_keeps_layers_in_use_and_removes_unused(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """remove refuses an image in use; prune deletes only what no reference or holder names."""
    name = repo()
    one, two = base_image("gc1"), base_image("gc2")
    await push_image(client, name, "one", one, tmp_path / "a")
    await push_image(client, name, "two", two, tmp_path / "b")
    ref_one, ref_two = f"{registry.host}/{name}:one", f"{registry.host}/{name}:two"
    a = await store.pull(ref_one)
    await store.pull(ref_two)
    store.use("sbx-1", a)
    with pytest.raises(ImageInUse) as info:
        store.remove(ref_one)
    assert info.value.details["holders"] == ["sbx-1"]
    store.remove(ref_two)
    assert store.prune() > 0
    assert not store.layout.layer(two.diff_ids[1]).exists()
    assert not store.layout.blob(two.layer_digests[1]).exists()
    assert all(p.is_dir() for p in a.layers)
    assert [i.holders for i in store.list()] == [("sbx-1",)]
    store.release("sbx-1")
    store.remove(ref_one)
    store.prune()
    assert list(store.layout.layers.iterdir()) == []
    assert list(store.layout.blobs.iterdir()) == []
    assert [p.name for p in store.layout.locks.iterdir()] == ["gc.lock"]  # no lock file piles up


async def test_a_layer_in_use_survives_removal_of_its_image(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """A holder's use record keeps its layers through prune even after the tag is re-pulled."""
    name, image = repo(), base_image("held")
    await push_image(client, name, "v1", image, tmp_path / "a")
    resolved = await store.pull(f"{registry.host}/{name}:v1")
    store.use("holder", resolved)
    await push_image(client, name, "v1", base_image("moved"), tmp_path / "b")
    await store.pull(f"{registry.host}/{name}:v1")  # the record now names the new image
    store.prune()
    assert all(p.is_dir() for p in resolved.layers)
    store.release("holder")


async def test_concurrent_pulls_unpack_a_layer_once(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """Two pulls of one image at once: both wait on the layer lock, one unpacks, one reuses."""
    name, image = repo(), base_image("race")
    await push_image(client, name, "v1", image, tmp_path / "push")
    ref = f"{registry.host}/{name}:v1"
    events: list[PullProgress] = []
    both_waiting = asyncio.Event()

    def seen(event: PullProgress) -> None:
        events.append(event)
        if sum(e.phase is Phase.WAITING for e in events) == 2:
            both_waiting.set()

    lock = store.layout.layer_lock(image.diff_ids[0])
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # hold the base layer: both pulls must queue on it
    try:
        pulls = [asyncio.create_task(store.pull(ref, progress=seen)) for _ in range(2)]
        await asyncio.wait_for(both_waiting.wait(), 30)
    finally:
        os.close(fd)
    first, second = await asyncio.gather(*pulls)
    assert first == second
    for digest in image.layer_digests:
        phases = [e.phase for e in events if e.layer == digest]
        assert phases.count(Phase.UNPACKING) == 1, phases
        assert phases.count(Phase.DONE) + phases.count(Phase.CACHED) == 2


async def test_offline_oci_layout_and_docker_save_tarballs(
    store: ImageStore, tmp_path: Path
) -> None:
    """oci:/dir:tag and docker-archive:/x.tar (classic and Docker 25 formats) import the same
    image, verified, with its config."""
    image = base_image("offline")
    layout = tmp_path / "layout"
    write_oci_layout(layout, image, "1.0")
    got = await store.pull(f"oci:{layout}:1.0")
    assert got.digest == image.digest
    assert (got.layers[1] / "app/main.py").read_bytes() == b"offline"
    assert store.resolve(f"oci:{layout}:1.0") == got
    with pytest.raises(ImageNotFound, match=r"1\.0"):
        await store.pull(f"oci:{layout}:2.0")
    for new_format in (False, True):
        tarball = tmp_path / f"save-{new_format}.tar"
        write_docker_save(tarball, image, "app:offline", new_format=new_format)
        got = await store.pull(f"docker-archive:{tarball}")
        assert got.diff_ids == tuple(image.diff_ids)
        assert (got.layers[0] / "bin/tool").read_bytes() == b"#!/bin/sh\n"
        assert got.config.cmd == ("main.py",)
        assert (await store.pull(f"docker-archive:{tarball}:app:offline")).digest == got.digest


async def test_a_tampered_oci_layout_blob_is_refused(store: ImageStore, tmp_path: Path) -> None:
    """Offline blobs are verified like downloaded ones."""
    image = base_image("offline-tamper")
    layout = tmp_path / "layout"
    write_oci_layout(layout, image, "1.0")
    blob = layout / "blobs/sha256" / image.layer_digests[0][7:]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(ImageDigestMismatch):
        await store.pull(f"oci:{layout}:1.0")


async def test_push_a_stored_image_to_another_repository(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """store.push sends an imported image's blobs and manifest; it pulls back the same."""
    image = base_image("pushed")
    layout = tmp_path / "layout"
    write_oci_layout(layout, image, "1.0")
    await store.pull(f"oci:{layout}:1.0")
    target = f"{registry.host}/{repo()}:copy"
    digest = await store.push(f"oci:{layout}:1.0", target)
    assert digest == image.digest
    again = await ImageStore(tmp_path / "fresh").pull(target)
    assert again.digest == image.digest


async def test_a_tampered_manifest_is_refused(
    registry: TestRegistry, client: Registry, store: ImageStore, tmp_path: Path
) -> None:
    """A manifest edited in the registry's storage no longer hashes to its digest: refused."""
    name, image = repo(), base_image("manifest-tamper")
    await push_image(client, name, "v1", image, tmp_path / "push")
    stored = registry.blob_file(image.digest)
    stored.write_bytes(stored.read_bytes().replace(b'"schemaVersion": 2', b'"schemaVersion":  2'))
    with pytest.raises(ImageDigestMismatch) as info:
        await store.pull(f"{registry.host}/{name}:v1")
    assert info.value.details["expected"] == image.digest
    with pytest.raises(ImageDigestMismatch):
        await store.pull(f"{registry.host}/{name}@{image.digest}")
    assert store.list() == []


async def test_a_layout_written_by_ocilayout_pulls_pushes_and_pulls_back(
    registry: TestRegistry, store: ImageStore, tmp_path: Path
) -> None:
    """What template builds write (ocilayout, a gzip and a zstd layer) imports into the store
    with its config, pushes to a registry, and pulls back as the same digest."""
    from sandpod_image import ocilayout

    base, top = tmp_path / "base", tmp_path / "top"
    (base / "etc").mkdir(parents=True)
    (base / "etc/hostname").write_text("built\n")
    (top / "srv").mkdir(parents=True)
    (top / "srv/app").write_text("zstd layer\n")
    layout = ocilayout.OciLayout(tmp_path / "layout")
    layout.add_layer(base, created_by="base", mtime=0)
    layout.add_layer(top, created_by="top", compress="zstd", mtime=0)
    config = ocilayout.ImageConfig(env=("A=1",), working_dir="/srv", cmd=("app",))
    desc = layout.write_image(config, ref="built")
    got = await store.pull(f"oci:{tmp_path / 'layout'}:built")
    assert got.digest == desc.digest
    assert (got.layers[1] / "srv/app").read_text() == "zstd layer\n"
    assert (got.config.env, got.config.workdir, got.config.cmd) == ((("A", "1"),), "/srv", ("app",))
    target = f"{registry.host}/{repo()}:built"
    assert await store.push(f"oci:{tmp_path / 'layout'}:built", target) == desc.digest
    again = await ImageStore(tmp_path / "fresh").pull(target)
    assert (again.digest, again.diff_ids) == (got.digest, got.diff_ids)
