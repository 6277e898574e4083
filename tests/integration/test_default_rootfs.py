"""A default sandbox sees nothing of the host: the attack, through a real lifecycle (local runtime).

Markers are planted on the host where sandbox code would look first (``/srv``, ``/opt``, ``/home``,
``/root``, ``/tmp``, ``/etc``, the checkout, the state dir); a sandbox created as a user would
(the SDK, no template) lists and reads for them, and for every top-level host directory the
Debian base does not have. Each must be absent. The same probe in a sandbox of a template with
``rootfs: /`` finds the markers -- the attack is real -- and its Isolated condition says so.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from conftest import NatsServer
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import SandpodError
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest
from svcprocs import ServiceProc

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)

CHECKOUT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0
# Where the host keeps what a sandbox must never see (each gets a marker file).
PLANT_DIRS = (Path("/srv"), Path("/opt"), Path("/home"), Path("/root"), Path("/tmp"), Path("/etc"))


class Platform:
    def __init__(self, nats: NatsServer, state: Path, **extra: str) -> None:
        self.url, self.prefix, self.state = nats.url, f"t{uuid.uuid4().hex[:8]}", state
        self.proc = ServiceProc(
            "sandpod_lifecycle",
            nats,
            state,
            self.prefix,
            "r0",
            SANDPOD_RUNTIME="local",
            SANDPOD_RESYNC="0.5",
            wrap=(),
            SANDPOD_DESTROY_ON_EXIT="true",  # stopping it destroys every jail it made
            **extra,
        )

    async def answering(self) -> None:
        end = time.monotonic() + DEADLINE
        while True:
            try:
                await AsyncSandbox.list(nats_url=self.url, prefix=self.prefix)
                return
            except SandpodError:
                if self.proc.proc.poll() is not None or time.monotonic() > end:
                    pytest.fail(f"lifecycle did not come up:\n{self.proc.tail()}")
                await asyncio.sleep(0.05)

    async def create(self, name: str, template: str | None = None) -> AsyncSandbox:
        return await AsyncSandbox.create(
            name=name, template=template, nats_url=self.url, prefix=self.prefix, wait=DEADLINE
        )

    async def template(self, name: str, spec: dict[str, object]) -> None:
        obj = {"kind": "SandboxTemplate", "metadata": {"name": name}, "spec": spec}
        async with await AsyncSandbox.connect("x", nats_url=self.url, prefix=self.prefix) as s:
            await api_call(
                s.bus, s.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
            )


@pytest.fixture
async def platform(nats: NatsServer, tmp_path: Path) -> AsyncIterator[Callable[..., Platform]]:
    started: list[Platform] = []

    def start(**extra: str) -> Platform:
        p = Platform(nats, tmp_path, **extra)
        started.append(p)
        return p

    yield start
    for p in started:
        p.proc.stop()


@pytest.fixture
def markers(tmp_path: Path) -> Iterator[dict[Path, str]]:
    """A secret file in each place of ``PLANT_DIRS``, the checkout and the state dir."""
    token = uuid.uuid4().hex
    planted = {
        d / f"sandpod-test-marker-{token}": f"host secret {token} in {d}"
        for d in (*PLANT_DIRS, CHECKOUT, tmp_path)
    }
    for path, text in planted.items():
        path.write_text(text)
    yield planted
    for path in planted:
        path.unlink(missing_ok=True)


def _probe(paths: list[Path]) -> str:
    """Shell text printing each readable file's content and listing each directory."""
    quoted = " ".join(shlex.quote(str(p)) for p in paths)
    return f'for p in {quoted}; do cat "$p" 2>/dev/null; ls -A "$p" 2>/dev/null; done; true'


def _host_only_dirs(base: Path) -> list[Path]:
    """Top-level directories of the host that the base does not have (and the sandbox does not
    make itself: /workspace is every sandbox's own, whatever a host may have there)."""
    host = {e.name for e in os.scandir("/") if e.is_dir(follow_symlinks=False)}
    ours = {e.name for e in os.scandir(base)}
    return sorted(Path("/", n) for n in host - ours - {"proc", "sys", "dev", "workspace"})


