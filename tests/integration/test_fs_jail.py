"""execd's file API on a real jail: every path resolves inside the sandbox's root, even while the
sandbox races to swap a directory for a symlink to ``/``.

execd runs as root on the host here, so a path it resolved the host's way would read or change
host files. Each test plants a *host sentinel* under the host's ``/tmp`` (the sandbox has a
private ``/tmp``, so the same path inside holds the sandbox's own copy) and checks that its
content is never returned and that it is never changed, whatever the links say.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_jail import jailed, make, runtime, state  # noqa: F401 - fixtures used by name

from sandpod import AsyncSandbox
from sandpod.fs import FileList, SearchResult
from sandpod_contract.errors import FsError, InvalidCwd, SandpodError
from sandpod_lifecycle.runtime.base import InstanceStatus

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)

HOST = b"HOST-SECRET-must-never-be-returned"
Jailed = tuple[InstanceStatus, AsyncSandbox]


@pytest.fixture
def sentinel() -> Iterator[Path]:
    """A host directory ``/tmp/sandpod-fsjail-<id>`` holding files only the host has."""
    top = Path("/tmp") / f"sandpod-fsjail-{uuid.uuid4().hex[:10]}"
    top.mkdir()
    for name in ("secret", "victim", "movable", "modeme"):
        (top / name).write_bytes(HOST)
        (top / name).chmod(0o644)
    (top / "host-only").write_bytes(HOST)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def assert_untouched(top: Path) -> None:
    """Every host sentinel is still there, unchanged, root's, mode 0644; nothing was added."""
    assert sorted(p.name for p in top.iterdir()) == sorted(
        ["secret", "victim", "movable", "modeme", "host-only"]
    )
    for item in top.iterdir():
        st = item.lstat()
        assert stat.S_ISREG(st.st_mode) and item.read_bytes() == HOST, item
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o644, 0, 0), item


async def inside(sbx: AsyncSandbox, script: str) -> str:
    r = await sbx.exec(script)
    assert r.exit_code == 0, (r.exit_code, r.stderr)
    return r.stdout


async def test_symlinks_out_of_the_workspace_resolve_in_the_sandbox_root(
    jailed: Jailed,  # noqa: F811 - the fixture imported above
    sentinel: Path,
) -> None:
    """Links to / (absolute and ../..) and paths outside /workspace name the sandbox's files:
    reads return the sandbox's copy, writes land in the sandbox, magic links are refused."""
    st, sbx = jailed
    t = str(sentinel)
    await inside(
        sbx,
        f"mkdir -p {t} && printf sandbox > {t}/secret && ln -s / /workspace/abs "
        "&& ln -s ../../../../.. /workspace/rel",
    )
    for path in (
        f"/workspace/abs{t}/secret",
        f"rel{t}/secret",
        f"{t}/secret",
        f"/workspace/rel/workspace/rel/workspace/abs/{t}/secret",
    ):
        assert await sbx.fs.read(path) == b"sandbox", path
    names = {e.name for e in await sbx.fs.list(f"/workspace/abs{t}")}
    assert names == {"secret"}
    info = await sbx.fs.write(f"/workspace/abs{t}/secret", b"written")
    assert info.path == f"/workspace/abs{t}/secret" and info.size == len(b"written")
    await sbx.fs.write(f"/workspace/rel{t}/new/deeper", b"new")
    assert (
        await inside(sbx, f"cat {t}/secret; stat -c %u {t}/new {t}/new/deeper")
        == f"written{st.uid}\n{st.uid}\n"
    )
    assert (await sbx.fs.stat("/etc/hostname")).is_file
    with pytest.raises(FsError) as caught:
        await sbx.fs.read(f"/proc/1/root{t}/secret")  # a magic link: the kernel's own jump
    assert caught.value.code == "fs.invalid_path" and caught.value.details["errno"] == "ELOOP"
    assert_untouched(sentinel)


