"""The default root filesystem: a Debian tree made for sandboxes, never the host's own root.

A sandbox of a template that names no ``rootfs`` and no ``image`` gets this tree as the
read-only lower layer of its overlay root, so nothing of the host is visible inside except what
a template mounts. It is built once per machine (or per state dir) with Debian's ``mmdebstrap``
from the host's own apt sources file (no mirror name is written anywhere here), for the host's
suite, and reused by every sandbox after::

    prepare(cache_dir)                         progress: mmdebstrap's "I:" lines + elapsed time
      ├ <cache_dir>/.lock                      flock: one build at a time, others wait and reuse
      ├ <cache_dir>/.build-<key>-<pid>/fs      mmdebstrap writes here (a crash leaves only this)
      ├ <cache_dir>/.build-<key>-<pid>/manifest.json
      └ rename -> <cache_dir>/<name>-<key>/{fs,manifest.json}    atomic: a tree is whole or absent

``key`` hashes (suite, packages, builder version): changing the package set or how the tree is
made gives a new directory, and the old one stays until removed. :func:`check` is what a
consumer runs before using a tree: the commands the jail's holder needs (``sh``, ``sleep``,
``umount``) and the files it appends the sandbox user to (``/etc/passwd``, ``/etc/group``,
``/etc/hosts``).

The package set (``DEFAULT_PACKAGES``), measured on bookworm (amd64) with documentation, man
pages and translations excluded: 525 MB on disk, 187 packages, a cold build of 60-90 s. What an
agent reaches for first: a shell and the core tools (bash, coreutils, procps, less), python3 with
pip and venv, git, curl with ca-certificates, a C toolchain (gcc, libc6-dev, make: a ``pip
install`` that compiles, a ``make``), Node.js, and the archive tools (xz-utils, unzip). ``npm`` is
left out: it pulls 349 more Debian packages (``node-*``), +166 MB (674 MB, 536 packages with it);
a template that needs it adds it. ``libnftables1`` (~1 MB) is there for the lifecycle image
built on this base: its Pod network guard drives nftables through it. No init (tini): the
jail's holder is its pid 1 already. The variant is ``apt`` (essential packages plus apt): small,
and apt still works in the sandbox.

Inside, the tree is adjusted once at build time (a ``customize`` hook): Python's
``EXTERNALLY-MANAGED`` marker is removed, so ``pip install`` in a sandbox installs (for the
sandbox user: into ``~/.local``, ``HOME`` being ``/workspace``) instead of refusing -- the
sandbox is the isolation pip's marker asks for; apt's lists and caches and the logs of the
build are removed to keep it small. The locale is C.UTF-8 (built into bookworm's libc).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from sandpod_image import mmdebstrap

__all__ = [
    "BUILDER_VERSION",
    "DEFAULT_PACKAGES",
    "MANIFEST",
    "BaseSpec",
    "Manifest",
    "Prepared",
    "RootfsBuildFailed",
    "RootfsError",
    "RootfsInvalid",
    "RootfsUnavailable",
    "check",
    "find",
    "host_sources",
    "host_suite",
    "prepare",
]

# Bumped whenever the way a tree is made changes (flags, hooks): existing caches are rebuilt.
BUILDER_VERSION = 2
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
DEFAULT_PACKAGES = (
    "bash",
    "ca-certificates",
    "coreutils",
    "curl",
    "gcc",
    "git",
    "less",
    "libc6-dev",
    # The lifecycle image's network guard drives nftables through it (ctypes), as the
    # Dockerfile's ``apt-get install libnftables1``; ~1 MB with its libraries.
    "libnftables1",
    "make",
    "mount",  # umount: the holder unmounts the old root from inside (holder.sh)
    "nodejs",
    "procps",
    "python3",
    "python3-pip",
    "python3-venv",
    "unzip",
    "xz-utils",
)
# Never in a sandbox's base: documentation, man pages, translations (about 60 MB).
_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",  # licences stay with the binaries
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
_CUSTOMIZE = (
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED; '
    'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/cache/debconf/*-old '
    '"$1"/var/log/apt/* "$1"/var/log/dpkg.log "$1"/var/log/alternatives.log '
    '"$1"/var/log/bootstrap.log; '
    'mkdir -p "$1"/etc/default && printf "LANG=C.UTF-8\\n" > "$1"/etc/default/locale; '
    # mmdebstrap writes no /etc/hosts (the holder appends the sandbox's hostname to it)
    '[ -e "$1"/etc/hosts ] || printf "127.0.0.1\\tlocalhost\\n::1\\tlocalhost ip6-localhost '
    'ip6-loopback\\n" > "$1"/etc/hosts'
)
# What the jail's holder needs of a base (holder.sh): commands on its PATH, files it appends to.
_HOLDER_TOOLS = ("sh", "sleep", "umount")
_HOLDER_FILES = ("etc/passwd", "etc/group", "etc/hosts")
_TOOL_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))

Progress = Callable[[str], None]


class RootfsError(Exception):
    """Root of the default root filesystem's errors; ``code`` is stable, ``retryable`` says
    whether the same call later may succeed."""

    code: ClassVar[str] = "rootfs"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class RootfsUnavailable(RootfsError):
    """This host cannot build the tree: no ``mmdebstrap``, no apt sources, no suite."""

    code = "rootfs.unavailable"


class RootfsBuildFailed(RootfsError):
    """``mmdebstrap`` failed (network, mirror, disk); nothing was left in the cache."""

    code = "rootfs.build_failed"
    retryable = True


class RootfsInvalid(RootfsError):
    """A directory given as a base lacks what the jail's holder needs."""

    code = "rootfs.invalid"