async def test_a_default_sandbox_sees_nothing_of_the_host(
    platform: Callable[..., Platform],
    markers: dict[Path, str],
    default_rootfs: Path | None,
    tmp_path: Path,
) -> None:
    """No marker planted on the host, no host-only top-level directory, nor the checkout or the
    state dir is visible in a sandbox of the default template; Isolated is full."""
    assert default_rootfs is not None, "the session could not build the default rootfs"
    p = platform()
    await p.answering()
    sbx = await p.create("plain")
    async with sbx:
        host_only = _host_only_dirs(default_rootfs)
        looked = [*markers, *PLANT_DIRS, *host_only, CHECKOUT, tmp_path, Path("/work")]
        r = await sbx.exec(_probe(looked))
        assert r.exit_code == 0, r.stderr
        for text in markers.values():
            assert text not in r.stdout
        assert "sandpod-test-marker" not in r.stdout, r.stdout
        absent = " ".join(shlex.quote(str(d)) for d in [*host_only, CHECKOUT, tmp_path])
        r = await sbx.exec(f'for d in {absent}; do [ -e "$d" ] && echo "$d"; done; true')
        assert r.stdout == "", f"host directories visible in the sandbox: {r.stdout}"
        # The sandbox's files are the base's: /etc/os-release and /etc/passwd come from Debian.
        r = await sbx.exec("cat /etc/os-release; grep -c . /etc/passwd")
        assert (default_rootfs / "etc/os-release").read_text() in r.stdout
        isolated = (await sbx.describe()).condition("Isolated")
        assert isolated is not None and isolated["status"] == "True", isolated
        await sbx.kill()


PYPROJECT = """[project]
name = "probe"
version = "0"
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
"""
TOOLS = """set -e
cd /workspace
echo "uid=$(id -u) lang=$LANG home=$HOME"
python3 -m venv v && echo "venv=$(v/bin/python -c 'import sys; print(sys.prefix)')"
mkdir -p p/probe && echo 'X = 42' > p/probe/__init__.py && cat > p/pyproject.toml
python3 -m pip install -q --no-index --no-build-isolation ./p >/dev/null 2>&1
echo "pip=$(cd / && python3 -c 'import probe; print(probe.__file__, probe.X)')"
git init -q r && git -C r -c user.email=a@b -c user.name=a commit -q --allow-empty -m x
echo "git=$(git -C r log --format=%s)"
printf 'int main(void){return 7;}' > m.c && gcc m.c -o m && { ./m || echo "gcc=$?"; }
echo "node=$(node -e 'console.log(6 * 7)')"
"""


async def test_the_default_base_runs_a_users_tools_as_the_sandbox_user(
    platform: Callable[..., Platform],
) -> None:
    """python3 (venv, and pip installing for the user: no externally-managed refusal), git,
    gcc and node work for the sandbox's unprivileged uid, with a UTF-8 locale available."""
    p = platform()
    await p.answering()
    sbx = await p.create("tools")
    async with sbx:
        r = await sbx.exec(TOOLS, stdin=PYPROJECT, env={"LANG": "C.UTF-8"}, timeout=120)
        assert r.exit_code == 0, (r.stdout, r.stderr)
        got = dict(line.split("=", 1) for line in r.stdout.split() if "=" in line)
        assert int(got["uid"]) >= 200_000 and got["lang"] == "C.UTF-8", got
        assert got["home"] == "/workspace" and got["venv"] == "/workspace/v", got
        assert r.stdout.count("/workspace/.local/lib/python3") == 1 and " 42" in r.stdout
        assert (got["git"], got["gcc"], got["node"]) == ("x", "7", "42"), got
        await sbx.kill()


async def test_rootfs_slash_is_the_host_root_and_says_so(
    platform: Callable[..., Platform], markers: dict[Path, str]
) -> None:
    """A template with ``rootfs: /`` sees the host (the markers in /srv and /opt: the attack
    above is real), and its Isolated condition is False, naming the host root."""
    p = platform()
    await p.answering()
    await p.template("hostroot", {"rootfs": "/"})
    sbx = await p.create("hostroot", template="hostroot")
    async with sbx:
        srv = next(m for m in markers if m.parent == Path("/srv"))
        r = await sbx.exec(f"cat {srv}")
        assert r.stdout == markers[srv], r.stderr
        isolated = (await sbx.describe()).condition("Isolated")
        assert isolated is not None and isolated["status"] == "False", isolated
        assert "rootfs: host root (template rootfs: /)" in isolated["message"], isolated
        await sbx.kill()


async def test_no_default_base_fails_the_create_saying_how_to_prepare_one(
    platform: Callable[..., Platform],
) -> None:
    """Without SANDPOD_DEFAULT_ROOTFS a template without rootfs is refused (never the host
    root), and the sandbox's condition says how to prepare a base."""
    p = platform(SANDPOD_DEFAULT_ROOTFS="")
    await p.answering()
    with pytest.raises(SandpodError):
        await AsyncSandbox.create(name="nobase", nats_url=p.url, prefix=p.prefix, wait=5)
    async with await AsyncSandbox.connect("nobase", nats_url=p.url, prefix=p.prefix) as sbx:
        ready = (await sbx.describe()).condition("Ready")
    assert ready is not None and ready["status"] == "False", ready
    assert "SANDPOD_DEFAULT_ROOTFS" in ready["message"] and "sandpod up" in ready["message"]
    assert not list((p.state / "jails").glob("nobase/jail.json"))
