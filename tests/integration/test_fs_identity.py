"""Attack: a jailed sandbox's file API used to act as root on an overlay of the host's ``/``.

execd runs as root on the host; the jail's root is an overlay whose lower layer is the host's
root filesystem. Through the file API (SDK, gateway, CLI) the attacker - whoever holds the
sandbox, with the sandbox user's rights inside - asks execd to read ``/etc/shadow``, replace
``/usr/bin/sleep``, chown files to root, watch or clone into directories its user cannot
reach, and run commands in a cwd its user cannot enter. Each must get exactly the answer the
sandbox's own user would get: refused with ``fs.permission_denied`` (or ``invalid_cwd``), the
target unchanged afterwards; what that user owns stays fully usable.

The planted files live under the host's ``/var/tmp`` (part of the jail's lower layer; ``/tmp``
is a private tmpfs inside), made before the jail, one per permission class: root 0600, root
0644, another uid's 0600, plus a root 0700 directory and a root 0755 one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gateway_harness import Gateway, gateway, mint_key, start_gateway  # noqa: F401
from test_jail import make, runtime, state  # noqa: F401 - fixtures used by name

from conftest import Execd, NatsServer
from sandpod import AsyncSandbox
from sandpod_contract.errors import FsPermissionDenied, InvalidCwd
from sandpod_lifecycle.runtime.base import InstanceStatus

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
SECRET = b"ROOT-ONLY-must-never-be-returned\n"
PUBLIC = b"root-owned, world-readable\n"
OTHER_UID = 4242  # not the sandbox's uid (jail uids are allocated from a high range)
PLANTED = ("root600", "root644", "other600", "rootdir", "privdir")


@dataclass
class Planted:
    top: Path
    before: dict[str, tuple[int, int, int, bytes | None]]  # name -> (mode, uid, gid, content)

    def path(self, name: str) -> str:
        return f"{self.top}/{name}"


def _snapshot(top: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    out = {}
    for item in sorted(top.rglob("*")):
        st = item.lstat()
        content = item.read_bytes() if item.is_file() else None
        out[str(item.relative_to(top))] = (st.st_mode, st.st_uid, st.st_gid, content)
    return out


@pytest.fixture
def planted() -> Iterator[Planted]:
    """Host files of each permission class, made before the jail (its overlay's lower layer)."""
    top = Path("/var/tmp") / f"sandpod-fsident-{uuid.uuid4().hex[:10]}"
    top.mkdir(mode=0o755)
    top.chmod(0o755)
    for name, data, mode, uid in (
        ("root600", SECRET, 0o600, 0),
        ("root644", PUBLIC, 0o644, 0),
        ("other600", SECRET, 0o600, OTHER_UID),
    ):
        (top / name).write_bytes(data)
        (top / name).chmod(mode)
        os.chown(top / name, uid, uid)
    for name, mode, data in (("rootdir", 0o755, PUBLIC), ("privdir", 0o700, SECRET)):
        (top / name).mkdir()
        (top / name).chmod(mode)
        (top / name / "inside").write_bytes(data)
        (top / name / "inside").chmod(0o644)
    yield Planted(top, _snapshot(top))
    shutil.rmtree(top, ignore_errors=True)


Jailed = tuple[InstanceStatus, AsyncSandbox]


@pytest.fixture
async def jailed(
    planted: Planted,
    make: Callable[..., object],  # noqa: F811 - the fixture imported above
    start_execd: Callable[..., Execd],
    nats: NatsServer,
) -> AsyncIterator[Jailed]:
    st: InstanceStatus = await make()  # type: ignore[misc]
    assert st.uid not in (0, OTHER_UID)
    start_execd(st.sandbox_id, SANDPOD_EXECD_JAIL=str(st.jail_file))
    sbx = await AsyncSandbox.connect(st.sandbox_id, nats_url=nats.url)
    try:
        yield st, sbx
    finally:
        await sbx.close()


async def inside(sbx: AsyncSandbox, script: str) -> str:
    r = await sbx.exec(script)
    assert r.exit_code == 0, (r.exit_code, r.stderr)
    return r.stdout


def sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


async def assert_unharmed(sbx: AsyncSandbox, p: Planted, sleep_sum: str) -> None:
    """Nothing planted changed, on the host or as the sandbox sees it; /usr/bin/sleep neither."""
    assert _snapshot(p.top) == p.before
    pub, rootdir = p.path("root644"), p.path("rootdir")
    seen = await inside(
        sbx, f"cat {pub}; sha256sum /usr/bin/sleep; stat -c '%a %u' {pub} {rootdir}"
    )
    assert seen == f"{PUBLIC.decode()}{sleep_sum}  /usr/bin/sleep\n644 0\n755 0\n"
    assert (await inside(sbx, f"ls {p.path('rootdir')}")).split() == ["inside"]


async def test_reads_get_exactly_the_sandbox_users_rights(jailed: Jailed, planted: Planted) -> None:
    """root 0600 (and /etc/shadow, /etc/gshadow) and another uid's 0600 are refused; root 0644
    and the sandbox's own files read; a root 0700 directory cannot be listed or looked into."""
    _, sbx = jailed
    for path in (
        "/etc/shadow",
        "/etc/gshadow",
        planted.path("root600"),
        planted.path("other600"),
        f"{planted.path('privdir')}/inside",
    ):
        with pytest.raises(FsPermissionDenied):
            await sbx.fs.read(path)
    with pytest.raises(FsPermissionDenied):
        await sbx.fs.list(planted.path("privdir"))
    with pytest.raises(FsPermissionDenied):
        await sbx.fs.stat(f"{planted.path('privdir')}/inside")
    found = await sbx.fs.search("ROOT-ONLY", path=str(planted.top))  # unreadable: skipped
    assert found.matches == ()
    with pytest.raises(FsPermissionDenied):
        await sbx.fs.copy(planted.path("root600"), "/workspace/stolen")
    assert not await sbx.fs.exists("/workspace/stolen")
    assert await sbx.fs.read(planted.path("root644")) == PUBLIC
    await inside(sbx, "printf mine > /workspace/own && chmod 600 /workspace/own")
    assert await sbx.fs.read("/workspace/own") == b"mine"
    assert _snapshot(planted.top) == planted.before


async def test_root_owned_files_cannot_be_changed(jailed: Jailed, planted: Planted) -> None:
    """Overwrite, upload, remove, rename, chmod, chown of root's files, and writing into root's
    directories, are refused; the files are unchanged afterwards."""
    st, sbx = jailed
    sleep_sum = sha256("/usr/bin/sleep")
    pub, rootdir = planted.path("root644"), planted.path("rootdir")
    attempts = [
        sbx.fs.write("/usr/bin/sleep", b"#!/bin/sh\necho owned\n"),
        sbx.fs.write(pub, b"overwritten"),
        sbx.fs.write(pub, os.urandom(2 * 1024 * 1024)),  # streamed: an upload
        sbx.fs.write(f"{rootdir}/new", b"planted"),
        sbx.fs.write(planted.path("other600"), b"overwritten"),
        sbx.fs.mkdir(f"{rootdir}/newdir"),
        sbx.fs.remove(pub),
        sbx.fs.remove(rootdir, recursive=True),
        sbx.fs.move(pub, f"{planted.top}/moved"),
        sbx.fs.move(f"{rootdir}/inside", "/workspace/taken"),
        sbx.fs.chmod(pub, 0o666),
        sbx.fs.chmod(rootdir, 0o777),
        sbx.fs.chown(pub, st.uid, st.gid),
    ]
    for i, attempt in enumerate(attempts):
        with pytest.raises(FsPermissionDenied):  # noqa: PT012 - says which attempt got through
            await attempt
            pytest.fail(f"attempt {i} was not refused")
    replaced = await sbx.fs.replace(str(planted.top), "root-owned", "pwned")
    assert replaced.total == 0 and replaced.files == ()
    await assert_unharmed(sbx, planted, sleep_sum)
    assert not await sbx.fs.exists("/workspace/taken")


async def test_own_files_work_and_chown_stays_within_its_ids(
    jailed: Jailed, planted: Planted
) -> None:
    """The sandbox's own files can be written, chmodded, moved, removed and chowned to its own
    ids; chown (or write owner=) to root or to another uid is refused and changes nothing."""
    st, sbx = jailed
    info = await sbx.fs.write("/workspace/mine/a.txt", b"hello", mode=0o640)
    assert (info.uid, info.gid) == (st.uid, st.gid)
    assert (await sbx.fs.chmod("/workspace/mine/a.txt", 0o600)).mode & 0o777 == 0o600
    assert (await sbx.fs.chown("/workspace/mine/a.txt", st.uid, st.gid)).uid == st.uid
    for owner, group in ((0, None), (None, 0), (OTHER_UID, OTHER_UID), (st.uid, 0)):
        with pytest.raises(FsPermissionDenied):
            await sbx.fs.chown("/workspace/mine/a.txt", owner, group)
        with pytest.raises(FsPermissionDenied):
            await sbx.fs.write("/workspace/mine/b.txt", b"x", owner=owner, group=group)
    with pytest.raises(FsPermissionDenied):
        await sbx.fs.chown("/workspace/mine", 0, recursive=True)
    assert await inside(
        sbx, "stat -c '%u %g %a' /workspace/mine /workspace/mine/a.txt; ls /workspace/mine"
    ) == (f"{st.uid} {st.gid} 755\n{st.uid} {st.gid} 600\na.txt\n")
    moved = await sbx.fs.move("/workspace/mine/a.txt", "/tmp/a.txt")  # across filesystems
    assert moved.uid == st.uid and await sbx.fs.read("/tmp/a.txt") == b"hello"
    assert await sbx.fs.remove("/workspace/mine", recursive=True)
    assert _snapshot(planted.top) == planted.before


async def test_watch_cwd_and_clone_need_the_users_rights(jailed: Jailed, planted: Planted) -> None:
    """A watch on a directory the user cannot read, a command in a cwd it cannot enter and a
    clone into a root-owned directory are refused; its own directories still work."""
    _, sbx = jailed
    sleep_sum = sha256("/usr/bin/sleep")
    with pytest.raises(FsPermissionDenied):
        await sbx.watch.start(planted.path("privdir"))
    w = await sbx.watch.start("/workspace")
    await w.stop()
    with pytest.raises(InvalidCwd):
        await sbx.exec(planted.path("privdir"), "cat inside")
    assert (await sbx.exec(planted.path("rootdir"), "cat inside")).stdout == PUBLIC.decode()
    git = "git -c user.email=a@b -c user.name=a"
    await inside(
        sbx,
        f"git init -q /workspace/src && cd /workspace/src && {git} commit -q --allow-empty -m one",
    )
    for target in (f"{planted.path('rootdir')}/clone", f"{planted.path('privdir')}/clone"):
        with pytest.raises(FsPermissionDenied):
            await sbx.git.clone("/workspace/src", target)
    head = await sbx.git.clone("/workspace/src", "/workspace/clone")
    assert head.commit
    await assert_unharmed(sbx, planted, sleep_sum)


async def test_gateway_and_cli_refuse_root_files(
    jailed: Jailed,
    planted: Planted,
    gateway: Gateway,  # noqa: F811 - the fixture imported above
    nats: NatsServer,
) -> None:
    """The same refusals through the HTTP gateway (403 fs.permission_denied) and `sandpod cp`
    (exit 125 naming the code); readable files still come through both."""
    st, sbx = jailed
    sleep_sum = sha256("/usr/bin/sleep")
    key = await mint_key(gateway, "default")
    base = f"/v1/sandboxes/{st.sandbox_id}/files"
    async with gateway.client(key) as c:
        for path in ("/etc/shadow", planted.path("root600"), planted.path("other600")):
            r = await c.get(f"{base}/content", params={"path": path})
            assert (r.status_code, r.json()["code"]) == (403, "fs.permission_denied"), path
            assert SECRET not in r.content
        r = await c.get(f"{base}/content", params={"path": planted.path("root644")})
        assert r.status_code == 200 and r.content == PUBLIC
        for path in ("/usr/bin/sleep", planted.path("root644"), f"{planted.path('rootdir')}/x"):
            r = await c.put(f"{base}/content", params={"path": path}, content=b"pwned")
            assert (r.status_code, r.json()["code"]) == (403, "fs.permission_denied"), path
    env = {**os.environ, "SANDPOD_NATS_URL": nats.url}

    def cp(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [SANDPOD, "cp", *args], capture_output=True, env=env, timeout=60, check=False
        )

    for path in ("/etc/shadow", planted.path("root600")):
        ran = cp(f"{st.sandbox_id}:{path}", "-")
        assert ran.returncode == 125 and b"[fs.permission_denied]" in ran.stderr, ran.stderr
        assert SECRET not in ran.stdout and b"root:" not in ran.stdout
    local = planted.top.parent / f"{planted.top.name}-local"
    local.write_bytes(b"pwned")
    try:
        for path in ("/usr/bin/sleep", planted.path("root644")):
            ran = cp(str(local), f"{st.sandbox_id}:{path}")
            assert ran.returncode == 125 and b"[fs.permission_denied]" in ran.stderr, ran.stderr
    finally:
        local.unlink()
    ran = cp(f"{st.sandbox_id}:{planted.path('root644')}", "-")
    assert ran.returncode == 0 and ran.stdout == PUBLIC
    await assert_unharmed(sbx, planted, sleep_sum)
