"""The default sandbox root filesystem of ``sandpod up``: given, reused, or built on first run.

Before lifecycle starts (local runtime only), the supervisor asks :func:`ensure` for the base of
every sandbox whose template names no ``rootfs``: the tree given by ``--default-rootfs`` /
``SANDPOD_DEFAULT_ROOTFS`` (checked, never built: CI and tests share one per machine), else the
one in ``<state dir>/rootfs/`` (:mod:`sandpod_image.debian`), built there the first time (about a
minute, its steps relayed as progress lines; stopped meanwhile, mmdebstrap is terminated and
nothing is left) and reused after. Lifecycle gets the path as
``SANDPOD_DEFAULT_ROOTFS``; the banner prints :attr:`Base.summary`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import Callable
from pathlib import Path

from sandpod_image import debian, mmdebstrap

__all__ = ["Base", "BaseUnavailable", "ensure"]

ROOTFS_DIR = "rootfs"


class BaseUnavailable(RuntimeError):
    """The default base can be neither found nor built; the message says what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class Base:
    fs: Path
    summary: str  # one line for the banner


async def ensure(state_dir: Path, given: Path | None, progress: Callable[[str], None]) -> Base:
    """The default base: ``given`` (checked), else ``<state_dir>/rootfs``'s, built if missing.

    Raises:
        BaseUnavailable: ``given`` is not a usable base, or the build failed or cannot run.
    """
    if given is not None:
        try:
            debian.check(given)
        except debian.RootfsInvalid as exc:
            raise BaseUnavailable(f"--default-rootfs / SANDPOD_DEFAULT_ROOTFS: {exc}") from None
        progress(f"default sandbox root filesystem: {given} (given)")
        try:  # one of ours (sandpod_image.debian): its manifest says what it is
            m = debian.Manifest.decode((given.parent / debian.MANIFEST).read_bytes())
        except (OSError, debian.RootfsInvalid):
            return Base(given, f"{given}  (given; templates without rootfs run on it)")
        return Base(given, f"Debian {m.suite}, {m.size_bytes / 1e6:.0f} MB  ({given}, given)")
    cache = state_dir / ROOTFS_DIR
    try:
        found = debian.find(cache)
        if found is None:
            suite = debian.host_suite()
            progress(
                f"building the default sandbox root filesystem (Debian {suite}, first run "
                f"only, about a minute) in {cache}"
            )
            loop = asyncio.get_running_loop()

            def relay(line: str) -> None:  # from the build's thread to the loop's
                loop.call_soon_threadsafe(progress, f"  {line}")

            found = await _build(cache, relay)
    except debian.RootfsError as exc:
        raise BaseUnavailable(
            f"cannot prepare the default sandbox root filesystem: [{exc.code}] {exc.message} "
            "(or give a prepared one with --default-rootfs)"
        ) from None
    m = found.manifest
    how = "built now" if found.built else "reused"
    progress(f"default sandbox root filesystem: {found.fs} ({how})")
    return Base(found.fs, f"Debian {m.suite}, {m.size_bytes / 1e6:.0f} MB  ({found.fs})")


async def _build(cache: Path, relay: Callable[[str], None]) -> debian.Prepared:
    """Build in a thread; cancelled (``sandpod up`` stopped meanwhile), terminate mmdebstrap,
    so the thread ends at once and leaves nothing in the cache."""
    procs: list[subprocess.Popen[str]] = []
    build = asyncio.ensure_future(
        asyncio.to_thread(debian.prepare, cache, progress=relay, started=procs.append)
    )
    try:
        return await asyncio.shield(build)
    except asyncio.CancelledError:
        for proc in procs:
            mmdebstrap.stop(proc)
        await asyncio.gather(build, return_exceptions=True)  # its cleanup, then our cancel
        raise
