"""``make images``: Sandpod's own images built without Docker, as OCI layouts in ``build/images``.

Each image is a directory ``build/images/<name>`` (an OCI image layout, tag ``--tag``) that
``skopeo copy oci:build/images/<name>:<tag> docker://<registry>/<name>:<tag>`` pushes and any
OCI runtime reads. The Dockerfiles in ``deploy/images/`` stay for those who build with Docker.

- ``sandpod-execd``: scratch plus one layer, ``/sandpod-bundle``: a relocatable CPython
  (``--python-home``; by default uv's managed 3.11) and what ``deploy/images/build-execd-bundle.sh``
  installs (the same script execd.Dockerfile and tests/integration/test_execd_bundle.py run).
  Its default command copies the bundle into ``/opt/sandpod`` with a static ``/bin/cp`` (Debian's
  ``busybox-static``), as the Dockerfile's busybox ``cp -a`` does: the Pod runtime's init
  container runs exactly that, and the bundle's interpreter cannot start on scratch (no libc).
- ``sandpod-lifecycle``, ``sandpod-pool``, ``sandpod-gateway``: ``sandpod-base`` (the same
  layer blob) plus one layer, ``/opt/sandpod/site``: the service and its locked dependencies
  installed by uv for the base's python3.11 (the host's Debian one: same suite, same ABI), and
  for the gateway the web terminal's files in ``/opt/sandpod-web``; run as 10001:10001 with
  ``python3 -m sandpod_<service>``, as the services' Dockerfiles do.
- ``sandpod-base``: the default sandbox root filesystem as one layer: the local runtime's
  default base itself (``sandpod_image.debian``: a Debian tree from ``mmdebstrap``, cached in
  ``--cache``, the same directory the test suite uses, so it is built once per machine), or
  ``--base-rootfs DIR``, a tree already built.

Data flow: staging directory or tarball -> ``OciLayout.add_layer``/``add_tar`` (pack, compress,
digest) -> config + manifest + index. Run from the repository root:
``python -m sandpod_image.makeimages [--only execd,base] [--out build/images]``.

Pushing: with ``--push REGISTRY`` (default ``$SANDPOD_IMAGE_REGISTRY``, ``host[:port]/prefix``)
each layout written is pushed as ``<REGISTRY>/<name>:<tag>`` by ``sandpod_image.pushlayout``
(blobs verified against their digests, those the registry has skipped; one line per blob), with
the credentials of the Docker ``config.json`` (``--auth-file``, else ``$DOCKER_CONFIG`` / the
default one) and plain HTTP only to loopback or a host in ``$SANDPOD_INSECURE_REGISTRIES``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sandpod_contract.errors import SandpodError
from sandpod_image import debian
from sandpod_image.auth import default_auth_path, load_auth_file
from sandpod_image.layers import PackResult
from sandpod_image.nodeimages import NodeImageFailed, host_python_home, nats_image, pause_image
from sandpod_image.ocilayout import HistoryEntry, ImageConfig, OciLayout
from sandpod_image.pushlayout import PushProgress, push_layout

__all__ = [
    "SERVICES",
    "BaseLayer",
    "Build",
    "MakeImagesFailed",
    "base_image",
    "execd_image",
    "main",
    "push_images",
    "service_image",
]

BUNDLE: Final = "sandpod-bundle"
ROOT_OWNER: Final = (0, 0)
_PATH: Final = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# As the services' Dockerfiles set them, the venv's bin replaced by PYTHONPATH on the site dir.
_SERVICE_ENV: Final = (
    _PATH,
    "PYTHONPATH=/opt/sandpod/site",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
    "HOME=/tmp",
    "SANDPOD_STATE_DIR=/tmp/state",
)
_GATEWAY_ENV: Final = (
    "SANDPOD_GATEWAY_HOST=0.0.0.0",
    "SANDPOD_GATEWAY_PORT=8080",
    "SANDPOD_GATEWAY_WEB_DIR=/opt/sandpod-web",
)
SERVICES: Final = ("lifecycle", "pool", "gateway")


class MakeImagesFailed(Exception):
    """A step of an image build failed; the message says which and how to fix it."""


@dataclass(frozen=True, slots=True)
class Build:
    """Where a build reads and writes.

    Attributes:
        repo: the repository root (``deploy/images`` and ``uv.lock`` are read from it).
        out: the directory of the layouts (``build/images``).
        cache: where the Debian base tree is kept between builds (``sandpod_image.debian``).
        tag: the layouts' ref name.
        uv: how to run uv (an argv prefix).
        compress: the layers' compression (``gzip``, ``zstd``, ``none``).
    """

    repo: Path
    out: Path
    cache: Path
    tag: str
    uv: tuple[str, ...]
    compress: str = "gzip"


def _run(argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise MakeImagesFailed(f"cannot run {argv[0]}: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise MakeImagesFailed(f"{shlex.join(argv)} exited with {done.returncode}:\n{tail}")
    return done.stdout


def managed_python(build: Build) -> Path:
    """uv's standalone CPython 3.11 (installed if missing): relocatable, unlike the host's."""
    _run([*build.uv, "python", "install", "3.11"])
    exe = Path(_run([*build.uv, "python", "find", "--managed-python", "3.11"]).strip())
    return exe.resolve().parent.parent


def execd_image(build: Build, python_home: Path) -> Path:
    """Build ``sandpod-execd``: the bundle on scratch. Returns the layout directory."""
    with tempfile.TemporaryDirectory(prefix="sandpod-execd-") as tmp:
        bundle = Path(tmp) / BUNDLE
        # The interpreter without whatever was pip-installed into it on this machine.
        shutil.copytree(
            python_home,
            bundle / "python",
            symlinks=True,
            ignore=shutil.ignore_patterns("site-packages", "__pycache__", "test", "tests"),
        )
        env = {**os.environ, "UV": shlex.join(build.uv)}
        script = build.repo / "deploy/images/build-execd-bundle.sh"
        _run(
            ["bash", str(script), str(bundle / "python/bin/python3"), str(bundle)],
            cwd=build.repo,
            env=env,
        )
        # A static busybox as /bin/cp: the Pod runtime's init container runs `cp -a` (scratch has
        # no libc for the bundle's own interpreter to start from). Debian's busybox-static.
        busybox = Path(tmp) / "bin" / "busybox"
        busybox.parent.mkdir()
        shutil.copy2(_static_busybox(), busybox)
        (busybox.parent / "cp").symlink_to("busybox")
        layout = OciLayout(build.out / "sandpod-execd")
        layout.add_layer(
            Path(tmp), created_by="build-execd-bundle.sh", owner=ROOT_OWNER, compress=build.compress
        )
    config = ImageConfig(
        user="65532:65532",
        cmd=("/bin/cp", "-a", f"/{BUNDLE}/.", "/opt/sandpod/"),
        labels={"org.opencontainers.image.title": "sandpod-execd"},
    )
    layout.write_image(config, ref=build.tag)
    return layout.root


def _static_busybox() -> Path:
    path = Path("/bin/busybox")
    if not path.is_file():
        raise MakeImagesFailed("/bin/busybox missing: apt-get install busybox-static")
    return path


@dataclass(frozen=True, slots=True)
class BaseLayer:
    """The base image's one layer, for the service images stacked on it."""

    layout: Path
    packed: PackResult
    history: HistoryEntry

    @property
    def blob(self) -> Path:
        return self.layout / "blobs/sha256" / self.packed.digest.removeprefix("sha256:")


