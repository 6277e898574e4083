"""Directory backup and restore as a tar stream (``sbx.fs.archive`` / ``sbx.fs.extract``) on a
real jail through a real nats-server: byte-exact round trips of every file kind, typed errors,
early exits that stop ``tar``, and hostile archives that cannot reach the host.

The attack: a restored archive comes from anywhere (another agent's output, a downloaded
backup). Its members aim at the host (``../`` climbs, absolute names, a symlink then a write
through it, a device node). Unpacking it is the sandbox's ``tar`` as the sandbox's user inside
its jail, so the host's files stay as they were; an extractor running in execd (root on the
host) that trusted the names would overwrite the sentinel.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from test_jail import jailed, make, runtime, state  # noqa: F401 - fixtures used by name

from sandpod import AsyncSandbox
from sandpod.errors import ArchiveFailed
from sandpod_contract.errors import FsNotADirectory, FsNotFound
from sandpod_lifecycle.runtime.base import InstanceStatus

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)

Jailed = tuple[InstanceStatus, AsyncSandbox]
HOST = b"HOST-FILE-must-stay-as-it-is"

# Every entry under the tree, one line each: type, mode, size, link target, content hash, and
# the inode's link count (hard links survive as links, not copies). Sorted, so order is moot.
MANIFEST = (
    "cd \"$1\" && find . -mindepth 1 -printf '%y %m %s %l %n %P\\n' | sort && "
    "find . -type f -print0 | sort -z | xargs -0 -r sha256sum && "
    "find . -type f -printf '%S %P\\n' | sort"
)


async def manifest(sbx: AsyncSandbox, path: str) -> str:
    r = await sbx.exec(["sh", "-c", MANIFEST, "manifest", path])
    assert r.exit_code == 0, r.stderr
    return r.stdout


TREE = (
    "set -e; mkdir -p src/empty src/deep/er/still && cd src && "
    "head -c 3000000 /dev/urandom > big.bin && printf 'hello\\n' > small.txt && : > zero && "
    "chmod 0751 deep && chmod 0640 small.txt && chmod 4755 big.bin && "
    "ln -s small.txt link && ln -s /nowhere dangling && ln small.txt hard && "
    "truncate -s 50M sparse && printf tail >> sparse && "
    "printf 'x' > 'name with spaces & ünïcödé' && "
    "touch -d '2001-02-03 04:05:06' deep/er/still/old && "
    "(setfattr -n user.sandpod -v kept small.txt 2>/dev/null || true)"
)


async def test_a_tree_round_trips_exactly_and_in_bounded_pieces(jailed: Jailed) -> None:  # noqa: F811
    """Modes (setuid too), symlinks (dangling too), hard links, sparse files, empty directories,
    odd names and mtimes come back the same; the stream arrives in pieces with progress."""
    _, sbx = jailed
    await sbx.exec(TREE, check=True)
    seen: list[int] = []
    pieces = 0
    data = bytearray()
    async for chunk in sbx.fs.archive("/workspace/src", progress=lambda d, _t: seen.append(d)):
        pieces += 1
        data += chunk
    assert pieces > 1 and seen == sorted(seen) and seen[-1] == len(data)
    # A sparse 50 MiB file travels as its data, not 50 MiB of zeros (GNU tar --sparse).
    assert len(data) < 20 * 1024 * 1024, len(data)
    sent = await sbx.fs.extract("/workspace/copy", bytes(data))
    assert sent == len(data)
    assert await manifest(sbx, "/workspace/copy") == await manifest(sbx, "/workspace/src")
    r = await sbx.exec(
        "stat -c '%Y' copy/deep/er/still/old; "
        "getfattr --only-values -n user.sandpod copy/small.txt 2>/dev/null || echo no-xattr-here; "
        "getfattr --only-values -n user.sandpod src/small.txt 2>/dev/null || echo no-xattr-here"
    )
    lines = r.stdout.split()
    assert lines[0] == str(int(_epoch("2001-02-03 04:05:06")))
    assert lines[1] == lines[2]  # the xattr came back where the filesystem keeps them


def _epoch(text: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(text).timestamp()


async def test_gzip_files_and_chunk_sources_restore_the_same(
    jailed: Jailed,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``archive_to`` a local .tgz, then ``extract`` it from a path, a file object and an async
    chunk iterator: three identical trees; the local file is a valid gzip tar with the names."""
    _, sbx = jailed
    await sbx.exec("mkdir -p t/a && seq 1 100000 > t/a/n && echo x > t/b", check=True)
    local = tmp_path / "t.tgz"
    size = await sbx.fs.archive_to("/workspace/t", local, gzip=True)
    assert size == local.stat().st_size > 0
    with tarfile.open(local, "r:gz") as tf:
        assert {"./a/n", "./b"} <= set(tf.getnames())

    async def chunks() -> AsyncIterator[bytes]:
        raw = local.read_bytes()
        for i in range(0, len(raw), 1000):
            yield raw[i : i + 1000]

    await sbx.fs.extract("/workspace/r1", local, gzip=True)
    with local.open("rb") as f:
        await sbx.fs.extract("/workspace/r2", f, gzip=True)
    await sbx.fs.extract("/workspace/r3", chunks(), gzip=True)
    want = await manifest(sbx, "/workspace/t")
    for name in ("r1", "r2", "r3"):
        assert await manifest(sbx, f"/workspace/{name}") == want, name


