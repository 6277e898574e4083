"""The default root filesystem's pieces on their own: the cache rules of ``sandpod_image.debian``
(with a stand-in ``mmdebstrap`` on PATH: the real build runs once per machine in the session
fixture, see tests/rootfs.py), and how the local driver picks a template's base."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import pytest

from sandpod import _baseroot
from sandpod_contract.resources import SandboxTemplateSpec
from sandpod_image import debian, mmdebstrap
from sandpod_lifecycle.runtime.local_driver import LocalDriver, NoDefaultRootfs
from sandpod_lifecycle.settings import LifecycleSettings

# A stand-in for mmdebstrap: the argv's last three are suite, output directory, sources; it
# counts its runs in $RUNS, and fails when $FAIL is set (after printing, as the real one does).
FAKE = """#!/bin/sh
echo run >> "$RUNS"
for a; do out=$prev; prev=$a; done
[ -z "${FAIL:-}" ] || { echo "E: cannot reach the mirror"; exit 2; }
echo "I: downloading packages with apt..."
[ -z "${HANG:-}" ] || exec sleep 600  # a build that only ends when it is stopped
mkdir -p "$out/bin" "$out/usr/bin" "$out/etc"
for t in sh sleep umount; do printf '#!/bin/sh\\n' > "$out/bin/$t"; chmod 755 "$out/bin/$t"; done
for f in passwd group hosts; do echo "root:x:0:0" > "$out/etc/$f"; done
echo "I: success in 0.1 seconds"
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "mmdebstrap"
    script.write_text(FAKE)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    runs = tmp_path / "runs"
    monkeypatch.setenv("RUNS", str(runs))
    return runs


SPEC = debian.BaseSpec(suite="bookworm")


def test_prepare_builds_once_relays_progress_and_reuses(fake: Path, tmp_path: Path) -> None:
    """The first prepare builds (its I: lines relayed with elapsed time) into <name>-<key>/fs
    with a manifest; the second reuses it without running mmdebstrap again."""
    lines: list[str] = []
    cache = tmp_path / "cache"
    ready = debian.prepare(cache, SPEC, progress=lines.append, sources=tmp_path / "x.sources")
    assert ready.built and ready.fs == cache / f"debian-{SPEC.key()}" / "fs"
    assert any("downloading packages with apt" in line and "s]" in line for line in lines)
    assert ready.manifest.suite == "bookworm" and ready.manifest.packages == SPEC.packages
    assert stat.S_IMODE(ready.fs.stat().st_mode) == 0o755
    again = debian.prepare(cache, SPEC, sources=tmp_path / "x.sources")
    assert not again.built and again.fs == ready.fs and again.manifest == ready.manifest
    assert fake.read_text().count("run") == 1
    debian.check(ready.fs)


