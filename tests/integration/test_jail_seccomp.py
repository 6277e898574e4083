"""The jail's seccomp filter and /dev, attacked from inside a sandbox (needs root).

Code inside a jailed sandbox (SDK exec, streams, sessions, background processes, terminals and
git, through a private execd serving the jail) tries what the common container default profile
forbids: nested user namespaces and mounts, keyrings, io_uring, bpf, perf events, userfaultfd,
vsock, kexec, modules, foreign system call ABIs; then that a device node placed in its /dev by
someone else opens as nothing. Each must be refused while everyday programs still work. The
jail fixtures come from ``test_jail``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from test_jail import jailed, make, ok, run, runtime, state  # noqa: F401 - fixtures used by name

from conftest import marker
from sandpod import AsyncSandbox
from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.resources import SandboxTemplateSpec
from sandpod_lifecycle.runtime import seccomp
from sandpod_lifecycle.runtime.base import InstanceStatus

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the local runtime needs root: run as root"),
    pytest.mark.skipif(
        platform.machine() != "x86_64",
        reason="the probe's system call numbers are x86_64's: run on x86_64 (as CI does)",
    ),
]
Make = object  # the fixture's type lives in test_jail
EPERM, ENOSYS = 1, 38

# Each system call with arguments that make it harmless (and, as host root without a filter,
# answer something other than EPERM: EINVAL, ENOENT, EFAULT, EBADF or success); prints
# {name: errno or 0} as JSON. Numbers are x86_64's.
PROBE = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
S = ctypes.c_char_p
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *args)
    return 0 if r >= 0 else ctypes.get_errno()
NONE = S(b"/nonexistent-sandpod-probe")
out = {
    "io_uring_setup": call(425, 1, None),
    "io_uring_enter": call(426, -1, 0, 0, 0, None, 0),
    "io_uring_register": call(427, -1, 0, None, 0),
    "add_key": call(248, S(b"user"), S(b"sandpod-probe"), S(b"x"), 1, -2),
    "keyctl": call(250, 0, -4, 0),
    "request_key": call(249, S(b"user"), S(b"sandpod-none"), None, 0),
    "bpf": call(321, 9999, None, 0),
    "perf_event_open": call(298, None, 0, -1, -1, 0),
    "userfaultfd": call(323, 1),
    "vsock": call(41, 40, 1, 0),
    "mount": call(165, S(b"none"), NONE, S(b"tmpfs"), 0, None),
    "umount2": call(166, NONE, 0),
    "pivot_root": call(155, NONE, NONE),
    "fsopen": call(430, S(b"tmpfs"), 0),
    "move_mount": call(429, -1, S(b""), -1, S(b""), 0),
    "open_tree": call(428, -1, NONE, 0),
    "kexec_load": call(246, 0, 0, None, 0xFFFF0000),
    "kexec_file_load": call(320, -1, -1, 0, None, 0xFFFF0000),
    "init_module": call(175, None, 0, S(b"")),
    "finit_module": call(313, -1, S(b""), 0),
    "delete_module": call(176, S(b"sandpod_none_such"), os.O_NONBLOCK),
    "reboot": call(169, 0, 0, 0, None),
    "swapon": call(167, NONE, 0),
    "open_by_handle_at": call(304, -1, None, 0),
    "setns": call(308, -1, 0),
    "personality": call(135, 0x0040000),
    "clone3": call(435, None, 0),
}
pid = libc.syscall(ctypes.c_long(56), ctypes.c_ulong(0x10000000 | 17), None, None, None, None)
if pid == 0:
    libc.syscall(ctypes.c_long(60), 0)  # the clone child (no seccomp): leave at once
out["clone_newuser"] = ctypes.get_errno() if pid < 0 else (os.waitpid(pid, 0), 0)[1]
out["unshare"] = call(272, 0x10000000)  # last: as root it succeeds and changes our namespace
print(json.dumps(out))
"""
REFUSED = {
    name: ENOSYS if name == "clone3" else EPERM
    for name in (
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "add_key",
        "keyctl",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "vsock",
        "mount",
        "umount2",
        "pivot_root",
        "fsopen",
        "move_mount",
        "open_tree",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "reboot",
        "swapon",
        "open_by_handle_at",
        "setns",
        "personality",
        "clone3",
        "clone_newuser",
        "unshare",
    )
}
# Everyday work the filter must leave alone.
EVERYDAY = r"""
set -e
python3 -c 'import socket, threading, subprocess, os
t = threading.Thread(target=lambda: None); t.start(); t.join()
for fam in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6): socket.socket(fam).close()
assert subprocess.run(["true"]).returncode == 0 and os.fork() or os._exit(0)
print("python ok")'
bash -c 'x=$(echo sub); [ "$x" = sub ] && echo bash ok'
cd /tmp && git init -q r && cd r && echo a > f && git add f
git -c user.name=t -c user.email=t@e commit -qm one && echo git ok
ip -o link show lo | grep -q LOOPBACK && echo netlink ok
head -c 4 /dev/urandom | wc -c; head -c 2 /dev/zero | od -An -tx1; echo x > /dev/null
"""
SECCOMP_LINE = "grep '^Seccomp:' /proc/$$/status"


