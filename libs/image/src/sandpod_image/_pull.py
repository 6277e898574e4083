"""One pull into the store: resolve, fetch the config, make each layer present, write the record.

Data flow: ``source.resolve(platform)`` -> the manifest (verified) is kept as a blob -> the
config blob is fetched (verified) and parsed -> every layer, a few at a time, goes through
:func:`ensure_layer` -> the :class:`ImageRecord` is written last, so a reference resolves only
once everything it names is in place.

:func:`ensure_layer` is where concurrent pulls meet: a layer already unpacked costs nothing; else
the layer's lock is taken (a pull that must wait says so), the check is made again (the other
pull may have finished it), the blob is fetched if it is not kept already, and
``layers.unpack_layer`` writes it into a fresh temp directory in a thread. Its diff_id must be
the one the config names (else ``image.digest_mismatch``, and nothing is kept); then ``fs`` and
``layer.json`` are renamed into place together and the layer directory is made read-only.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from sandpod_contract.errors import (
    ImageDigestMismatch,
    ImageError,
    ImageUnsupported,
    SandpodError,
)
from sandpod_image._records import (
    ImageRecord,
    LayerRecord,
    Layout,
    async_lock,
    read_record,
    write_record,
)
from sandpod_image.blobs import BlobWriter
from sandpod_image.layers import UnpackOptions, unpack_layer
from sandpod_image.manifest import Descriptor, Platform, parse_config
from sandpod_image.progress import Phase, PullProgress
from sandpod_image.sources import ImageSource

__all__ = [
    "LAYER_CONCURRENCY",
    "ensure_layer",
    "install",
    "layer_complete",
    "make_writable",
    "remove_tree",
]

LAYER_CONCURRENCY: Final = (
    3  # downloads in flight: enough to hide latency, few enough to not thrash
)
ProgressFn = Callable[[PullProgress], None]


async def install(
    layout: Layout,
    source: ImageSource,
    *,
    key: str,
    platform: Platform,
    options: UnpackOptions,
    progress: ProgressFn | None,
) -> ImageRecord:
    """Pull ``source`` for ``platform`` into the store and record it under ``key``."""
    emit = progress or (lambda _: None)
    emit(PullProgress(key, Phase.RESOLVING))
    res = await source.resolve(platform)
    manifest = res.manifest
    _keep_bytes(layout, res.body, res.digest)
    config_path = layout.blob(manifest.config.digest)
    if not config_path.exists():
        await source.fetch(manifest.config, config_path, tmp_dir=layout.tmp, progress=None)
    config = parse_config(await asyncio.to_thread(config_path.read_bytes))
    if len(config.diff_ids) != len(manifest.layers):
        raise ImageUnsupported(
            f"{source.label}: the config names {len(config.diff_ids)} layers, "
            f"the manifest {len(manifest.layers)}"
        )
    gate = asyncio.Semaphore(LAYER_CONCURRENCY)
    count = len(manifest.layers)

    async def one(i: int, desc: Descriptor, diff_id: str) -> LayerRecord:
        async with gate:
            return await ensure_layer(
                layout, source, desc, diff_id, options=options, emit=emit, where=(key, i, count)
            )

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(one(i, d, diff))
                for i, (d, diff) in enumerate(zip(manifest.layers, config.diff_ids, strict=True))
            ]
    except BaseExceptionGroup as group:
        # The first layer's failure is the pull's: callers catch typed errors, not groups.
        raise _first(group) from None
    layers = [t.result() for t in tasks]
    record = ImageRecord(
        reference=key,
        digest=res.digest,
        config_digest=manifest.config.digest,
        layers=config.diff_ids,
        blobs=(res.digest, manifest.config.digest, *(d.digest for d in manifest.layers)),
        size=sum(layer.bytes for layer in layers),
        platform=str(platform),
        pulled_at=time.time(),
        index_digest=res.index_digest,
        manifest_media_type=manifest.media_type,
    )
    write_record(layout.image(key), record)
    emit(PullProgress(key, Phase.COMPLETE, layers=count, done=record.size))
    return record


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    leaves = list(_leaves(group))
    typed = [e for e in leaves if isinstance(e, SandpodError)]
    return (typed or leaves)[0]


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _keep_bytes(layout: Layout, body: bytes, digest: str) -> None:
    dest = layout.blob(digest)
    if dest.exists():
        return
    with BlobWriter(layout.tmp, digest, len(body)) as out:
        out.write(body)
        out.commit(dest)


def layer_complete(layout: Layout, diff_id: str) -> bool:
    layer = layout.layer(diff_id)
    return (layer / "fs").is_dir() and (layer / "layer.json").is_file()


async def ensure_layer(
    layout: Layout,
    source: ImageSource,
    desc: Descriptor,
    diff_id: str,
    *,
    options: UnpackOptions,
    emit: ProgressFn,
    where: tuple[str, int, int],
) -> LayerRecord:
    """Make the layer ``diff_id`` present (unpacked once, whoever else pulls it)."""
    key, index, count = where

    def say(phase: Phase, done: int = 0) -> None:
        emit(PullProgress(key, phase, desc.digest, index, count, done, desc.size))

    if (record := _layer_record(layout, diff_id)) is not None:
        say(Phase.CACHED, desc.size)
        return record
    async with async_lock(layout.layer_lock(diff_id), contended=lambda: say(Phase.WAITING)):
        if (record := _layer_record(layout, diff_id)) is not None:
            say(Phase.CACHED, desc.size)
            return record
        blob = layout.blob(desc.digest)
        if not blob.exists():
            say(Phase.DOWNLOADING)
            await source.fetch(
                desc, blob, tmp_dir=layout.tmp, progress=lambda n: say(Phase.DOWNLOADING, n)
            )
        say(Phase.UNPACKING, desc.size)
        record = await asyncio.to_thread(_unpack, layout, blob, desc, diff_id, options)
    say(Phase.DONE, desc.size)
    return record


def _layer_record(layout: Layout, diff_id: str) -> LayerRecord | None:
    if not layer_complete(layout, diff_id):
        return None
    return read_record(layout.layer(diff_id) / "layer.json", LayerRecord)


def _unpack(
    layout: Layout, blob: Path, desc: Descriptor, diff_id: str, options: UnpackOptions
) -> LayerRecord:
    layout.layers.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=layout.layers, prefix=".tmp-"))
    try:
        (work / "fs").mkdir()
        with blob.open("rb") as stream:
            report = unpack_layer(stream, work / "fs", media_type=desc.media_type, options=options)
        if report.diff_id != diff_id:
            raise ImageDigestMismatch(
                f"layer {desc.digest} unpacks to {report.diff_id}, not the config's {diff_id}; "
                "nothing was kept",
                expected=diff_id,
                actual=report.diff_id,
            )
        record = LayerRecord(
            diff_id=diff_id,
            blob=desc.digest,
            media_type=desc.media_type,
            bytes=report.bytes,
            entries=report.entries,
            skipped=len(report.skipped),
            xattr_namespace=report.xattr_namespace,
        )
        write_record(work / "layer.json", record)
        # r-x for all is the point: nothing renames or adds anything beside fs and its record
        os.chmod(work, 0o555)  # noqa: S103
        os.replace(work, layout.layer(diff_id))
    except OSError as exc:
        remove_tree(work)
        raise ImageError(f"cannot unpack layer {desc.digest}: {exc.strerror}") from exc
    except BaseException:
        remove_tree(work)
        raise
    return record


def make_writable(path: Path) -> None:
    """Give the owner write access on every directory under ``path`` (so it can be removed)."""
    for dirpath, _dirs, _files in os.walk(path):
        os.chmod(dirpath, os.stat(dirpath).st_mode | 0o700)


def remove_tree(path: Path) -> int:
    """Remove a file or a tree (read-only directories included); returns the bytes freed."""
    freed = 0
    if not os.path.lexists(path):
        return 0
    if path.is_symlink() or not path.is_dir():
        freed = path.lstat().st_size
        path.unlink()
        return freed
    make_writable(path)
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with_path = os.path.join(dirpath, name)
            freed += os.lstat(with_path).st_size
    shutil.rmtree(path)
    return freed