def test_a_failed_build_leaves_nothing_and_says_why(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mmdebstrap failing: RootfsBuildFailed with its output's tail, no tree in the cache."""
    monkeypatch.setenv("FAIL", "1")
    cache = tmp_path / "cache"
    with pytest.raises(debian.RootfsBuildFailed, match="cannot reach the mirror") as info:
        debian.prepare(cache, SPEC, sources=tmp_path / "x.sources")
    assert info.value.code == "rootfs.build_failed" and info.value.retryable
    assert [p.name for p in cache.iterdir()] == [".lock"]
    assert debian.find(cache, SPEC) is None


def test_a_crashed_builds_leftovers_are_removed(fake: Path, tmp_path: Path) -> None:
    """A .build-* directory (a build killed half-way) is removed by the next build."""
    cache = tmp_path / "cache"
    (cache / ".build-dead-1" / "fs").mkdir(parents=True)
    debian.prepare(cache, SPEC, sources=tmp_path / "x.sources")
    assert not list(cache.glob(".build-*"))


def test_the_key_changes_with_the_package_set() -> None:
    """Another package set or suite is another tree (never a stale one reused)."""
    more = debian.BaseSpec(suite="bookworm", packages=(*debian.DEFAULT_PACKAGES, "npm"))
    assert len({SPEC.key(), more.key(), debian.BaseSpec(suite="trixie").key()}) == 3


def test_check_names_what_the_holder_would_miss(tmp_path: Path) -> None:
    """A base without umount or /etc/hosts is refused, naming both."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    for tool in ("sh", "sleep"):
        (tmp_path / "bin" / tool).write_text("")
        (tmp_path / "bin" / tool).chmod(0o755)
    for name in ("passwd", "group"):
        (tmp_path / "etc" / name).write_text("")
    with pytest.raises(debian.RootfsInvalid, match=r"/etc/hosts, umount") as info:
        debian.check(tmp_path)
    assert info.value.code == "rootfs.invalid"


def test_host_suite_reads_the_codename(tmp_path: Path) -> None:
    """The suite is the host's VERSION_CODENAME; a host without one cannot build."""
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian GNU/Linux"\nVERSION_CODENAME=bookworm\n')
    assert debian.host_suite(release) == "bookworm"
    release.write_text('NAME="Something"\n')
    with pytest.raises(debian.RootfsUnavailable, match="VERSION_CODENAME"):
        debian.host_suite(release)


def test_settings_take_an_absolute_default_rootfs() -> None:
    """SANDPOD_DEFAULT_ROOTFS: unset is None, a path is taken, a relative one is refused."""
    assert LifecycleSettings.from_env({}).default_rootfs is None
    got = LifecycleSettings.from_env({"SANDPOD_DEFAULT_ROOTFS": "/srv/base"}).default_rootfs
    assert got == Path("/srv/base")
    with pytest.raises(ValueError, match="SANDPOD_DEFAULT_ROOTFS"):
        LifecycleSettings.from_env({"SANDPOD_DEFAULT_ROOTFS": "base"})


def _driver(default: Path | None) -> LocalDriver:
    return LocalDriver(None, None, default)  # type: ignore[arg-type]  # _base uses neither


def test_a_templates_base(fake: Path, tmp_path: Path) -> None:
    """rootfs: / is the host root, another rootfs that directory, none the default base; no
    default base (or an unusable one) is NoDefaultRootfs saying how to prepare one."""
    base = debian.prepare(tmp_path / "c", SPEC, sources=tmp_path / "x.sources").fs
    assert _driver(base)._base(SandboxTemplateSpec(rootfs="/")) == Path("/")
    assert _driver(base)._base(SandboxTemplateSpec(rootfs="/srv/t")) == Path("/srv/t")
    assert _driver(base)._base(SandboxTemplateSpec()) == base
    assert _driver(base)._base(SandboxTemplateSpec(image="python:3.12-slim")) == base
    with pytest.raises(NoDefaultRootfs, match="sandpod up"):
        _driver(None)._base(SandboxTemplateSpec())
    with pytest.raises(NoDefaultRootfs, match="unusable"):
        _driver(tmp_path / "missing")._base(SandboxTemplateSpec())


async def test_stopping_sandpod_up_during_the_build_stops_mmdebstrap(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while mmdebstrap runs (a long build: it blocks until killed), the build is
    terminated at once and nothing is left in the cache."""
    monkeypatch.setenv("HANG", "1")
    started = asyncio.Event()
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if "downloading" in line:
            started.set()

    monkeypatch.setattr(debian, "host_suite", lambda: "bookworm")
    monkeypatch.setattr(debian, "host_sources", lambda: tmp_path / "x.sources")
    task = asyncio.ensure_future(_baseroot.ensure(tmp_path, None, progress))
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert [p.name for p in (tmp_path / "rootfs").iterdir()] == [".lock"]
    assert any("first run only" in line for line in lines)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root: run as root")
def test_a_stopped_builds_mounts_are_detached_never_deleted_through(tmp_path: Path) -> None:
    """A tree with a mount below it (what a stopped mmdebstrap leaves): the mount is detached
    first, so the removal never reaches the mounted filesystem's files."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the build's")
    inside = tmp_path / "build" / "fs" / "dev"
    inside.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(outside), str(inside)], check=True)
    try:
        assert mmdebstrap.mounts_below(tmp_path / "build") == [str(inside)]
        assert mmdebstrap.discard(tmp_path / "build") == []
    finally:
        subprocess.run(["umount", "--lazy", str(inside)], check=False, capture_output=True)
    assert not (tmp_path / "build").exists()
    assert (outside / "keep").read_text() == "not the build's"
