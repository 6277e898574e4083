"""Sessions and background processes inside a local-runtime jail (needs root).

The jail fixtures come from ``test_jail``: a real jailed sandbox served by a private execd.
"""

from __future__ import annotations

import os

import pytest
from test_jail import jailed, make, runtime, state  # noqa: F401 - fixtures used by name

from conftest import free_port, marker, pids_with, wait_until
from sandpod import AsyncSandbox
from sandpod_lifecycle.runtime.base import InstanceStatus

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)


async def test_a_session_runs_inside_the_jail(
    jailed: tuple[InstanceStatus, AsyncSandbox],  # noqa: F811 - the fixture imported above
) -> None:
    """The shell is the sandbox's user in /workspace; state persists; its files stay inside."""
    st, sbx = jailed
    async with await sbx.sessions.create("jailed") as sh:
        assert sh.info.cwd == "/workspace"
        r = await sh.run("id -u; pwd; cd /tmp && export K=v")
        assert r.stdout.split() == [str(st.uid), "/workspace"]
        r = await sh.run('echo "$K $PWD"; ls -ld /tmp/sandpod-session-* | wc -l', stdin=b"x")
        assert r.stdout == "v /tmp\n1\n" and r.cwd == "/tmp"
        r = await sh.run("sleep 30", timeout=0.3)
        assert r.timed_out and (await sh.run("echo $K")).stdout == "v\n"


async def test_session_files_cannot_be_redirected_by_symlinks(
    jailed: tuple[InstanceStatus, AsyncSandbox],  # noqa: F811 - the fixture imported above
) -> None:
    """A command that swaps its session directory's files for links to host-side paths cannot
    make root execd write there: the next command still works, nothing appears outside."""
    _, sbx = jailed
    target = f"/var/tmp/sandpod-escape-{marker()}"
    async with await sbx.sessions.create("links") as sh:
        r = await sh.run(
            'd=$(dirname "$BASH_SOURCE"); n=$(basename "$BASH_SOURCE" .cmd);'
            f' for i in 1 2 3 4 5; do ln -sf {target} "$d/$((n + i)).cmd";'
            f' ln -sf {target} "$d/$((n + i)).in"; done; echo planted'
        )
        assert r.stdout == "planted\n"
        r = await sh.run("echo after", stdin=b"data")
        assert not os.path.exists(target)
        assert r.stdout == "after\n"  # the planted links were removed, never followed


async def test_a_background_process_in_the_jail(
    jailed: tuple[InstanceStatus, AsyncSandbox],  # noqa: F811 - the fixture imported above
) -> None:
    """proc runs inside; wait_for_port checks the sandbox's own loopback; kill ends strays."""
    _, sbx = jailed
    m = marker()
    port = free_port()
    p = await sbx.proc.start(
        f"(setsid sh -c 'sleep 300; : {m}' >/dev/null 2>&1 &); "
        f"exec python3 -m http.server {port} --bind 127.0.0.1",
        proc_id="web",
    )
    try:
        assert p.info.cwd == "/workspace"
        await p.wait_for_port(port, kind="http", timeout=20)
        wait_until(lambda: bool(pids_with(m)), 10, "the stray")
        info = await p.kill(grace=1)
        assert info.killed
        wait_until(lambda: not pids_with(m), 10, "the stray to die with the tree")
    finally:
        await p.remove()
