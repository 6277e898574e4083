"""The trust bundle of a guarded Pod whose policy injects headers (``sandpod_kube.guardtrust``):
the init container's script and the guard's rewrite make the same file, the image's system
bundle first, then the guard's authorities; the script runs isolated from the image's Python
setup."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandpod_kube import guardtrust
from sandpod_kube.guardtrust import TRUST_SCRIPT, rebuild_bundle

IMAGE = b"-----BEGIN CERTIFICATE-----\nimage root\n-----END CERTIFICATE-----"  # no final \n
AUTHORITY = b"-----BEGIN CERTIFICATE-----\napi.example.test\n-----END CERTIFICATE-----\n"


def _script(trust: Path, *bundles: Path, env: dict[str, str] | None = None) -> None:
    argv = [sys.executable, "-I", "-S", "-c", TRUST_SCRIPT, str(trust), *map(str, bundles)]
    subprocess.run(argv, check=True, capture_output=True, env=env)


@pytest.mark.parametrize("guard_first", [True, False])
def test_the_init_container_and_the_guard_write_the_same_bundle(
    tmp_path: Path, guard_first: bool
) -> None:
    """The image's first bundle that exists, then the authorities; whoever writes last (the
    guard's first policy may land before or after the init container ran), the same bytes."""
    trust, image = tmp_path / "trust", tmp_path / "image"
    trust.mkdir()
    image.mkdir()
    (image / "ca-bundle.crt").write_bytes(IMAGE)
    (image / "cert.pem").write_bytes(b"a later candidate: never read\n")
    egress = trust / "egress.pem"
    if guard_first:
        egress.write_bytes(AUTHORITY)
        assert rebuild_bundle(egress) is False  # nothing of the image's yet: nothing written
        _script(trust, image / "ca-certificates.crt", image / "ca-bundle.crt", image / "cert.pem")
    else:
        _script(trust, image / "ca-certificates.crt", image / "ca-bundle.crt", image / "cert.pem")
        assert (trust / "merged" / "bundle.pem").read_bytes() == IMAGE + b"\n"  # none yet
        egress.write_bytes(AUTHORITY)
        assert rebuild_bundle(egress) is True
    merged = trust / "merged"
    written = (merged / "bundle.pem").read_bytes()
    assert written == IMAGE + b"\n" + AUTHORITY
    assert (merged / "image-bundle.pem").read_bytes() == IMAGE
    assert stat.S_IMODE((merged / "bundle.pem").stat().st_mode) == 0o644  # the sandbox reads it
    assert stat.S_IMODE(merged.stat().st_mode) == 0o777  # not sticky: the guard replaces files
    assert rebuild_bundle(egress) and (merged / "bundle.pem").read_bytes() == written
    egress.write_bytes(b"")  # the policy no longer injects: the image's bundle alone
    assert rebuild_bundle(egress) and (merged / "bundle.pem").read_bytes() == IMAGE + b"\n"
    assert sorted(p.name for p in merged.iterdir()) == ["bundle.pem", "image-bundle.pem"]


def test_an_image_without_a_system_bundle_gets_the_authorities_alone(tmp_path: Path) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "egress.pem").write_bytes(AUTHORITY)
    _script(trust, tmp_path / "missing.crt")
    assert (trust / "merged" / "bundle.pem").read_bytes() == AUTHORITY
    assert (trust / "merged" / "image-bundle.pem").read_bytes() == b""


def test_the_images_python_setup_never_runs_in_the_script(tmp_path: Path) -> None:
    """An image that plants ``sitecustomize`` on ``PYTHONPATH`` (or in its environment) gets
    none of it run: ``-I -S`` ignores both; without them the planted code would run."""
    trust, planted = tmp_path / "trust", tmp_path / "planted"
    trust.mkdir()
    planted.mkdir()
    ran = tmp_path / "ran"
    (planted / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    env = {**os.environ, "PYTHONPATH": str(planted)}
    _script(trust, tmp_path / "none", env=env)
    assert not ran.exists()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)  # the control
    assert ran.read_text() == "ran"


GUARD_REWRITE = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from guardtrust import rebuild_bundle
egress = Path(sys.argv[1])
egress.write_bytes(sys.argv[2].encode())
print(rebuild_bundle(egress))
"""
CONTROL = """
import os, sys
open(sys.argv[1] + ".new", "w").close()
try:
    os.replace(sys.argv[1] + ".new", sys.argv[1])
    print("replaced")
except PermissionError:
    print("refused")
"""


def _as(uid: int, *argv: str) -> str:
    def drop() -> None:
        os.setgid(uid)
        os.setuid(uid)

    # the system's Python: the venv's may sit where another uid cannot reach it
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    done = subprocess.run(
        [python, *argv], capture_output=True, text=True, preexec_fn=drop, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root (run as root, as CI does)")
def test_the_guard_rewrites_the_bundle_in_the_sticky_emptydir(tmp_path: Path) -> None:
    """As in the Pod: the emptyDir is sticky (1777), the init container writes as the sandbox's
    uid, the guard rewrites as another uid without CAP_FOWNER. The merged bundle is rewritten;
    the control: a file of the sandbox's uid directly in the sticky directory cannot be."""
    base = Path(tempfile.mkdtemp(prefix="sandpod-trust-", dir="/tmp"))
    try:
        base.chmod(0o755)
        trust = base / "trust"
        trust.mkdir()
        trust.chmod(0o1777)
        sandbox, guard = 65534, 65533
        (trust / "egress.pem").write_bytes(b"")
        os.chown(trust / "egress.pem", guard, guard)
        image = base / "ca.crt"
        image.write_bytes(IMAGE)
        _as(sandbox, "-I", "-S", "-c", TRUST_SCRIPT, str(trust), str(image))
        assert (trust / "merged" / "bundle.pem").stat().st_uid == sandbox
        module = base / "module"
        module.mkdir()
        shutil.copy(guardtrust.__file__, module / "guardtrust.py")  # stdlib only
        egress = str(trust / "egress.pem")
        assert _as(guard, "-c", GUARD_REWRITE, egress, AUTHORITY.decode(), str(module)) == "True"
        assert (trust / "merged" / "bundle.pem").read_bytes() == IMAGE + b"\n" + AUTHORITY
        (trust / "theirs").write_bytes(b"")
        os.chown(trust / "theirs", sandbox, sandbox)
        assert _as(guard, "-c", CONTROL, str(trust / "theirs")) == "refused"
    finally:
        shutil.rmtree(base)