@dataclasses.dataclass(frozen=True, slots=True)
class BaseSpec:
    """What to build: ``suite`` (None: the host's), ``packages`` on top of the variant."""

    name: str = "debian"
    suite: str | None = None
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    variant: str = "apt"

    def resolved(self) -> BaseSpec:
        return dataclasses.replace(self, suite=self.suite or host_suite())

    def key(self) -> str:
        """16 hex digits of the hash of everything that decides the tree's contents."""
        spec = self.resolved()
        text = json.dumps(
            [spec.suite, spec.variant, sorted(spec.packages), list(_EXCLUDES), BUILDER_VERSION]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """``manifest.json`` next to a built ``fs``: what it is, read by whoever reuses it."""

    version: int = MANIFEST_VERSION
    name: str
    key: str
    suite: str
    variant: str
    packages: tuple[str, ...]
    size_bytes: int
    built_at: float  # seconds since the epoch
    build_seconds: float
    builder_version: int = BUILDER_VERSION

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=2).encode() + b"\n"

    @classmethod
    def decode(cls, raw: bytes) -> Manifest:
        """Raises RootfsInvalid: not a manifest of this version."""
        try:
            data = json.loads(raw)
            if data.get("version") != MANIFEST_VERSION:
                raise RootfsInvalid(f"manifest version {data.get('version')!r} is not ours")
            data["packages"] = tuple(data["packages"])
            return cls(**data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RootfsInvalid(f"unreadable manifest: {exc}") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    """A tree ready to be a lower layer: ``fs`` (its root), its manifest, whether we built it."""

    fs: Path
    manifest: Manifest
    built: bool


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """The host's Debian codename (``bookworm``).

    Raises:
        RootfsUnavailable: the host says no codename (not Debian-like).
    """
    try:
        lines = os_release.read_text().splitlines()
    except OSError as exc:
        raise RootfsUnavailable(f"cannot read {os_release}: {exc}") from exc
    for line in lines:
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME" and value.strip('"'):
            return value.strip('"')
    raise RootfsUnavailable(f"{os_release} names no VERSION_CODENAME: is this host Debian?")


def host_sources(candidates: Sequence[Path] = _SOURCES) -> Path:
    """The host's apt sources file: mmdebstrap reads the mirrors from it.

    Raises:
        RootfsUnavailable: none of the candidates (nor any ``*.sources``) exists.
    """
    found = [p for p in candidates if p.is_file()]
    found += sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    if not found:
        raise RootfsUnavailable(
            "no apt sources file on this host (/etc/apt/sources.list.d/*.sources or "
            "/etc/apt/sources.list): the default root filesystem is built from it"
        )
    return found[0]


def check(fs: Path) -> None:
    """Raise RootfsInvalid unless ``fs`` has what the jail's holder needs."""
    if not fs.is_dir():
        raise RootfsInvalid(f"{fs} is not a directory", path=str(fs))
    missing = [f"/{f}" for f in _HOLDER_FILES if not (fs / f).is_file()]
    for tool in _HOLDER_TOOLS:
        if not any(os.access(fs / d / tool, os.X_OK) for d in _TOOL_DIRS):
            missing.append(tool)
    if missing:
        raise RootfsInvalid(
            f"{fs} cannot be a sandbox's base: it has no {', '.join(missing)}", path=str(fs)
        )


def find(cache_dir: Path, spec: BaseSpec | None = None) -> Prepared | None:
    """The tree of ``spec`` already in ``cache_dir``, or None (never builds)."""
    spec = (spec or BaseSpec()).resolved()
    top = cache_dir / f"{spec.name}-{spec.key()}"
    try:
        manifest = Manifest.decode((top / MANIFEST).read_bytes())
    except (OSError, RootfsInvalid):
        return None
    return Prepared(top / "fs", manifest, built=False)


def prepare(
    cache_dir: Path,
    spec: BaseSpec | None = None,
    *,
    progress: Progress | None = None,
    sources: Path | None = None,
    started: mmdebstrap.Started | None = None,
) -> Prepared:
    """The tree of ``spec`` in ``cache_dir``: reused if there, else built (about a minute).

    Args:
        cache_dir: made (0755) if missing; one subdirectory per built tree.
        spec: what to build (default: ``BaseSpec()``, the host's suite).
        progress: called with one line per build step (mmdebstrap's, with elapsed time).
        sources: the apt sources file (default: the host's, :func:`host_sources`).
        started: called with the mmdebstrap process once it runs (terminating it makes
            this raise RootfsBuildFailed, nothing left in the cache).

    Raises:
        RootfsUnavailable: no mmdebstrap, apt sources or suite on this host.
        RootfsBuildFailed: the build failed (its output's tail in the message).
    """
    spec = (spec or BaseSpec()).resolved()
    say = progress or (lambda _line: None)
    found = find(cache_dir, spec)
    if found is not None:
        return found
    cache_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build of ours: wait, then reuse its tree
        found = find(cache_dir, spec)
        if found is not None:
            return found
        _remove_stale(cache_dir)
        return _build(cache_dir, spec, sources or host_sources(), say, started)


def _remove_stale(cache_dir: Path) -> None:
    """Builds that crashed left ``.build-*`` directories; under the lock none is running."""
    for stale in cache_dir.glob(".build-*"):
        _discard(stale)


def _discard(work: Path) -> None:
    """Raises RootfsBuildFailed: mounts are left below ``work`` (then it is kept)."""
    left = mmdebstrap.discard(work)
    if left:
        raise RootfsBuildFailed(
            f"a killed build left mounts below {work}: {', '.join(left[:5])}; unmount them "
            "(umount -R), then remove the directory",
            mounts=left,
        )


def _build(
    cache_dir: Path,
    spec: BaseSpec,
    sources: Path,
    say: Progress,
    started: mmdebstrap.Started | None,
) -> Prepared:
    binary = shutil.which("mmdebstrap")
    if binary is None:
        raise RootfsUnavailable(
            "mmdebstrap is not installed: `apt-get install mmdebstrap` (Debian's package) "
            "builds the default sandbox root filesystem"
        )
    if os.geteuid() != 0 and not mmdebstrap.has_subuids():
        raise RootfsUnavailable(
            "building the default root filesystem without root needs a subordinate uid range "
            "for this user (/etc/subuid: mmdebstrap's unshare mode); or let root build it "
            "(`python -m sandpod_image.debian DIR`) and pass its path"
        )
    key = spec.key()
    work = cache_dir / f".build-{key}-{os.getpid()}"
    work.mkdir(mode=0o755)
    try:
        t0 = time.monotonic()
        try:
            argv = mmdebstrap.argv(
                binary,
                variant=spec.variant,
                packages=spec.packages,
                dpkgopts=_EXCLUDES,
                customize=_CUSTOMIZE,
                target=(str(spec.suite), str(work / "fs"), str(sources)),
            )
            code, tail = mmdebstrap.run(argv, say, started)
        except OSError as exc:
            raise RootfsUnavailable(f"cannot run mmdebstrap: {exc}") from exc
        if code != 0:
            text = "\n".join(tail)
            raise RootfsBuildFailed(
                f"mmdebstrap exited with {code}; its output ends with:\n{text}", returncode=code
            )
        (work / "fs").chmod(0o755)  # others (a rootless service) must traverse it
        manifest = Manifest(
            name=spec.name,
            key=key,
            suite=str(spec.suite),
            variant=spec.variant,
            packages=spec.packages,
            size_bytes=_size(work / "fs"),
            built_at=time.time(),
            build_seconds=round(time.monotonic() - t0, 1),
        )
        (work / MANIFEST).write_bytes(manifest.encode())
        top = cache_dir / f"{spec.name}-{key}"
        if top.exists():  # a tree without a readable manifest (find said none): not whole
            _discard(top)
        work.rename(top)  # atomic: a tree in the cache is whole
    except BaseException:
        _discard(work)
        raise
    say(f"root filesystem ready: {top / 'fs'} ({manifest.size_bytes / 1e6:.0f} MB)")
    return Prepared(top / "fs", manifest, built=True)


def _size(fs: Path) -> int:
    """Bytes of the regular files below ``fs`` (hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(fs):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sandpod_image.debian [CACHE_DIR]``: prepare the tree, print its path."""
    args = list(sys.argv[1:] if argv is None else argv)
    cache = Path(args[0]) if args else Path("~/.cache/sandpod/rootfs").expanduser()
    try:
        ready = prepare(cache, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except RootfsError as exc:
        print(f"error: [{exc.code}] {exc.message}", file=sys.stderr)
        return 1
    print(ready.fs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