def base_image(build: Build, rootfs: Path | None) -> BaseLayer:
    """Build ``sandpod-base``, the default sandbox root filesystem."""
    layout = OciLayout(build.out / "sandpod-base")
    if rootfs is not None:
        history = HistoryEntry(f"rootfs {rootfs.name}")
        packed = layout.add_layer(rootfs, created_by=history.created_by, compress=build.compress)
    else:  # the same tree as the local runtime's default base, built once per machine
        try:
            prepared = debian.prepare(build.cache, progress=lambda line: print(line, flush=True))
        except debian.RootfsError as exc:
            raise MakeImagesFailed(f"the Debian base: {exc}") from exc
        history = HistoryEntry(f"sandpod_image.debian {prepared.fs.parent.name}")
        packed = layout.add_layer(
            prepared.fs, created_by=history.created_by, compress=build.compress
        )
    config = ImageConfig(
        env=(_PATH, "LANG=C.UTF-8"),
        cmd=("/bin/bash",),
        labels={"org.opencontainers.image.title": "sandpod-base"},
    )
    layout.write_image(config, ref=build.tag)
    return BaseLayer(layout.root, packed, history)


def service_image(build: Build, base: BaseLayer, service: str, python: Path) -> Path:
    """Build ``sandpod-<service>``: the base plus a layer of the service's locked packages.

    ``python`` is the interpreter the packages are installed for: the base's own python3.11
    (the host's Debian one, same suite), so compiled extensions match it.
    """
    layout = OciLayout(build.out / f"sandpod-{service}")
    layout.adopt(base.blob, base.packed, base.history)
    with tempfile.TemporaryDirectory(prefix=f"sandpod-{service}-") as tmp:
        env = _stage_service(build, service, python, Path(tmp))
        layout.add_layer(
            Path(tmp),
            created_by=f"uv pip install sandpod-{service}",
            owner=ROOT_OWNER,
            compress=build.compress,
        )
    config = ImageConfig(
        env=env,
        user="10001:10001",
        cmd=("python3", "-m", f"sandpod_{service}"),
        labels={"org.opencontainers.image.title": f"sandpod-{service}"},
    )
    layout.write_image(config, ref=build.tag)
    return layout.root


