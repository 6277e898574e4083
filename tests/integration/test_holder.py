"""The holder script (``runtime/holder.sh``) on bases whose top-level names are awkward.

Rootless, a base with mounts below it cannot be one overlay's lower layer: the holder walks the
base's top-level entries and layers each on its own. This builds real holders (``launch``, as
the driver does) in a user namespace over such a base and checks what each entry became: names
with spaces, a leading dash or a newline are neither split into other names nor passed to a tool
as an option. Needs root (to bind-mount the base's ``/usr`` and ``/etc`` and map uids); the user
namespace makes the holder take the rootless path exactly as an unprivileged driver's would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandpod_lifecycle.runtime import hostcaps
from sandpod_lifecycle.runtime.holder import HolderLayout, launch, wait_exit

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="building a holder needs root: run the integration tests as root"
)

MiB = 1024 * 1024
BOUND = ("usr", "etc")


@contextlib.contextmanager
def _base(tmp_path: Path) -> Iterator[Path]:
    """A base with the host's /usr and /etc bind-mounted below it (so no single overlay can
    cover it; ``umount`` needs /etc) and awkward
    top-level names: ``a b``, `` lead``, ``new<newline>line`` (directories), ``-dash`` and
    ``--`` (directories holding a file), ``-link`` (a link to ``-target``)."""
    base = tmp_path / "base"
    for bound in BOUND:
        (base / bound).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{link}"):
            (base / link).symlink_to(os.readlink(f"/{link}"))
    for name in ("a b", " lead", "new\nline", "-dash", "--"):
        (base / name).mkdir()
    (base / "-dash" / "file").write_text("dash")
    (base / "--" / "file").write_text("dashdash")
    (base / "-link").symlink_to("-target")
    mounted: list[Path] = []
    try:
        for bound in BOUND:
            subprocess.run(["mount", "--bind", f"/{bound}", str(base / bound)], check=True)
            mounted.append(base / bound)
        yield base
    finally:
        for path in mounted:
            subprocess.run(["umount", str(path)], check=True)


@contextlib.asynccontextmanager
async def _holder(tmp_path: Path, base: Path) -> AsyncIterator[tuple[int, list[str]]]:
    """(the holder's host pid, the skipped names it reported), killed and reaped after."""
    dirs = {n: tmp_path / n for n in ("upper", "work", "root", "workspace")}
    for d in dirs.values():
        d.mkdir()
    layout = HolderLayout(
        sandbox_id="awkward",
        base=base,
        upper=dirs["upper"],
        work=dirs["work"],
        root=dirs["root"],
        workspace=dirs["workspace"],
        tmp_bytes=16 * MiB,
        shm_bytes=16 * MiB,
        uid=200_000,
        gid=200_000,
        masks=(),
        log=tmp_path / "holder.log",
        rootless=True,
    )
    tools = {"sh": shutil.which("sh"), "unshare": shutil.which("unshare")}
    popen, holder, skipped = await launch(layout, tools, [], hostcaps.PATH, 30.0)
    try:
        yield holder, skipped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGKILL)  # pid 1 of its namespace: takes the rest with it
        assert await wait_exit(popen, 30.0), "the holder's launcher did not exit"


async def test_awkward_top_level_names_are_layered_or_reported_whole(tmp_path: Path) -> None:
    """Rootless layering walks the base by glob: ``-dash`` and ``--`` are layered (their files
    visible), ``-link`` is the same link, and each name it cannot layer (a space, a newline) is
    reported once, whole (unsafe characters as ``?``), never split into other names."""
    with _base(tmp_path) as base:
        async with _holder(tmp_path, base) as (holder, skipped):
            root = Path(f"/proc/{holder}/root")
            assert sorted(skipped) == sorted(["/a?b", "/?lead", "/new?line"])
            assert (root / "-dash" / "file").read_text() == "dash"
            assert (root / "--" / "file").read_text() == "dashdash"
            assert os.readlink(root / "-link") == "-target"
            assert (root / "usr" / "bin" / "sh").exists()
            for piece in ("a", "b", "lead", "new", "line"):  # what splitting would have made
                assert not os.path.lexists(root / piece), piece