async def test_changes_through_a_symlinked_parent_stay_in_the_root(
    jailed: Jailed,  # noqa: F811 - the fixture imported above
    sentinel: Path,
) -> None:
    """remove, move, copy, chmod and chown through a link to a directory the host has too
    change only the sandbox's files."""
    st, sbx = jailed
    t = str(sentinel)
    await inside(
        sbx,
        f"mkdir -p {t} && cd {t} && for f in victim movable modeme; do "
        f"printf sandbox > $f; done && ln -s {t} /workspace/tlink",
    )
    assert await sbx.fs.remove("/workspace/tlink/victim")
    moved = await sbx.fs.move("/workspace/tlink/movable", "/workspace/moved")  # tmpfs -> disk
    assert moved.path == "/workspace/moved" and await sbx.fs.read("/workspace/moved") == b"sandbox"
    await sbx.fs.chmod("/workspace/tlink/modeme", 0o600)
    await sbx.fs.chown("/workspace/tlink/modeme", st.uid, st.gid)  # within its own ids
    await sbx.fs.chmod("/workspace/tlink", 0o700, recursive=True)
    await sbx.fs.chown("/workspace/tlink", st.uid, recursive=True)  # back to the sandbox's
    copied = await sbx.fs.copy("/workspace/tlink", "/workspace/copied", recursive=True)
    assert copied.is_dir
    assert await inside(sbx, "stat -c %u /workspace/moved") == f"{st.uid}\n"  # owner kept
    out = await inside(sbx, f"ls -a {t} /workspace/copied; stat -c '%a %u' {t}/modeme")
    expected = [f"{t}:", ".", "..", "modeme", "/workspace/copied:", ".", "..", "modeme"]
    assert out.split() == [*expected, "700", str(st.uid)]
    with pytest.raises(FsError) as caught:
        await sbx.fs.remove(f"/workspace/tlink/{'../' * 8}", recursive=True)
    assert caught.value.code == "fs.invalid_path"  # the sandbox's / itself: refused
    assert await sbx.fs.remove("/workspace/tlink/", recursive=True)  # the link, not its target
    assert await inside(sbx, f"ls {t}") == "modeme\n"
    assert_untouched(sentinel)


SWAPPER = r"""
import os, sys, time
os.chdir("/workspace/race")
deadline = time.monotonic() + 60  # bounded even if the test dies without killing us
swaps = 0
while not os.path.exists("stop") and time.monotonic() < deadline:
    for a, b in (("D", "d"), ("d", "D"), ("L", "d"), ("d", "L")):
        try:
            os.rename(a, b)
        except OSError:
            pass
    swaps += 1
    if swaps == 1:
        print("started", flush=True)
open("swaps", "w").write(str(swaps))
"""


async def test_swapping_a_directory_for_a_link_to_the_host_root_never_escapes(
    jailed: Jailed,  # noqa: F811 - the fixture imported above
    sentinel: Path,
) -> None:
    """While a sandbox process renames a directory and a link to / in and out of a path in a
    loop, hundreds of reads, writes, lists, chmods, chowns and removes through that path only
    ever see or change the sandbox's files; the host sentinels are never read nor changed."""
    _, sbx = jailed
    t = str(sentinel)
    await inside(
        sbx,
        f"mkdir -p /workspace/race/D{t} {t} && ln -s / /workspace/race/L && "
        f"printf decoy > /workspace/race/D{t}/secret && printf sandbox > {t}/secret",
    )
    proc = await sbx.proc.start("/workspace/race", ["python3", "-c", SWAPPER])
    try:
        # An event, not a polling loop in the sandbox (a shell forking `sleep` every 10 ms
        # competes with the swapper for the jail's CPU); a swapper that died says so at once.
        await proc.wait_for_log("^started$", timeout=30)
        seen: set[bytes] = set()
        via = f"/workspace/race/d{t}"
        for i in range(150):
            mode = 0o600 if i % 2 else 0o640
            for op in (
                lambda: sbx.fs.read(f"{via}/secret"),
                lambda: sbx.fs.write(f"{via}/secret", b"clobber", make_parents=False),
                lambda: sbx.fs.write(f"{via}/modeme", b"clobber", make_parents=False),
                lambda: sbx.fs.chmod(f"{via}/modeme", mode),  # noqa: B023 - awaited at once
                lambda: sbx.fs.chown(f"{via}/modeme", 12345),
                lambda: sbx.fs.remove(f"{via}/victim", missing_ok=True),
                lambda: sbx.fs.list(via),
                lambda: sbx.fs.search("HOST", path=via),
            ):
                try:
                    got = await op()
                except FsError:
                    continue  # the path was missing at that instant, or a file in the way
                if isinstance(got, bytes):
                    seen.add(got)
                elif isinstance(got, FileList):
                    assert "host-only" not in {e.name for e in got}, "listed a host directory"
                elif isinstance(got, SearchResult):
                    assert not got.matches, got.matches
        assert HOST not in seen
        # The link state was really traversed: its target was read, or written.
        assert b"sandbox" in seen or await sbx.fs.read(f"{t}/secret") == b"clobber", seen
    finally:
        await sbx.exec("touch /workspace/race/stop")
        await proc.wait(timeout=30)
    swaps = int(await inside(sbx, "cat /workspace/race/swaps"))
    assert swaps > 100, swaps
    assert_untouched(sentinel)