def _stage_service(build: Build, service: str, python: Path, stage: Path) -> tuple[str, ...]:
    """Install the service's locked packages under ``stage``; returns the image's Env."""
    site = stage / "opt/sandpod/site"
    req = stage / "requirements.txt"
    export = ["export", "--quiet", "--locked", "--no-dev", "--no-editable", "--no-hashes"]
    _run([*build.uv, *export, "--package", f"sandpod-{service}", "-o", str(req)], cwd=build.repo)
    install = ["pip", "install", "--quiet", "--python", str(python), "--no-deps"]
    # uv reuses a wheel it built from a local directory until that directory's pyproject.toml
    # changes: an edited module would ship stale (the node tests ran old builder code). The
    # workspace's own packages are rebuilt every time; the locked ones come from the cache.
    for line in req.read_text().splitlines():
        if line.startswith("./"):
            pyproject = tomllib.loads((build.repo / line / "pyproject.toml").read_text())
            install += ["--refresh-package", str(pyproject["project"]["name"])]
    _run([*build.uv, *install, "--target", str(site), "-r", str(req)], cwd=build.repo)
    req.unlink()
    shutil.rmtree(site / "bin", ignore_errors=True)  # absolute shebangs: python3 -m instead
    if service != "gateway":
        return _SERVICE_ENV
    _stage_web(build.repo, stage / "opt/sandpod-web")
    _stage_front(build.repo, stage / "usr/local/bin")
    return _SERVICE_ENV + _GATEWAY_ENV


def _stage_front(repo: Path, dest: Path) -> None:
    """The gateway's native preview front (``make install`` builds it; the gateway finds it on
    PATH). Without it the image's gateway relays previews in Python, as it says at start."""
    front = repo / ".venv/bin/sandpod-front"
    if not front.is_file():
        print(f"note: {front} missing (no cargo at make install): the gateway image has no front")
        return
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(front, dest / "sandpod-front")


