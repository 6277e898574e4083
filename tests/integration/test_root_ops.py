"""``sandpod-jail-exec --root-ops``: the holder's root-building steps as system calls, in one
process (services/execd/native/root_ops.c).

Each test runs the helper in a mount namespace of its own (``unshare --mount``), as the holder
does, and looks at what it mounted with ``findmnt`` from inside that namespace. The protections
attacked: a bind remount never loosens a restriction the mount had (a classic ``MS_REMOUNT |
MS_BIND`` replaces all of them: a read-only, noexec source would come back writable and
executable), a masked directory shows nothing of what it hid, and a bad batch stops at once.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandpod_lifecycle.runtime import seccomp

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="mount namespaces need root: run the integration tests as root"
)


def _helper() -> str:
    helper = seccomp.helper()
    if helper is None:
        pytest.skip("sandpod-jail-exec is not built: run make install (needs a C compiler)")
    return helper


def _in_namespace(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` with ``args`` in a new mount namespace (private propagation)."""
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_bind_remount_keeps_every_restriction_the_source_had(tmp_path: Path) -> None:
    """A read-only, noexec source bound and remounted nosuid,nodev stays read-only and noexec."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    script = (
        'mount -t tmpfs -o ro,noexec,size=4k t "$2" && '
        '"$1" --root-ops mount "" "$2" "$3" bind "" mount "" "" "$3" remount,bind,nosuid,nodev "" '
        '&& findmnt -no OPTIONS "$3"'
    )
    done = _in_namespace(script, _helper(), str(src), str(dst))
    assert done.returncode == 0, done.stderr
    options = set(done.stdout.strip().split(","))
    assert {"ro", "noexec", "nosuid", "nodev"} <= options, options


def test_a_masked_directory_hides_its_files_and_a_missing_one_is_skipped(tmp_path: Path) -> None:
    """mask puts an empty read-only tmpfs over a directory; a path that is none is left alone."""
    secret = tmp_path / "state" / "secret"
    secret.parent.mkdir()
    secret.write_text("other sandboxes")
    script = (
        '"$1" --root-ops mask "$2" mask "$3" && '
        'test ! -e "$2/secret" && findmnt -no OPTIONS "$2" && ! touch "$2/x" 2>/dev/null'
    )
    done = _in_namespace(script, _helper(), str(secret.parent), str(tmp_path / "nothing"))
    assert done.returncode == 0, done.stderr
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(done.stdout.strip().split(","))
    assert secret.read_text() == "other sandboxes"  # hidden inside, untouched outside


@pytest.mark.parametrize(
    "ops",
    [["unmount", "/x"], ["mount", "tmpfs", "t"], ["mount", "tmpfs", "t", "/nonexistent", "", ""]],
)
def test_a_bad_batch_stops_with_125_and_says_why(ops: list[str]) -> None:
    """An unknown step, missing arguments or a failing mount end the batch: exit 125, a reason."""
    done = _in_namespace('h=$1; shift; "$h" --root-ops "$@"; echo "rc=$?"', _helper(), *ops)
    assert done.stdout.strip().endswith("rc=125"), done.stdout
    assert "sandpod-jail-exec:" in done.stderr
