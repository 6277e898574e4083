"""`sandpod cp` copies files into and out of a sandbox through the real CLI process."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Execd, NatsServer

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")


Cp = Callable[..., "subprocess.CompletedProcess[bytes]"]


@pytest.fixture
def cp(nats: NatsServer, shared_execd: Execd) -> Cp:
    """Run `sandpod cp ARGS` against the shared sandbox; stdout/stderr captured unless given."""

    def run(
        *args: str, data: bytes | None = None, stderr: int = subprocess.PIPE
    ) -> subprocess.CompletedProcess[bytes]:
        env = {**os.environ, "SANDPOD_NATS_URL": nats.url}
        return subprocess.run(
            [SANDPOD, "cp", *args],
            input=data,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            timeout=60,
        )

    return run


def test_cp_up_and_down_keeps_bytes_and_mode(cp: Cp, state_dir: Path, tmp_path: Path) -> None:
    """A local file copied in and back out is byte-identical and keeps its mode; a directory
    destination takes the file's name."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "tool.sh"
    src.write_bytes(b"#!/bin/sh\n\x00\xff binary tail\n")
    src.chmod(0o750)
    r = cp(str(src), f"shared:/workspace/{name}.sh")
    assert r.returncode == 0, r.stderr
    host = state_dir / "workspaces" / "shared" / f"{name}.sh"
    assert host.read_bytes() == src.read_bytes() and host.stat().st_mode & 0o777 == 0o750
    out = tmp_path / "down"
    out.mkdir()
    r = cp(f"shared:{name}.sh", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / f"{name}.sh").read_bytes() == src.read_bytes()
    assert (out / f"{name}.sh").stat().st_mode & 0o777 == 0o750


def test_cp_streams_stdin_and_stdout(cp: Cp, state_dir: Path) -> None:
    """`-` reads stdin into the sandbox and writes a sandbox file to stdout."""
    name = f"cli-{uuid.uuid4().hex[:8]}.bin"
    payload = os.urandom(1_500_000)
    r = cp("-", f"shared:/workspace/{name}", "-m", "600", data=payload)
    assert r.returncode == 0, r.stderr
    host = state_dir / "workspaces" / "shared" / name
    assert host.read_bytes() == payload and host.stat().st_mode & 0o777 == 0o600
    r = cp(f"shared:{name}", "-")
    assert r.returncode == 0 and r.stdout == payload


def test_cp_errors_are_typed_and_exit_codes_distinct(cp: Cp, tmp_path: Path) -> None:
    """A missing sandbox file exits 125 with its code; two local paths are a usage error."""
    r = cp("shared:/workspace/definitely-missing", str(tmp_path / "x"))
    assert r.returncode == 125 and b"error: [fs.not_found]" in r.stderr
    assert not (tmp_path / "x").exists() and list(tmp_path.iterdir()) == []
    r = cp(str(tmp_path), "also-local")
    assert r.returncode == 2 and b"exactly one" in r.stderr


def test_cp_shows_progress_on_a_terminal(cp: Cp, tmp_path: Path) -> None:
    """With stderr on a terminal, a large copy draws a progress line; without, it stays quiet."""
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(9 * 1024 * 1024))
    master, slave = os.openpty()
    try:
        r = cp(str(src), "shared:/workspace/progress.bin", stderr=slave)
        os.close(slave)
        seen = b""
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            seen += data
    finally:
        os.close(master)
    assert r.returncode == 0
    assert b"MiB/s" in seen and b"100.0%" in seen
    quiet = cp(str(src), "shared:/workspace/progress.bin")
    assert quiet.returncode == 0 and quiet.stderr == b""


def _tree(top: Path) -> dict[str, tuple[str, int, bytes | str]]:
    """Every entry under ``top``: kind, permission bits, content or link target."""
    out: dict[str, tuple[str, int, bytes | str]] = {}
    for p in sorted(top.rglob("*")):
        rel = str(p.relative_to(top))
        st = p.lstat()
        if p.is_symlink():
            out[rel] = ("link", 0, os.readlink(p))
        elif p.is_dir():
            out[rel] = ("dir", st.st_mode & 0o7777, b"")
        else:
            out[rel] = ("file", st.st_mode & 0o777, p.read_bytes())
    return out