def _stage_web(repo: Path, dest: Path) -> None:
    web = repo / "services/gateway/src/sandpod_gateway/web"
    if not (web / "node_modules").is_dir():
        raise MakeImagesFailed(f"{web}/node_modules missing: run `make web` (npm ci) first")
    shutil.copytree(web, dest, symlinks=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandpod_image.makeimages", description=__doc__)
    parser.add_argument(
        "--only",
        default="execd,base,services",
        help="comma-separated: execd, base, services (lifecycle, pool and gateway on the base), "
        "node (sandpod-pause and sandpod-nats, for a Kubernetes node: make cluster)",
    )
    parser.add_argument(
        "--service-python",
        type=Path,
        default=Path("/usr/bin/python3.11"),
        help="the base's interpreter on this host (Debian's, same suite) to install for",
    )
    parser.add_argument("--out", type=Path, default=Path("build/images"))
    parser.add_argument("--repo", type=Path, default=Path.cwd())
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/sandpod/rootfs")
    parser.add_argument("--tag", default="latest")
    parser.add_argument("--compress", default="gzip", choices=("gzip", "zstd", "none"))
    parser.add_argument(
        "--python-home",
        help="a relocatable CPython for the bundle, or 'host': Debian's python3.11, for Debian 12 "
        "based sandbox images only (when uv's standalone CPython cannot be downloaded)",
    )
    parser.add_argument("--base-rootfs", type=Path, help="pack this tree instead of mmdebstrap")
    parser.add_argument(
        "--push",
        default=os.environ.get("SANDPOD_IMAGE_REGISTRY", ""),
        metavar="REGISTRY",
        help="push each image to REGISTRY/<name>:<tag> (default: $SANDPOD_IMAGE_REGISTRY)",
    )
    parser.add_argument("--auth-file", type=Path, help="registry credentials (config.json)")
    return parser


def _say(name: str) -> Callable[[PushProgress], None]:
    def say(p: PushProgress) -> None:
        what = "exists, skipped" if p.skipped else "pushed"
        print(f"  {name}: {p.kind} {p.digest[:19]}… {p.size / 1e6:.1f} MB {what}", flush=True)

    return say


def push_images(
    layouts: Sequence[Path], registry: str, tag: str, *, auth_file: Path | None = None
) -> list[str]:
    """Push each layout's image ``tag`` to ``<registry>/<layout name>:<tag>``.

    Returns:
        The pushed references, by digest.

    Raises:
        MakeImagesFailed: a layout, the credentials or the registry failed (the message says).
    """
    insecure = frozenset(
        h.strip() for h in os.environ.get("SANDPOD_INSECURE_REGISTRIES", "").split(",") if h
    )
    path = auth_file or default_auth_path()
    pushed: list[str] = []
    try:
        auth = load_auth_file(path) if path is not None else None
        for layout in layouts:
            target = f"{registry.rstrip('/')}/{layout.name}:{tag}"
            print(f"push {layout}:{tag} -> {target}", flush=True)
            image = asyncio.run(
                push_layout(
                    layout,
                    tag,
                    target,
                    auth_file=auth,
                    insecure=insecure,
                    progress=_say(layout.name),
                )
            )
            print(f"{layout.name}: {image.reference}", flush=True)
            pushed.append(image.reference)
    except SandpodError as exc:
        raise MakeImagesFailed(f"push to {registry}: [{exc.code}] {exc.message}") from exc
    return pushed


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    uv = tuple(shlex.split(os.environ.get("UV", ""))) or (sys.executable, "-m", "uv")
    if not os.environ.get("UV") and shutil.which("uv"):
        uv = ("uv",)
    build = Build(
        repo=args.repo, out=args.out, cache=args.cache, tag=args.tag, uv=uv, compress=args.compress
    )
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = wanted - {"execd", "base", "services", "node"}
    if unknown:
        print(f"unknown image(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    written: list[Path] = []
    try:
        if "execd" in wanted:
            if args.python_home == "host":
                with tempfile.TemporaryDirectory(prefix="sandpod-python-") as tmp:
                    written.append(execd_image(build, host_python_home(Path(tmp) / "python")))
            else:
                home = Path(args.python_home) if args.python_home else managed_python(build)
                written.append(execd_image(build, home))
            print(f"sandpod-execd: {written[-1]}:{build.tag}")
        if wanted & {"base", "services"}:
            base = base_image(build, args.base_rootfs)
            written.append(base.layout)
            print(f"sandpod-base: {base.layout}:{build.tag}")
        if "services" in wanted:
            if not args.service_python.exists():
                raise MakeImagesFailed(f"{args.service_python} missing: pass --service-python")
            for service in SERVICES:
                written.append(service_image(build, base, service, args.service_python))
                print(f"sandpod-{service}: {written[-1]}:{build.tag}")
        if "node" in wanted:
            written.append(pause_image(build.repo, build.out, build.tag, build.compress))
            written.append(nats_image(build.out, build.tag, build.compress))
            print(f"sandpod-pause, sandpod-nats: {build.out}:{build.tag}")
        if args.push:
            push_images(written, args.push, build.tag, auth_file=args.auth_file)
    except (MakeImagesFailed, NodeImageFailed) as exc:
        print(f"make images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