async def test_watches_and_clone_checks_resolve_in_the_sandbox_root(
    jailed: Jailed,  # noqa: F811 - the fixture imported above
    sentinel: Path,
) -> None:
    """A watch through a link to / watches the sandbox's directory: its changes are reported,
    the host twin's are not; git's "clone target is empty" check looks at the sandbox's."""
    _, sbx = jailed
    t = str(sentinel)
    await inside(sbx, f"mkdir -p {t}/sub && ln -s / /workspace/abs")
    w = await sbx.watch.start(f"/workspace/abs{t}")
    try:
        (sentinel / "host-made").write_bytes(HOST)  # before the sandbox's: it would come first
        (sentinel / "host-made").unlink()
        await inside(sbx, f"touch {t}/sandbox-made")
        seen: list[str] = []
        while f"/workspace/abs{t}/sandbox-made" not in seen:
            batch = await w.poll(wait=5.0)
            assert batch.events, f"no event for the sandbox's file; got {seen}"
            seen += [e.path for e in batch.events]
        assert not [p for p in seen if "host-made" in p], seen
    finally:
        await w.stop()
    full = Path(f"{t}-full")  # the host's is full, the sandbox's empty: the clone may go on
    full.mkdir()
    try:
        (full / "x").write_bytes(HOST)
        await inside(sbx, f"mkdir -p {t}-full")
        with pytest.raises(SandpodError) as caught:
            await sbx.git.clone("/workspace/no-such-repo", f"/workspace/abs{t}-full")
        assert caught.value.code != "fs.already_exists", caught.value
        assert "no-such-repo" in caught.value.message
    finally:
        shutil.rmtree(full)
    assert_untouched(sentinel)


async def test_disk_usage_and_exec_cwd_resolve_in_the_sandbox_root(
    jailed: Jailed,  # noqa: F811 - the fixture imported above
    sentinel: Path,
) -> None:
    """A workspace link to / never makes the disk usage walk count host files, and an exec
    cwd through a link to a host directory is the sandbox's directory of that name (invalid
    where only the host has one)."""
    _, sbx = jailed
    t = str(sentinel)
    big = Path(f"{t}-big")  # 32 MiB on the host only, reachable through /workspace/abs if followed
    big.mkdir()
    try:
        (big / "blob").write_bytes(os.urandom(32 * 1024 * 1024))
        await inside(
            sbx,
            f"ln -s / /workspace/abs && mkdir -p {t} && printf sandbox > {t}/secret "
            f"&& ln -s {t} /workspace/hostdir",
        )
        metrics = await sbx.metrics()
        assert metrics.disk_complete and metrics.disk_used < 16 * 1024 * 1024, metrics
        r = await sbx.exec("/workspace/hostdir", "cat secret; pwd -P")
        assert (r.exit_code, r.stdout) == (0, f"sandbox{t}\n"), r
        with pytest.raises(InvalidCwd):
            await sbx.exec(f"/workspace/abs{big}", "true")
    finally:
        shutil.rmtree(big)
    assert_untouched(sentinel)
