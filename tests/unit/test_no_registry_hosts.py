"""No package registry's host name in the repository: tools come through the package managers.

`.ci/run`, the Makefile and the build scripts get Python packages through pip/uv, npm packages
through npm, Go modules (and the Go toolchain) through Go's module proxy configuration and Debian
packages through apt -- each manager's own configuration (a mirror, a proxy, an air-gapped
index) decides where they come from. A download URL written into a script bypasses that, so
this test reads every file git knows about (tracked, and new files not ignored) and fails if a
registry's host name appears.

The host names are written here reversed, never literally: this file is itself scanned (a
literal here would fail the test, and it would put the name into the repository). Read one with
``name[::-1]``.

Not scanned: ``uv.lock``. uv records every package's index URL in its lockfile and has no option
to leave it out (astral-sh/uv#6349, open); it is the package manager's own record, written by
``uv lock``, and ``uv sync`` still follows uv's index configuration for it. (The npm lockfiles are
scanned: npm can omit registry URLs, and ours do.)

Out of scope, deliberately: container image names (an image reference names its registry, e.g.
the project's own published images) and the Helm chart repository of the NATS dependency in
``deploy/helm/sandpod/Chart.yaml`` (a chart dependency must name its repository). Neither is a
tool a script downloads.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_SCANNED = frozenset({"uv.lock"})

# Reversed on purpose (see the module docstring): PyPI, npm, Go, Debian/Ubuntu, Rust crates, Maven,
# Docker Hub, GitHub release assets, RubyGems, NuGet, Helm's and Kubernetes' binary downloads,
# Node.js, Rust and uv's installers.
_REVERSED = (
    "gro.ipyp",
    "gro.detsohnohtyp",
    "gro.sjmpn.yrtsiger",
    "moc.gkpnray.yrtsiger",
    "gro.gnalog.yxorp",
    "gro.gnalog.mus",
    "ld/ved.og",
    "ld/gro.gnalog",
    "moc.elgoog.ld",
    "gro.naibed.bed",
    "gro.naibed.ytiruces",
    "moc.utnubu.evihcra",
    "oi.setarc",
    "gro.ehcapa.nevam.oper",
    "gro.nevam.1oper",
    "oi.rekcod.1-yrtsiger",
    "oi.rekcod.xedni",
    "moc.rekcod.buh",
    "/daolnwod/sesaeler/",
    "moc.tnetnocresubuhtig.stcejbo",
    "gro.smegybur",
    "gro.tegun.ipa",
    "hs.mleh.teg",
    "oi.s8k.ld",
    "tsid/gro.sjedon",
    "sr.putsur.hs",
    "gro.gnal-tsur.citats",
    "hs.lartsa",
)
HOSTS = tuple(name[::-1] for name in _REVERSED)


def files() -> Iterator[Path]:
    """Every file git tracks, plus new files it does not ignore (so a check before committing
    sees them too)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        path = ROOT / name
        if name not in NOT_SCANNED and path.is_file() and not path.is_symlink():
            yield path


def registry_hosts_in(path: Path) -> list[tuple[int, str]]:
    """(line number, host) for every registry host name in ``path``, case-insensitively."""
    text = path.read_bytes().decode("latin-1").lower()
    return [
        (number, host)
        for number, line in enumerate(text.splitlines(), 1)
        for host in HOSTS
        if host in line
    ]


def test_the_host_list_is_readable_host_names() -> None:
    """Each reversed entry reads as a host name (or a download path), so none is mistyped away."""
    assert all("." in host or host.startswith("/") for host in HOSTS)
    assert len(set(HOSTS)) == len(HOSTS)


def test_the_scan_finds_a_registry_host(tmp_path: Path) -> None:
    """A script with a download URL is caught (the check can fail), in any case."""
    script = tmp_path / "install.sh"
    script.write_text(f"curl -fsSL https://{HOSTS[0].upper()}/simple/uv/ | sh\n")
    assert registry_hosts_in(script) == [(1, HOSTS[0])]
    (tmp_path / "clean.sh").write_text("python3 -m pip install 'uv>=0.5,<1'\n")
    assert registry_hosts_in(tmp_path / "clean.sh") == []


def test_no_registry_host_name_in_the_repository() -> None:
    """No file in the repository names a package registry's host (tools come via the managers)."""
    scanned = list(files())
    assert any(p.name == "run" and p.parent.name == ".ci" for p in scanned), "git sees no files"
    found = [
        f"{path.relative_to(ROOT)}:{number}: {host}"
        for path in scanned
        for number, host in registry_hosts_in(path)
    ]
    assert not found, (
        "package registry host names (use the package manager instead):\n" + "\n".join(found)
    )
