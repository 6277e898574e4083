"""Pieces of the local runtime that need no root: mount-table parsing, cgroup layout and limits
(cgroup v2 included, which this host cannot run), and jail path resolution against symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandpod_contract.errors import InvalidCwd
from sandpod_execd.files.rooted import Root, openat2_available
from sandpod_execd.handlers.session import _place
from sandpod_execd.jail import Jail
from sandpod_execd.registry import ExecRegistry
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.sessiondir import SessionDir
from sandpod_lifecycle.runtime.base import HostCapabilities, Resources
from sandpod_lifecycle.runtime.cgroups import CgroupPlan
from sandpod_lifecycle.runtime.hostcaps import parse_cgroup_mounts

HYBRID = """\
30 24 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
31 24 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
32 24 0:28 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
33 24 0:29 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
34 24 0:30 / /sys/fs/cgroup/freezer rw,nosuid - cgroup cgroup rw,freezer
35 24 0:31 /docker/abc /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio
36 24 0:32 /sub /mnt/memory rw - cgroup cgroup rw,memory
"""


def caps(v1: dict[str, Path], v2: Path | None, v2_controllers: set[str]) -> HostCapabilities:
    return HostCapabilities(
        root=True,
        namespaces=frozenset(),
        unprivileged_user_namespaces=False,
        overlayfs=True,
        cgroup_v1=v1,
        cgroup_v2=v2,
        cgroup_v2_controllers=frozenset(v2_controllers),
        freezer="v1" if "freezer" in v1 else "v2",
        tools={},
    )


def test_mountinfo_yields_hierarchy_roots_only() -> None:
    """v1 controllers map to their mount points; sub-cgroup bind mounts are ignored."""
    v1, v2 = parse_cgroup_mounts(HYBRID)
    assert v2 == Path("/sys/fs/cgroup/unified")
    assert v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "pids": Path("/sys/fs/cgroup/pids"),
        "freezer": Path("/sys/fs/cgroup/freezer"),
    }


def test_hybrid_host_limits_on_v1_and_core_where_asked() -> None:
    """On a hybrid host the limits use v1; the core is the v1 freezer unless v2 is asked for."""
    v1, v2 = parse_cgroup_mounts(HYBRID)
    plan = CgroupPlan.choose(caps(v1, v2, set()), "sandpod")
    cg = plan.for_sandbox("s1")
    assert cg.core == "/sys/fs/cgroup/freezer/sandpod/s1" and cg.core_version == 1
    assert cg.joined == [
        f"/sys/fs/cgroup/{h}/sandpod/s1" for h in ("memory", "cpu,cpuacct", "pids")
    ]
    v2_core = CgroupPlan.choose(caps(v1, v2, set()), "sandpod", core="v2").for_sandbox("s1")
    assert v2_core.core == "/sys/fs/cgroup/unified/sandpod/s1" and v2_core.core_version == 2
    with pytest.raises(ValueError, match="plain name"):
        CgroupPlan.choose(caps(v1, v2, set()), "../escape")


def test_pure_v2_host_writes_v2_limits_and_enables_controllers(tmp_path: Path) -> None:
    """On cgroup v2 one directory does everything: controllers enabled down the tree, limits in
    v2 syntax, swap off."""
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    plan = CgroupPlan.choose(caps({}, tmp_path, {"memory", "cpu", "pids"}), "sandpod")
    cg = plan.for_sandbox("s2")
    assert cg.dirs == [str(tmp_path / "sandpod/s2")] and cg.joined == []
    d = tmp_path / "sandpod/s2"
    (tmp_path / "sandpod").mkdir()
    protections = cg.create(Resources(memory_bytes=64 << 20, cpu_millicores=1500, pids=99))
    assert protections == dict.fromkeys(("freezer", "memory", "cpu", "pids"), "active")
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu +pids"
    assert (tmp_path / "sandpod/cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (d / "memory.max").read_text() == str(64 << 20)
    assert (d / "cpu.max").read_text() == "150000 100000"
    assert (d / "pids.max").read_text() == "99"
    assert cg.memory_usage() is None or cg.memory_usage() == 0  # no memory.current in a fake


def test_missing_controllers_are_reported_not_hidden(tmp_path: Path) -> None:
    """Without a pids controller the sandbox is still limited elsewhere and says pids is not."""
    plan = CgroupPlan.choose(
        caps({"freezer": tmp_path / "f", "memory": tmp_path / "m"}, None, set()), "p"
    )
    cg = plan.for_sandbox("s3")
    protections = cg.create(Resources())
    assert protections["memory"] == "active" and protections["freezer"] == "active"
    assert protections["pids"].startswith("unavailable") and protections["cpu"].startswith("unav")
    assert (tmp_path / "m/p/s3/memory.limit_in_bytes").read_text() == str(Resources().memory_bytes)


def fake_jail(root: Path, workspace: Path) -> Jail:
    jail = Jail.__new__(Jail)  # only the path logic: no holder, no namespaces
    jail.root = str(root)
    jail.workspace = workspace
    jail.fs_root = Root(str(root), jailed=True)
    jail.workdir, jail.image_shell = "/workspace", None
    return jail


def commanding_jail(root: Path) -> Jail:
    """A fake jail that can build commands (never run: there is no holder)."""
    jail = fake_jail(root, root / "workspace")
    jail.check = lambda: None  # type: ignore[method-assign]
    jail.holder, jail.uid, jail.gid, jail.userns = 1, 1000, 1000, False
    jail.join, jail.track = (), None
    jail._sh, jail._nsenter = "/bin/sh", "/usr/bin/nsenter"
    return jail


@pytest.fixture
def jail_world(tmp_path: Path) -> tuple[Path, Path]:
    """``(root, host)``: a jail root with /bin/sh, /bin/tool and /workspace/d, and a host
    directory (outside the root) holding an executable the jail must never see."""
    root, host = tmp_path / "root", tmp_path / "host"
    for d in (root / "bin", root / "workspace/d", host):
        d.mkdir(parents=True)
    for exe in (root / "bin/sh", root / "bin/tool", host / "tool"):
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    (root / "bin/evil").symlink_to(host / "tool")  # the host's path: absent inside the root
    (root / "workspace/hostdir").symlink_to(host)
    (root / "workspace/dlink").symlink_to("/workspace/d")
    return root, host


needs_openat2 = pytest.mark.skipif(
    not openat2_available(), reason="this kernel has no openat2: run on Linux >= 5.6"
)


@needs_openat2
def test_program_and_cwd_checks_resolve_links_in_the_jail_root(
    jail_world: tuple[Path, Path],
) -> None:
    """has_program and a command's cwd check follow links as the jail does: a link to a host
    path names what the root has there (nothing), a link inside the root works."""
    root, host = jail_world
    jail = commanding_jail(root)
    assert jail.has_program("/bin/tool") and jail.has_program("/workspace/../bin/sh")
    assert not jail.has_program("/bin/evil") and not jail.has_program(str(host / "tool"))
    assert not jail.has_program("/workspace/d")  # a directory is no program
    assert jail.is_dir("/workspace/dlink") and not jail.is_dir("/workspace/hostdir")
    with pytest.raises(InvalidCwd) as caught:
        jail.command(("sh",), "/workspace/hostdir", {"PATH": "/bin"}, stdin=False)
    assert caught.value.details["cwd"] == "/workspace/hostdir"  # the jail's path, not a host one
    cmd = jail.command(("tool",), "/workspace/dlink", {"PATH": "/bin"}, stdin=False)
    assert any(a.endswith("/workspace/dlink") for a in cmd.argv)  # entered inside the jail


@needs_openat2
def test_a_cwd_swapped_for_a_host_link_after_the_check_never_moves_the_launcher(
    jail_world: tuple[Path, Path],
) -> None:
    """The launcher starts in the jail's root, not in a host path below it: a directory the
    sandbox swaps for a link to a host directory after the check cannot redirect it there."""
    root, host = jail_world
    cmd = commanding_jail(root).command(("sh",), "/workspace/d", {"PATH": "/bin"}, stdin=False)
    os.rename(root / "workspace/d", root / "workspace/d.old")
    (root / "workspace/d").symlink_to(host)
    assert os.path.realpath(cmd.cwd) == os.path.realpath(root)


def test_jail_paths_resolve_symlinks_inside_the_jail(tmp_path: Path) -> None:
    """Absolute links restart at the jail's root, .. stops there, loops end: never a host path."""
    root, ws = tmp_path / "root", tmp_path / "ws"
    (root / "etc").mkdir(parents=True)
    (root / "workspace").mkdir()
    ws.mkdir()
    (root / "etc/escape").symlink_to("/")  # would be the host's / if followed on the host
    (root / "etc/up").symlink_to("../../../../..")
    (root / "etc/loop").symlink_to("loop")
    (root / "etc/ws").symlink_to("/workspace/sub")
    jail = fake_jail(root, ws)
    assert jail.inside(None) == "/workspace" and jail.inside("a/../b") == "/workspace/b"
    assert jail.inside("/etc/../..") == "/" and jail.inside("../..") == "/"
    assert jail.resolve("/etc/escape/etc") == "/etc"
    assert jail.resolve("/etc/up/etc") == "/etc"
    assert jail.host_path("/etc/escape") == str(root) + "/"
    assert jail.resolve("/etc/loop/x").startswith("/etc/loop")  # left unresolved, won't exist
    assert jail.host_path("/etc/ws/f") == str(ws / "sub/f")
    assert jail.host_path("/workspace") == str(ws)