async def test_errors_are_typed_and_say_what_tar_said(jailed: Jailed) -> None:  # noqa: F811
    _, sbx = jailed
    await sbx.exec("echo f > afile", check=True)
    with pytest.raises(FsNotFound):
        async for _ in sbx.fs.archive("/workspace/missing"):
            pass
    with pytest.raises(FsNotADirectory):
        async for _ in sbx.fs.archive("/workspace/afile"):
            pass
    with pytest.raises(FsNotADirectory):
        await sbx.fs.extract("/workspace/afile", b"")
    with pytest.raises(ArchiveFailed) as err:
        await sbx.fs.extract("/workspace/junk", b"this is not a tar archive" * 100)
    assert err.value.details["exit_code"] == 2 and "tar" in err.value.details["stderr"]
    # a truncated archive is refused too, not half-applied silently
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("whole")
        info.size = 100000
        tf.addfile(info, io.BytesIO(b"y" * 100000))
    with pytest.raises(ArchiveFailed):
        await sbx.fs.extract("/workspace/trunc", buf.getvalue()[:20000])


async def test_leaving_the_stream_early_stops_tar(jailed: Jailed) -> None:  # noqa: F811
    """A reader that stops after the first piece leaves no ``tar`` running in the sandbox."""
    _, sbx = jailed
    await sbx.exec("mkdir -p big && head -c 20000000 /dev/urandom > big/f", check=True)
    chunks = sbx.fs.archive("/workspace/big")
    async for _ in chunks:
        break
    await chunks.aclose()  # type: ignore[attr-defined]

    # The sandbox waits for its own tar to go (bounded): exit 0 once none is left.
    r = await sbx.exec(
        "for i in $(seq 300); do ps -eo comm | grep -qx tar || exit 0; sleep 0.05; done; exit 1"
    )
    assert r.exit_code == 0, "tar still runs in the sandbox after the reader left"


@pytest.fixture
def sentinel() -> Iterator[Path]:
    top = Path("/tmp") / f"sandpod-archive-{uuid.uuid4().hex[:10]}"
    top.mkdir()
    (top / "victim").write_bytes(HOST)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _hostile(top: Path) -> bytes:
    """An archive whose members aim at ``top/victim`` on the host every way tar allows."""
    buf = io.BytesIO()
    evil = b"OVERWRITTEN"
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:

        def add(
            name: str,
            kind: bytes = tarfile.REGTYPE,
            link: str = "",
            data: bytes = evil,
            dev: tuple[int, int] = (0, 0),
        ) -> None:
            info = tarfile.TarInfo(name)
            info.devmajor, info.devminor = dev
            info.type = kind
            info.linkname = link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            info.mode = 0o6777
            tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("../" * 12 + str(top.relative_to("/")) + "/victim")
        add(str(top / "victim"))
        add("escape", tarfile.SYMTYPE, str(top))
        add("escape/victim")
        add("hl", tarfile.LNKTYPE, str(top / "victim"))
        add("hl")
        add("mem", tarfile.CHRTYPE, dev=(1, 1))  # /dev/mem
        add("disk", tarfile.BLKTYPE, dev=(8, 0))  # the host's first disk
        add("fine.txt", data=b"ok")
    return buf.getvalue()


async def test_a_hostile_archive_cannot_touch_the_host(
    jailed: Jailed,  # noqa: F811
    sentinel: Path,
) -> None:
    """Climbs, absolute names, symlink-then-write, a hard link to a host file and a device node:
    the host's file is unchanged and still root's 0644; the harmless member is restored."""
    st, sbx = jailed
    sentinel.joinpath("victim").chmod(0o644)
    with pytest.raises(ArchiveFailed):  # tar reports the members it refused, and exits 2
        await sbx.fs.extract("/workspace/in", _hostile(sentinel))
    victim = sentinel / "victim"
    assert victim.read_bytes() == HOST
    s = victim.lstat()
    assert (stat.S_IMODE(s.st_mode), s.st_uid, s.st_nlink) == (0o644, 0, 1)
    assert sorted(p.name for p in sentinel.iterdir()) == ["victim"]
    assert (await sbx.fs.read("/workspace/in/fine.txt")) == b"ok"
    # No device node came in; only 0:0 (the whiteout, which Linux lets any user make and which
    # opens nothing) may appear, as it does for the sandbox's own mknod.
    r = await sbx.exec(
        "find /workspace/in \\( -type c -o -type b \\) -exec stat -c '%t:%T' {} + | sort -u"
    )
    assert r.stdout.split() in ([], ["0:0"]), r.stdout
    assert st.uid != 0
