"""``sandpod image pull|ls|rm|prune``: the node's image store, used directly (no service).

The store is ``<state dir>/images`` (``--state-dir``, else ``$SANDPOD_STATE_DIR``, else
``~/.local/state/sandpod``): the one every local sandbox's layers come from, so a pull here
makes later sandbox creates of that image start without the network. Pull progress goes to
stderr: a bar per layer on a terminal, a line per layer step otherwise; ``-o json`` prints the
result on stdout for programs. Every error says what to do next.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from sandpod.cli._output import add_output, dump, human_bytes, human_time
from sandpod.config import DEFAULT_STATE_DIR
from sandpod_contract.errors import (
    BadRequest,
    ImageAuthFailed,
    ImageDigestMismatch,
    ImageError,
    ImageInUse,
    ImageLayerRefused,
    ImageNotFound,
    ImageUnsupported,
    SandpodError,
)
from sandpod_image.auth import AuthFile, default_auth_path, load_auth_file
from sandpod_image.manifest import Platform
from sandpod_image.progress import Phase, PullProgress
from sandpod_image.store import ImageStore, ResolvedImage

__all__ = ["add_parsers"]

EXIT_ERROR = 125
_HINTS: tuple[tuple[type[SandpodError], str], ...] = (
    (
        ImageAuthFailed,
        "log in to the registry in a Docker config.json and pass --auth-file FILE "
        "(or set REGISTRY_AUTH_FILE or DOCKER_CONFIG)",
    ),
    (ImageNotFound, "check the name, tag and --platform; `sandpod image ls` lists what is here"),
    (
        ImageDigestMismatch,
        "the registry (or a proxy, or the file) served altered content and "
        "nothing was kept; retry, and report it to the registry's owner if it persists",
    ),
    (ImageInUse, "delete the sandboxes using it (`sandpod rm ID`), then remove it"),
    (ImageLayerRefused, "the image holds a hostile or oversized layer entry; do not use it"),
    (ImageUnsupported, "push the image again with a current tool (OCI or Docker v2 manifests)"),
    (ImageError, "retry; check that the registry is reachable and the disk has room"),
    (BadRequest, "see `sandpod image --help` for the reference forms"),
)


def add_parsers(sub: Any) -> None:
    image = sub.add_parser("image", help="images in this node's store: pull, ls, rm, prune")
    image.add_argument("--state-dir", help=f"state directory (default: {DEFAULT_STATE_DIR})")
    verbs = image.add_subparsers(dest="verb", required=True, metavar="VERB")
    pull = verbs.add_parser(
        "pull", help="pull an image (registry, oci:DIR[:TAG], docker-archive:FILE.tar[:NAME:TAG])"
    )
    pull.add_argument("reference", help="python:3.12-slim, ghcr.io/o/r:tag, host:5000/r@sha256:...")
    pull.add_argument("--platform", help="os/arch[/variant] (default: this machine's)")
    pull.add_argument(
        "--auth-file",
        help="a Docker config.json (default: $REGISTRY_AUTH_FILE, "
        "$DOCKER_CONFIG/config.json, ~/.docker/config.json)",
    )
    pull.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST",
        help="reach HOST over plain HTTP (loopback registries always are)",
    )
    add_output(pull, human=("plain",))
    ls = verbs.add_parser("ls", help="list the images in the store")
    add_output(ls)
    rm = verbs.add_parser("rm", help="forget images (their layers go at the next prune)")
    rm.add_argument("references", nargs="+")
    prune = verbs.add_parser("prune", help="delete layers and blobs no image or sandbox uses")
    add_output(prune, human=("plain",))
    image.set_defaults(run=_cmd)


def _cmd(a: argparse.Namespace) -> int:
    try:
        return int(_VERBS[a.verb](a, _store(a)))
    except SandpodError as exc:
        print(f"error: {exc}", file=sys.stderr)
        hint = next((h for cls, h in _HINTS if isinstance(exc, cls)), None)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted: nothing half-done was kept", file=sys.stderr)
        return 130


def _store(a: argparse.Namespace) -> ImageStore:
    state = a.state_dir or os.environ.get("SANDPOD_STATE_DIR") or DEFAULT_STATE_DIR
    auth_file: AuthFile | None = None
    if a.verb == "pull":
        path = Path(a.auth_file) if a.auth_file else default_auth_path()
        auth_file = load_auth_file(path) if path is not None else None
    insecure = frozenset(getattr(a, "insecure_registry", []))
    return ImageStore(Path(state).expanduser() / "images", auth_file=auth_file, insecure=insecure)


def _pull(a: argparse.Namespace, store: ImageStore) -> int:
    platform = Platform.parse(a.platform) if a.platform else None
    tty = sys.stderr.isatty() and a.output == "plain"
    view = _Bars(sys.stderr) if tty else _Lines(sys.stderr)
    image = asyncio.run(store.pull(a.reference, platform=platform, progress=view.update))
    view.close()
    if a.output != "plain":
        print(dump(_image_doc(image), a.output))
    else:
        print(
            f"{image.reference} {image.digest} ({human_bytes(image.size)}, "
            f"{len(image.layers)} layers)"
        )
    return 0


def _image_doc(image: ResolvedImage) -> dict[str, Any]:
    return {
        "reference": image.reference,
        "digest": image.digest,
        "index_digest": image.index_digest,
        "size": image.size,
        "layers": [str(p) for p in image.layers],
        "config": image.config,
    }


def _ls(a: argparse.Namespace, store: ImageStore) -> int:
    images = store.list()
    if a.output != "table":
        print(dump(images, a.output))
        return 0
    rows = [("REFERENCE", "DIGEST", "SIZE", "LAYERS", "PULLED", "USED BY")]
    for i in images:
        rows.append(
            (
                i.reference,
                i.digest[:19],
                human_bytes(i.size),
                str(i.layers),
                human_time(i.pulled_at),
                ",".join(i.holders) or "-",
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _rm(a: argparse.Namespace, store: ImageStore) -> int:
    for ref in a.references:
        store.remove(ref)
        print(f"removed {ref}")
    return 0


def _prune(a: argparse.Namespace, store: ImageStore) -> int:
    freed = store.prune()
    if a.output != "plain":
        print(dump({"reclaimed": freed}, a.output))
    else:
        print(f"reclaimed {human_bytes(freed)}")
    return 0


_VERBS = {"pull": _pull, "ls": _ls, "rm": _rm, "prune": _prune}


class _Lines:
    """One line per layer step (logs, CI): never a line per chunk."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.last: dict[str | None, Phase] = {}

    def update(self, p: PullProgress) -> None:
        if self.last.get(p.layer) is p.phase:
            return
        self.last[p.layer] = p.phase
        if p.layer is None:
            print(f"{p.reference}: {p.phase.value}", file=self.out, flush=True)
            return
        print(
            f"layer {p.index + 1}/{p.layers} {p.layer[7:19]} {p.phase.value} "
            f"{human_bytes(p.total)}",
            file=self.out,
            flush=True,
        )

    def close(self) -> None:
        return None


class _Bars:
    """A bar per layer, redrawn in place (a terminal)."""

    WIDTH = 30

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.rows: dict[str, PullProgress] = {}
        self.drawn = 0

    def update(self, p: PullProgress) -> None:
        if p.layer is None:
            return
        self.rows[p.layer] = p
        self._draw()

    def _draw(self) -> None:
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F")
        for p in sorted(self.rows.values(), key=lambda r: r.index):
            share = p.done / p.total if p.total else 1.0
            fill = int(self.WIDTH * min(share, 1.0))
            bar = "#" * fill + "-" * (self.WIDTH - fill)
            self.out.write(
                f"\x1b[2K{p.layer[7:19] if p.layer else ''} [{bar}] "
                f"{human_bytes(p.done)}/{human_bytes(p.total)} {p.phase.value}\n"
            )
        self.drawn = len(self.rows)
        self.out.flush()

    def close(self) -> None:
        return None
