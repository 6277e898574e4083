"""The trust files of a running jail, rewritten through its root (``runtime/jailtrust.py``).

The root here is a directory (in a real jail it is ``/proc/<holder>/root``; the integration
test ``test_net_inject_runtime`` covers that). The attacks are what a sandbox user who can write
its own ``/etc`` would plant: symlinks out of its root (absolute, and ``..`` past it), a FIFO
where the bundle was. The host's files outside the root must never change.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandpod_lifecycle.network.trust import EXTRA_PEM, merge_bundle
from sandpod_lifecycle.runtime.jailtrust import rewrite_trust
from sandpod_service.openat2 import openat2_available

pytestmark = pytest.mark.skipif(
    not openat2_available(), reason="needs openat2 (Linux >= 5.6), as the local runtime does"
)

IMAGE = "-----BEGIN CERTIFICATE-----\nimage root\n-----END CERTIFICATE-----\n"
PEM = "-----BEGIN CERTIFICATE-----\nsandpod authority\n-----END CERTIFICATE-----\n"
BUNDLE = "etc/ssl/certs/ca-certificates.crt"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Path, Path, int]]:
    """(the jail's root, the host's directory beside it, an O_PATH descriptor of the root)."""
    jail, host = tmp_path / "jail", tmp_path / "host"
    for top in (jail, host):
        (top / "etc/ssl/certs").mkdir(parents=True)
        (top / BUNDLE).write_text(IMAGE)
    (host / EXTRA_PEM.lstrip("/")).write_text("host's own\n")
    fd = os.open(jail, os.O_PATH | os.O_DIRECTORY)
    yield jail, host, fd
    os.close(fd)


def test_the_bundle_block_and_the_extra_file_follow_the_injections(
    world: tuple[Path, Path, int],
) -> None:
    jail, _, root = world
    (jail / EXTRA_PEM.lstrip("/")).write_text("")
    assert rewrite_trust(root, PEM) == ["/" + BUNDLE, EXTRA_PEM]
    assert (jail / BUNDLE).read_text() == merge_bundle(IMAGE, PEM)
    assert (jail / EXTRA_PEM.lstrip("/")).read_text() == PEM
    assert oct((jail / BUNDLE).stat().st_mode & 0o777) == "0o644"
    assert rewrite_trust(root, "") == ["/" + BUNDLE, EXTRA_PEM]  # the injection removed
    assert (jail / BUNDLE).read_text() == IMAGE
    assert (jail / EXTRA_PEM.lstrip("/")).read_text() == ""
    assert sorted(p.name for p in (jail / "etc/ssl/certs").iterdir()) == [
        "ca-certificates.crt",
        "sandpod-egress.pem",
    ]  # no temporary file left behind


def test_a_parent_symlinked_past_the_root_stays_inside_it(world: tuple[Path, Path, int]) -> None:
    """``/etc`` -> ``../host/etc`` (and an absolute twin): resolved in the jail, where neither
    leads anywhere; the host's bundle and extra file keep their bytes."""
    jail, host, root = world
    shutil.rmtree(jail / "etc/ssl")
    (jail / "etc/ssl").symlink_to(os.path.relpath(host / "etc/ssl", jail / "etc"))
    assert rewrite_trust(root, PEM) == []
    (jail / "etc/ssl").unlink()
    (jail / "etc/ssl").symlink_to(host / "etc/ssl")  # absolute: restarts at the jail's root
    assert rewrite_trust(root, PEM) == []
    assert (host / BUNDLE).read_text() == IMAGE
    assert (host / EXTRA_PEM.lstrip("/")).read_text() == "host's own\n"


def test_files_replaced_by_links_or_fifos_are_replaced_never_followed(
    world: tuple[Path, Path, int],
) -> None:
    """The extra file a symlink to a host file: the link is replaced, the host file kept. The
    bundle a symlink to a host path: read as the jail resolves it (nothing there), skipped. A
    FIFO: skipped without blocking."""
    jail, host, root = world
    extra = jail / EXTRA_PEM.lstrip("/")
    extra.symlink_to(host / EXTRA_PEM.lstrip("/"))
    (jail / BUNDLE).unlink()
    (jail / BUNDLE).symlink_to(host / BUNDLE)
    assert rewrite_trust(root, PEM) == [EXTRA_PEM]
    assert not extra.is_symlink() and extra.read_text() == PEM
    assert (host / EXTRA_PEM.lstrip("/")).read_text() == "host's own\n"
    assert (host / BUNDLE).read_text() == IMAGE
    (jail / BUNDLE).unlink()
    os.mkfifo(jail / BUNDLE)
    assert rewrite_trust(root, PEM) == [EXTRA_PEM]
