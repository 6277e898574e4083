"""Sandbox uids are not handed out again while anything of their old owner remains (issue 12,
finding 8): a deleted sandbox's uid is not the next sandbox's, and a uid some process (or a
keyring) still holds is skipped even when the allocation cursor comes back to it."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandpod_execd.jail import Jail
from sandpod_execd.oneshot import run_to_completion
from sandpod_execd.process import spawn
from sandpod_execd.registry import ExecRegistry
from sandpod_execd.sandbox import SandboxContext
from sandpod_lifecycle.runtime.base import InstanceSpec, InstanceStatus
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig
from sandpod_lifecycle.runtime.uids import CURSOR_FILE

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the jail tests as root"
)

ADD_KEY = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
key = libc.syscall(248, b"user", sys.argv[1].encode(), b"secret", 6, -4)  # add_key, @u
print("added" if key > 0 else f"refused {ctypes.get_errno()}")
"""


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path("/var/tmp") / f"sandpod-uid-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def runtime(state: Path) -> AsyncIterator[LocalRuntime]:
    # A small range of this test's own, far from every installation's (a key left in a
    # keyring by the attack stays with its uid for the kernel's lifetime).
    base = 3_000_000_000 + random.randrange(10_000) * 64
    rt = LocalRuntime(
        LocalRuntimeConfig(
            state_dir=state,
            cgroup_parent=f"sandpod-test-{uuid.uuid4().hex[:8]}",
            uid_base=base,
            uid_count=8,
        )
    )
    if (await rt.capabilities()).problems:
        pytest.skip(f"this host cannot jail: {'; '.join(rt._caps.problems if rt._caps else [])}")
    try:
        yield rt
    finally:
        for sid in await rt.list():
            await rt.destroy(sid)


async def _create(rt: LocalRuntime) -> tuple[InstanceStatus, int]:
    st = await rt.create(InstanceSpec(sandbox_id=f"u-{uuid.uuid4().hex[:10]}"))
    assert st.uid is not None
    return st, st.uid


def _rewind(rt: LocalRuntime, uid: int) -> None:
    """Make ``uid`` the allocator's next candidate (as after a full round of the range)."""
    (rt.config.state_dir / CURSOR_FILE).write_text(str(uid - 1))


async def _jail_run(st: InstanceStatus, script: str, *args: str) -> str:
    """stdout of python run inside the jail as its user, the way execd runs commands."""
    assert st.jail_file is not None
    jail = Jail.load(st.jail_file, st.sandbox_id)
    try:
        ctx = SandboxContext(
            st.sandbox_id,
            Path("/unused"),
            "/bin/bash",
            {},
            ExecRegistry(10, stored_budget=2**20),
            jail=jail,
        )
        argv = ("python3", "-c", script, *args)
        proc = spawn(ctx.command(argv, None, None, None, stdin=False))
        out = await run_to_completion(
            proc, stdin=None, timeout=30, max_output=2**20, pipe_grace=0.5
        )
    finally:
        jail.close()
    return b"".join(out.stdout.parts).decode() + b"".join(out.stderr.parts).decode()


async def test_a_deleted_sandboxs_uid_is_not_the_next_ones(runtime: LocalRuntime) -> None:
    """create, delete, create: the second sandbox runs as another uid."""
    first, uid = await _create(runtime)
    await runtime.destroy(first.sandbox_id)
    _, again = await _create(runtime)
    assert again != uid


def _wait_runs_as(pid: int, uid: int, timeout: float = 30.0) -> None:
    """Until process ``pid`` runs as ``uid`` (its real uid in /proc), or fail."""
    end = time.monotonic() + timeout
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Uid:"))
        if line.split()[1] == str(uid):
            return
        assert time.monotonic() < end, f"process {pid} never ran as {uid}: {line}"
        time.sleep(0.01)


async def test_a_uid_still_running_a_process_is_skipped(runtime: LocalRuntime) -> None:
    """A process left with a deleted sandbox's uid (escaped, or not yet reaped) blocks that
    uid even when the round-robin comes back to it; once it is gone the uid is free again."""
    first, uid = await _create(runtime)
    await runtime.destroy(first.sandbox_id)
    leftover = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "300"]
    )
    try:
        _wait_runs_as(leftover.pid, uid)  # Popen returns before setpriv has switched uid
        _rewind(runtime, uid)
        st, other = await _create(runtime)
        assert other != uid
        await runtime.destroy(st.sandbox_id)
    finally:
        leftover.kill()
        leftover.wait()
    _rewind(runtime, uid)
    _, freed = await _create(runtime)
    assert freed == uid  # the process was what blocked it: the check can fail


async def test_a_key_left_in_the_user_keyring_is_not_inherited(runtime: LocalRuntime) -> None:
    """A sandbox adds a key to its user keyring (or, where seccomp refuses that, a process of
    its uid does) and is deleted; the next sandbox -- even with the cursor rewound to that
    uid -- gets another uid and cannot see the key."""
    first, uid = await _create(runtime)
    token = f"sandpod-leak-{uuid.uuid4().hex[:8]}"
    added = (await _jail_run(first, ADD_KEY, token)).strip()
    if added != "added":  # seccomp refuses it (a template may loosen that): leave the key as
        # the sandbox's uid from the host instead -- the same user keyring, the same leftover
        setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        run = subprocess.run(
            [*setpriv, "/usr/bin/python3", "-c", ADD_KEY, token],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.stdout.strip() == "added", (added, run.stdout, run.stderr)
    await runtime.destroy(first.sandbox_id)
    _rewind(runtime, uid)
    second, other = await _create(runtime)
    assert other != uid
    show = "print(open('/proc/keys').read())"
    assert token not in await _jail_run(second, show)
    # The attack is real: a sandbox that did get the old uid (named in its spec) reads the key.
    reused = await runtime.create(InstanceSpec(sandbox_id=f"u-{uuid.uuid4().hex[:10]}", uid=uid))
    assert token in await _jail_run(reused, show)