def _probe(out: str) -> dict[str, int]:
    data: dict[str, int] = json.loads(out)
    return data


async def test_the_compiled_filter_refuses_even_root() -> None:
    """The helper's filter, loaded by host root: each listed call fails with EPERM (clone3
    ENOSYS) though root could make it; unfiltered, root gets none of those answers."""
    helper = seccomp.helper()
    assert helper is not None, "sandpod-jail-exec is not built: run make install"
    bare = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=30
    )
    unfiltered = _probe(bare.stdout)
    assert {n: e for n, e in unfiltered.items() if e == REFUSED[n]} == {}, unfiltered
    done = subprocess.run(
        [helper, "--filter-only", sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert _probe(done.stdout) == REFUSED


async def test_a_foreign_system_call_abi_kills_the_process() -> None:
    """An x32 system call (the x86_64 number with bit 30) is not filtered as x86_64: the
    arch check kills the process; an i386-only number is just not allowed."""
    helper = seccomp.helper()
    assert helper is not None, "sandpod-jail-exec is not built: run make install"
    x32 = "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39); print('survived')"
    r = subprocess.run(
        [helper, "--filter-only", sys.executable, "-c", x32],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == -31 and "survived" not in r.stdout, (r.returncode, r.stdout)  # SIGSYS
    plain = subprocess.run([sys.executable, "-c", x32], capture_output=True, text=True, timeout=30)
    assert plain.stdout == "survived\n"


async def test_code_in_a_sandbox_gets_no_nested_namespace_or_kernel_surface(
    jailed: tuple[InstanceStatus, AsyncSandbox],  # noqa: F811 - the fixture imported above
) -> None:
    """unshare -Urnm, keyrings, io_uring, bpf, perf, userfaultfd, vsock, mounts... from a
    sandboxed exec: each EPERM (clone3 ENOSYS); everyday programs still work."""
    st, sbx = jailed
    r = await sbx.exec("unshare -Urnm true")
    assert r.exit_code != 0 and "Operation not permitted" in r.stderr, r
    r = await sbx.exec(["python3", "-c", PROBE])
    assert r.exit_code == 0, r.stderr
    assert _probe(r.stdout) == REFUSED
    assert st.protections.get("seccomp") == "active", st.protections
    r = await sbx.exec(EVERYDAY)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[:4] == ["python ok", "bash ok", "git ok", "netlink ok"], r.stdout
    assert lines[4].strip() == "4" and lines[5].split() == ["00", "00"], r.stdout
    if os.path.exists("/usr/bin/gcc"):  # the base is the host root: gcc works if it is there
        src = "int main(void){return 3;}"
        r = await sbx.exec(f"cd /tmp && echo '{src}' > t.c && gcc -o t t.c && ./t")
        assert r.exit_code == 3, r.stderr


async def test_every_entry_into_the_jail_is_filtered(
    jailed: tuple[InstanceStatus, AsyncSandbox],  # noqa: F811 - the fixture imported above
) -> None:
    """Seccomp: 2 for the holder (pid 1) and for one-shot exec, streams, sessions, background
    processes, terminals and git hooks."""
    st, sbx = jailed
    assert st.holder_pid is not None and st.workspace is not None
    status = Path(f"/proc/{st.holder_pid}/status").read_text()
    assert "\nSeccomp:\t2\n" in status, "the holder runs unfiltered"
    want = "Seccomp:\t2\n"
    assert (await sbx.exec(SECCOMP_LINE)).stdout == want
    async with sbx.exec_stream(["sh", "-c", SECCOMP_LINE]) as stream:
        assert b"".join([c.data async for c in stream]).decode() == want
    async with await sbx.sessions.create("filtered") as sh:
        assert (await sh.run(SECCOMP_LINE)).stdout == want
    p = await sbx.proc.start(f"{SECCOMP_LINE} > /workspace/proc-seccomp", proc_id="filtered")
    try:
        await p.wait(timeout=20)
    finally:
        await p.remove()
    assert (st.workspace / "proc-seccomp").read_text() == want
    term = await sbx.pty.open(["sh", "-c", f"{SECCOMP_LINE} > /workspace/pty-seccomp"])
    async with term:
        await term.wait()
    assert (st.workspace / "pty-seccomp").read_text() == want
    hook = f"#!/bin/sh\n{SECCOMP_LINE} > /workspace/git-seccomp\n"
    setup = (
        "git init -q -b main repo && cd repo && echo a > f && git add f && "
        "git -c user.name=t -c user.email=t@e commit -qm one && git branch other && "
        f"printf '%s' '{hook}' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout"
    )
    assert (await sbx.exec(setup)).exit_code == 0
    await sbx.git.checkout("/workspace/repo", "other")
    assert (st.workspace / "git-seccomp").read_text() == want


def _as_uid(uid: int, script: str) -> str:
    """Run python ``script`` on the host as ``uid`` (the system python: the venv's may live
    where that uid cannot read)."""
    r = subprocess.run(
        ["/usr/bin/python3", "-c", f"import os; os.setgid({uid}); os.setuid({uid})\n" + script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


KEY_ADD = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
key = libc.syscall(248, b"user", sys.argv[1].encode(), b"left-behind-secret", 18, -4)
print(key)
"""
KEY_READ = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
found = libc.syscall(249, b"user", sys.argv[1].encode(), None, -4)  # request_key: search
if found < 0:
    print("refused", ctypes.get_errno()); raise SystemExit
buf = ctypes.create_string_buffer(64)
n = libc.syscall(250, 11, found, buf, 64)  # KEYCTL_READ
print("read", buf.raw[:n].decode() if n > 0 else ctypes.get_errno())
"""


@pytest.mark.parametrize("mode", ["default", "unconfined"])
async def test_a_key_left_in_the_uids_keyring_is_out_of_reach(
    make: Make,  # noqa: F811 - the fixture imported above
    mode: str,
) -> None:
    """A sandbox cannot add a key to its uid's keyring, and one left there (host root puts it,
    as a previous sandbox with the same uid would have) cannot be found or read. The
    ``unconfined`` control shows the attack is real without the filter."""
    st = await make(seccomp=mode)  # type: ignore[operator]
    assert st.uid is not None
    name = f"sandpod-{marker()}"
    added = await run(st, ["python3", "-c", KEY_ADD, name + "-from-sandbox"])
    left = _as_uid(st.uid, KEY_ADD.replace("sys.argv[1]", repr(name)))
    try:
        out = await ok(st, ["python3", "-c", KEY_READ, name])
        if mode == "default":
            assert added.stdout.value().decode().strip() == "-1"  # add_key refused
            assert out.split() == ["refused", str(EPERM)], out
        else:
            assert out.split() == ["read", "left-behind-secret"], out
    finally:
        _as_uid(st.uid, f"import ctypes; ctypes.CDLL(None).syscall(250, 3, {int(left)})")
        _as_uid(st.uid, "import ctypes; ctypes.CDLL(None).syscall(250, 7, -4)")  # clear ours


async def test_a_device_node_in_dev_opens_as_nothing(
    make: Make,  # noqa: F811 - the fixture imported above
) -> None:
    """A device node that appears in the sandbox's /dev or /dev/shm (host root puts one there;
    the sandbox itself cannot mknod) does not open as a device; the real nodes still work."""
    st = await make()  # type: ignore[operator]
    assert st.holder_pid is not None
    dev = Path(f"/proc/{st.holder_pid}/root/dev")
    for where in (dev / "planted", dev / "shm" / "planted"):
        os.mknod(where, 0o20666, os.makedev(1, 5))  # /dev/zero's numbers, mode 0666
        os.chmod(where, 0o666)
    r = await run(st, "head -c 1 /dev/planted; echo rc=$?; head -c 1 /dev/shm/planted; echo rc=$?")
    out = r.stdout.value().decode()
    err = r.stderr.value().decode()
    assert out.split() == ["rc=1", "rc=1"] and err.count("Permission denied") == 2, (out, err)
    r = await run(st, "mknod /dev/shm/mine c 1 5")
    assert r.returncode != 0 and "Operation not permitted" in r.stderr.value().decode()
    assert (await ok(st, "head -c 3 /dev/zero | od -An -tx1")).split() == ["00"] * 3
    assert await ok(st, "echo x > /dev/null && head -c 8 /dev/urandom | wc -c") == "8\n"


async def test_a_template_that_allows_nested_user_namespaces_gets_them(
    make: Make,  # noqa: F811 - the fixture imported above
) -> None:
    """Only an explicit mode loosens the filter, and the sandbox's protections say so: nested
    user namespaces (and mounts inside them) work; keyrings and io_uring stay refused."""
    st = await make(seccomp="nested")  # type: ignore[operator]
    assert "allowNestedUserNamespaces" in st.protections["seccomp"], st.protections
    assert "seccomp" in st.degraded
    out = await ok(st, "unshare -Urnm sh -c 'mount -t tmpfs x /mnt && id -u && echo mounted'")
    assert out == "0\nmounted\n"
    refused = _probe(await ok(st, ["python3", "-c", PROBE]))
    still = ("keyctl", "add_key", "io_uring_setup", "bpf", "vsock")
    assert {k: refused[k] for k in still} == dict.fromkeys(still, EPERM), refused
    free = await make(seccomp="unconfined")  # type: ignore[operator]
    assert free.protections["seccomp"] == seccomp.UNCONFINED
    assert await ok(free, SECCOMP_LINE) == "Seccomp:\t0\n"


def test_the_template_loosens_only_with_valid_explicit_fields() -> None:
    """spec.security parses to a mode; anything else is a typed error naming the field; the
    protection says why when the filter cannot be in force."""
    parse = SandboxTemplateSpec.from_dict
    assert parse({}).security.seccomp == "RuntimeDefault"
    loose = parse({"security": {"allowNestedUserNamespaces": True}}).security
    assert seccomp.mode_for(loose.seccomp, loose.allow_nested_user_namespaces) == "nested"
    free = parse({"security": {"seccomp": "Unconfined"}}).security
    assert seccomp.mode_for(free.seccomp, free.allow_nested_user_namespaces) == "unconfined"
    for bad, field in (
        ({"seccomp": "Off"}, "spec.security.seccomp"),
        ({"allowNestedUserNamespaces": "yes"}, "spec.security.allowNested"),
        ("all", "spec.security"),
    ):
        with pytest.raises(ResourceInvalid, match=field):
            parse({"security": bad})
    assert seccomp.protection(os.getpid(), "default", None) == seccomp.NO_HELPER
    assert seccomp.protection(os.getpid(), "default", "/x") == seccomp.NO_FILTER  # we: Seccomp 0


async def test_without_the_helper_the_jail_says_it_is_unfiltered(
    make: Make,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No sandpod-jail-exec (no C compiler at install): the holder waits unfiltered, and the
    seccomp protection says so and what to do, instead of claiming it."""
    monkeypatch.setattr(seccomp, "helper", lambda: None)
    st = await make()  # type: ignore[operator]
    assert st.protections["seccomp"] == seccomp.NO_HELPER and "seccomp" in st.degraded
    assert st.holder_pid is not None
    assert "\nSeccomp:\t0\n" in Path(f"/proc/{st.holder_pid}/status").read_text()