def test_cp_r_copies_a_directory_both_ways(cp: Cp, tmp_path: Path) -> None:
    """``cp -r`` in and back out gives the same tree (files, modes, nested and empty directories,
    symlinks); into an existing directory the copy lands under the source's name, as cp does;
    ``-r sbx:dir -`` writes the tar stream itself."""
    name = f"tree-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "proj"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "pkg" / "mod.py").write_bytes(b"print('hi')\n" * 1000)
    (src / "run.sh").write_bytes(b"#!/bin/sh\necho run\n")
    (src / "run.sh").chmod(0o750)
    (src / "blob").write_bytes(os.urandom(3 * 1024 * 1024))
    (src / "pkg" / "sub" / "link").symlink_to("../mod.py")
    r = cp("-r", str(src), f"shared:/workspace/{name}")
    assert r.returncode == 0, r.stderr
    r = cp("-r", str(src), f"shared:/workspace/{name}")  # now it exists: goes under it
    assert r.returncode == 0, r.stderr
    back = tmp_path / "back"
    r = cp("-r", f"shared:/workspace/{name}", str(back))
    assert r.returncode == 0, r.stderr
    want = _tree(src)
    got = _tree(back)
    nested = {k[len("proj/") :]: v for k, v in got.items() if k.startswith("proj/")}
    assert nested == want
    assert {k: v for k, v in got.items() if k != "proj" and not k.startswith("proj/")} == want
    r = cp("-r", f"shared:/workspace/{name}/pkg", "-")
    assert r.returncode == 0, r.stderr
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tf:
        assert {"./mod.py", "./sub/link"} <= set(tf.getnames())
    r = cp(str(src), f"shared:/workspace/{name}-x")
    assert r.returncode == 2 and b"-r" in r.stderr  # a directory without -r says how
    # The sandbox side's error is what the user sees (not the unpacker's "empty file"), typed,
    # with no traceback; nothing is left where the copy would have gone.
    r = cp("-r", f"shared:/workspace/{name}-missing", str(tmp_path / "none"))
    assert r.returncode == 125 and b"fs.not_found" in r.stderr, r.stderr
    assert b"Traceback" not in r.stderr
    r = cp("-r", f"shared:/workspace/{name}/run.sh", str(tmp_path / "none2"))
    assert r.returncode == 125 and b"fs.not_a_directory" in r.stderr, r.stderr
    assert not (tmp_path / "none").exists() and not (tmp_path / "none2").exists()


async def test_cp_r_out_of_a_sandbox_refuses_a_hostile_stream(tmp_path: Path) -> None:
    """The sandbox is not trusted: a tar stream it sends (its ``tar`` can be anything) that
    climbs out, names an absolute path, hard-links out, writes through a symlink or carries a
    device is refused, and nothing lands outside the target; a symlink itself keeps its
    absolute target (``/etc/ssl/certs`` is made of them). With ``filter="fully_trusted"`` the
    climb writes ``victim``."""
    import io
    import tarfile

    from sandpod.cli.fs_cmd import _unpack_here

    outside = tmp_path / "victim"
    target = tmp_path / "a" / "b"
    cases: list[tuple[list[tuple[str, bytes, str]], bool]] = [
        ([("../../victim", tarfile.REGTYPE, "")], True),
        ([(str(outside), tarfile.REGTYPE, "")], False),  # the leading / is dropped: inside
        ([("hl", tarfile.LNKTYPE, str(outside))], True),
        ([("up", tarfile.SYMTYPE, str(tmp_path)), ("up/victim", tarfile.REGTYPE, "")], True),
        ([("mem", tarfile.CHRTYPE, "")], True),
        ([("cert.pem", tarfile.SYMTYPE, "/usr/share/ca-certificates/x.crt")], False),
    ]
    for members, refused in cases:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, kind, link in members:
                info = tarfile.TarInfo(name)
                info.type = kind
                info.linkname = link
                data = b"OWNED"
                info.size = len(data) if kind == tarfile.REGTYPE else 0
                tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        async def chunks(raw: bytes = buf.getvalue()):  # type: ignore[no-untyped-def]
            for i in range(0, len(raw), 512):
                yield raw[i : i + 512]

        if refused:
            with pytest.raises(tarfile.FilterError):
                await _unpack_here(chunks(), str(target))
        else:
            await _unpack_here(chunks(), str(target))
        assert not outside.exists(), members
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a"], members
    assert (target / str(outside).lstrip("/")).read_bytes() == b"OWNED"
    assert os.readlink(target / "cert.pem") == "/usr/share/ca-certificates/x.crt"