@needs_openat2
def test_a_session_directory_goes_where_the_jails_tmp_leads_never_to_the_host(
    jail_world: tuple[Path, Path],
) -> None:
    """A jailed session's directory is made in the sandbox's /tmp resolved in the jail's root:
    a /tmp the sandbox made a link to a host directory's path leads nowhere (not to the host)
    and nothing is created on the host; a link inside the root is followed."""
    root, host = jail_world
    (root / "tmp").symlink_to(host)  # the host's path: absent inside the root
    jail = commanding_jail(root)
    jail.env, jail.userns = {}, True  # userns: no chown, so it runs unprivileged too
    sbx = SandboxContext(
        "s1", root / "workspace", "/bin/sh", {}, ExecRegistry(60, 1 << 20), jail=jail
    )
    place = _place(sbx, sbx.command(("sh",), None, None, {}, stdin=True), "d")
    assert (place.tmp, place.cwd, place.owner) == ("/tmp", "/workspace/d", None)
    with pytest.raises(OSError, match="/tmp"):  # ENOENT, or ELOOP when the host path is in /tmp
        SessionDir(place.root, place.tmp, place.owner)
    assert sorted(os.listdir(host)) == ["tool"]
    (root / "tmp").unlink()
    (root / "run/tmp").mkdir(parents=True)
    (root / "tmp").symlink_to("/run/tmp")
    workdir = SessionDir(place.root, place.tmp, place.owner)
    try:
        workdir.write("cmd", b"true\n")
        assert workdir.inside.startswith("/tmp/sandpod-session-")
        assert (root / "run/tmp" / workdir.name / "cmd").read_bytes() == b"true\n"
    finally:
        workdir.remove()
    assert os.listdir(root / "run/tmp") == [] and sorted(os.listdir(host)) == ["tool"]
    with pytest.raises(RuntimeError, match="fs_root"):  # no host path string of a jail path
        sbx.resolve_cwd("d")
