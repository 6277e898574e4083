"""A runnable image the tests build from the host's programs and push to a test registry.

The image-sandbox tests (as root in test_image_sandbox.py, rootless in test_rootless_image.py)
need an image a jail can run without reaching the internet: :func:`runnable_base` copies the
host's ``sh`` and coreutils with every library they load into a directory, :func:`tar_of` makes
that directory a layer, :func:`files_layer` a layer of a few entries (whiteouts and opaque
markers are entries like any other), and :func:`push` sends the layers with a config to the
registry, returning the reference. :func:`docker_config` writes the credentials file a pull
reads (``SANDPOD_IMAGE_AUTH_FILE``, ``--auth-file``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

from oci_images import image_of_tars, push_image
from registry import TestRegistry
from sandpod_image.auth import AuthConfig
from sandpod_image.registry import Registry

__all__ = ["TOOLS", "docker_config", "files_layer", "push", "runnable_base", "tar_of"]

TOOLS = ("sh", "sleep", "umount", "cat", "ls", "echo", "pwd", "stat", "id")


def runnable_base(root: Path) -> None:
    """A minimal root: the host's programs in TOOLS with every library they load, a file the
    app layers white out (``/etc/removed-by-app``) and a directory they make opaque
    (``/opt/old``, holding ``below``)."""
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, f"the host has no {tool}"
        real = Path(found).resolve()
        listed = subprocess.run(["ldd", str(real)], capture_output=True, text=True, check=False)
        libs = [Path(w) for line in listed.stdout.splitlines() for w in line.split()[:3]]
        for path in [real, *(p for p in libs if p.is_absolute() and p.exists())]:
            target = root / path.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(path, target)
        link = root / "bin" / tool
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(real)
    for d in ("etc", "tmp", "workspace", "proc", "dev", "run", "opt/old"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    (root / "etc/removed-by-app").write_text("whited out by the app layer\n")
    (root / "opt/old/below").write_text("hidden by the app layer's opaque marker\n")


def tar_of(root: Path) -> bytes:
    """The directory ``root`` as a layer tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buf.getvalue()


def files_layer(files: dict[str, bytes]) -> bytes:
    """A layer of regular files (a ``.wh.`` name is a whiteout, ``.wh..wh..opq`` an opaque
    marker: the OCI layer format's own encoding)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def push(
    registry: TestRegistry,
    repository: str,
    tag: str,
    layers: list[bytes],
    *,
    config: Mapping[str, object],
    work: Path,
    auth: AuthConfig,
) -> str:
    """Push an image of ``layers`` (bottom first) and ``config``: its reference."""
    image = image_of_tars(layers, config=dict(config))

    async def send() -> None:
        async with Registry(registry.host, auth=auth) as r:
            await push_image(r, repository, tag, image, work)

    asyncio.run(send())
    return f"{registry.host}/{repository}:{tag}"


def docker_config(path: Path, registry: TestRegistry, auth: AuthConfig) -> Path:
    """A Docker ``config.json`` at ``path`` with ``auth``'s credentials for ``registry``."""
    secret = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
    path.write_text(json.dumps({"auths": {registry.host: {"auth": secret}}}))
    return path
