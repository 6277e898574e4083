"""An image's layers as a jail's root: stacked, shared, never written, never a host path.

The local runtime stacks an image's unpacked layers (overlay-ready directories of the node's
image store) as the read-only lower layers of each sandbox's root, with the sandbox's own
writable layer on top. These tests build the layers themselves -- a minimal base made of the
host's ``sh``, ``sleep`` and coreutils with their libraries, and two layers over it with an
overlay whiteout and an opaque directory -- and check from inside and outside the jail that the
stack reads as one filesystem, that two sandboxes share the layers without seeing each other's
writes, and that the image's working directory, shell and environment are the defaults.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_jail import Make, make, ok, runtime, state  # noqa: F401 - fixtures used by name

from sandpod_lifecycle.runtime.base import CreateFailed

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)

TOOLS = ("sh", "sleep", "umount", "cat", "ls", "echo", "env", "pwd", "stat", "readlink")


def _copy_with_libraries(program: str, root: Path) -> None:
    """``program`` and every shared library it loads, at the same paths below ``root``."""
    found = shutil.which(program)
    assert found is not None, f"the host has no {program}"
    paths = [Path(found).resolve()]
    listed = subprocess.run(["ldd", str(paths[0])], capture_output=True, text=True, check=False)
    for line in listed.stdout.splitlines():
        parts = [p for p in line.split() if p.startswith("/")]
        if parts:
            paths.append(Path(parts[0]))
    for path in paths:
        target = root / path.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copy2(path, target)
    link = root / "bin" / program
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(paths[0])


@pytest.fixture(scope="module")
def layers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """Three layers, bottom first: a minimal base; files; a whiteout and an opaque directory."""
    top = Path("/var/tmp") / f"sandpod-layers-{os.getpid()}"
    base, files, changes = (top / n / "fs" for n in ("base", "files", "changes"))
    for d in (base, files, changes):
        d.mkdir(parents=True)
    for tool in TOOLS:
        _copy_with_libraries(tool, base)
    for name in ("usr/bin", "etc", "proc", "dev", "tmp", "run", "workspace"):
        (base / name).mkdir(parents=True, exist_ok=True)
    (base / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (base / "etc/group").write_text("root:x:0:\n")
    (base / "etc/hosts").write_text("127.0.0.1 localhost\n")
    (files / "data").mkdir()
    (files / "data/gone").write_text("whited out above\n")
    (files / "data/kept").write_text("kept\n")
    (files / "etc").mkdir()
    (files / "etc/conf").mkdir()
    (files / "etc/conf/old").write_text("hidden by an opaque directory above\n")
    (files / "app").mkdir()
    (files / "etc/motd").write_text("from the image\n")
    (changes / "data").mkdir()
    os.mknod(changes / "data/gone", 0o600 | 0o020000, os.makedev(0, 0))  # overlay whiteout
    (changes / "etc").mkdir()
    (changes / "etc/conf").mkdir()
    os.setxattr(changes / "etc/conf", "trusted.overlay.opaque", b"y")
    (changes / "etc/conf/new").write_text("new\n")
    for d in (base, files, changes):
        subprocess.run(["chmod", "-R", "a+rX", str(d)], check=True)
    # Writable by the sandbox's unprivileged uid: its writes copy these up into its own layer.
    (files / "etc/motd").chmod(0o666)
    (files / "data/kept").chmod(0o666)
    yield base, files, changes
    shutil.rmtree(top, ignore_errors=True)


async def test_layers_stack_as_one_root_with_whiteouts_and_opaque_dirs(
    make: Make, layers: tuple[Path, Path, Path]
) -> None:
    """Inside, the stack reads as one filesystem: a whiteout hides a lower file, an opaque
    directory hides the lower one's entries, and the host's own files are not there."""
    status = await make(layers=layers, image="test/layers@sha256:" + "a" * 64)
    assert (await ok(status, "ls /data")).split() == ["kept"]
    assert (await ok(status, "ls /etc/conf")).split() == ["new"]
    assert await ok(status, "cat /etc/motd") == "from the image\n"
    # Nothing of the host: its /usr/lib/python3, its /etc/os-release, this checkout.
    out = await ok(status, f"ls /usr/lib/python3 /etc/os-release {Path.cwd()} 2>&1; true")
    assert out.count("No such file") == 3, out


async def test_two_sandboxes_share_the_layers_and_never_write_them(
    make: Make, layers: tuple[Path, Path, Path]
) -> None:
    """A write inside goes to the sandbox's own upper layer: the layer directory and the other
    sandbox of the same image keep the image's file."""
    one = await make(layers=layers)
    two = await make(layers=layers)
    await ok(one, "echo changed > /etc/motd && echo new > /data/kept")
    assert await ok(one, "cat /etc/motd") == "changed\n"
    assert await ok(two, "cat /etc/motd /data/kept") == "from the image\nkept\n"
    assert (layers[1] / "etc/motd").read_text() == "from the image\n"
    assert one.upper_dir is not None and (one.upper_dir / "etc/motd").read_text() == "changed\n"
    # The same inode of the layer in both roots: shared, not copied per sandbox.
    inode = (await ok(one, "stat -c %i /app")).strip()
    assert inode == (await ok(two, "stat -c %i /app")).strip()


async def test_the_image_working_directory_shell_and_env_are_the_defaults(
    make: Make, layers: tuple[Path, Path, Path]
) -> None:
    """A command without a cwd starts in the image's WorkingDir, in the image's environment."""
    status = await make(layers=layers, workdir="/app", shell="/bin/sh", env={"FROM_IMAGE": "1"})
    assert await ok(status, "pwd") == "/app\n"
    assert await ok(status, "echo $FROM_IMAGE") == "1\n"
    assert await ok(status, "pwd", cwd="/workspace") == "/workspace\n"


async def test_a_missing_layer_directory_is_a_create_failure(
    make: Make, layers: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A layer that is not there (a store pruned under a create) fails the create, typed."""
    with pytest.raises(CreateFailed, match="is not a directory"):
        await make(layers=(*layers, tmp_path / "pruned" / "fs"))


async def test_an_image_with_more_layers_than_one_mount_takes_is_refused_clearly(
    make: Make, layers: tuple[Path, Path, Path]
) -> None:
    """overlayfs' options are one page: an image whose layer paths do not fit is refused with
    a message that says so, before anything is mounted."""
    many = tuple(layers[0] for _ in range(200))
    with pytest.raises(CreateFailed, match="does not fit one overlay mount"):
        await make(layers=many)
