"""Start a sandbox's *holder*: the long-lived pid 1 that owns its namespaces and root.

Like a Kubernetes pause container, the holder does nothing but exist (and reap orphans), so the
sandbox's namespaces and mounts live exactly as long as it does; execd enters them per command
(see ``sandpod_execd.jail``). How it is built, in one chain of execs:

1. ``launcher`` (``/bin/sh`` on the host) joins the sandbox's cgroups, so everything after it
   is limited and tracked -- all but the sandbox's memory cgroup where it has a hierarchy of
   its own (cgroup v1): the holder waits in the parent memory cgroup instead, outside the OOM
   killer's choice when the sandbox exhausts its memory (``/dev/shm`` and ``/tmp`` pages are
   charged to the processes that write them, never to the holder). It also asks the OOM killer
   to spare it (``oom_score_adj`` -1000, best effort: a host without ``CAP_SYS_RESOURCE``
   refuses; it is what protects the holder on a unified v2 hierarchy). Commands never inherit
   it: they are execd's children, and the jail entry raises a negative score to 0;
2. ``unshare --mount --pid --ipc --uts --net --cgroup --fork --kill-child`` creates the
   namespaces (private mount propagation: nothing we mount leaks to the host);
3. ``holder`` (``/bin/sh``, pid 1 inside) builds the root with host tools while it still sees
   the host: overlayfs (lower = the read-only base, upper/work = the sandbox's writable layer),
   empty read-only tmpfs over masked host paths (the state dir with every other sandbox), a
   fresh ``/proc`` for the new pid namespace, private ``/tmp`` (a tmpfs, or with a disk quota
   the writable layer's own ``/tmp``), ``/run``, ``/dev`` (a few device nodes, its own devpts,
   ``/dev/shm``), ``/workspace`` bound from the host; bounds the ipc namespace's SysV shared
   memory to ``/dev/shm``'s size (both outlive the processes that filled them, charged to the
   sandbox's memory: they must leave room); sets the hostname,
   brings ``lo`` up (the network namespace has nothing else), adds the sandbox user to
   ``/etc/passwd`` (in the upper layer), then ``pivot_root``\\s into the new root and detaches the
   old one with the base's ``umount`` (the old root's binaries are unusable from the new root),
   so no host path is reachable any more: the base must provide ``sh``, ``sleep`` and ``umount``;
4. it re-executes, through ``sandpod-jail-exec --filter-only`` (opened before ``pivot_root``,
   run from its descriptor) which loads the sandbox's seccomp filter, the base's ``sh`` (a
   short command line, no host paths) that prints ``ready <host pid> [skipped dirs]`` on stdout
   and waits forever: ``sleep`` in a ``wait`` loop, so it also reaps the orphans the kernel
   re-parents to it.

Rootless (the driver is not root), ``unshare`` also creates a user namespace mapping our uid and
gid to the sandbox's and keeps the namespace's capabilities for the holder script; the kernel
refuses an unprivileged overlay whose lower layer has mounts below it (the host root), so the
holder then layers each top-level directory of the base separately in a tmpfs root, and reports
the directories it had to leave empty (``/mnt`` with a mount inside, say).

Every value reaches the scripts as a positional argument, never spliced into shell text. Errors
(``set -eu``) end the holder, whose stderr goes to a log the driver quotes in ``CreateFailed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandpod_lifecycle.runtime.base import ACTIVE
from sandpod_lifecycle.runtime.cgroups import SandboxCgroups

__all__ = ["HolderLayout", "launch", "oom_protection", "wait_exit"]

LAUNCHER = r"""
echo -1000 2>/dev/null > /proc/self/oom_score_adj || :  # best effort: some hosts refuse
while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done
shift
exec "$@"
"""

HOLDER = r"""
set -eu
base=$1 upper=$2 work=$3 root=$4 ws=$5 name=$6 tmpsize=$7 uid=$8 gid=$9
rootless=${10} helper=${11} seccomp=${12} shmsize=${13} tmp_in_upper=${14}
shift 14
skipped=
if ! mount -t overlay overlay -o "nosuid,nodev,lowerdir=$base,upperdir=$upper,workdir=$work" \
    "$root" 2>/dev/null; then
  [ "$rootless" = 1 ] || { echo "cannot mount the overlay root over $base" >&2; exit 1; }
  # Rootless, a base with mounts below it (the host root) cannot be one overlay's lower layer:
  # layer each top-level directory of it on its own (upper/<name>), in a tmpfs root.
  mount -t tmpfs -o "nosuid,nodev,mode=0755,size=$tmpsize" sandpod-root "$root"
  for e in $(ls -A "$base"); do
    case "$e" in
      proc|sys|dev|tmp|run) mkdir -p "$root/$e"; continue ;;
      lost+found) continue ;;
      *[!A-Za-z0-9._-]*) skipped="$skipped /$e"; continue ;;
    esac
    p=${base%/}/$e
    if [ -L "$p" ]; then
      ln -s "$(readlink "$p")" "$root/$e"
    elif [ -d "$p" ]; then
      mkdir -p "$root/$e" "$upper/$e" "$work/layers/$e"
      mount -t overlay overlay \
        -o "nosuid,nodev,lowerdir=$p,upperdir=$upper/$e,workdir=$work/layers/$e" \
        "$root/$e" 2>/dev/null || skipped="$skipped /$e"
    elif [ -f "$p" ]; then
      : > "$root/$e"
      mount --bind "$p" "$root/$e"
      mount -o remount,bind,ro,nosuid,nodev "$root/$e"
    fi
  done
fi
for m in "$@"; do
  if [ -d "$root$m" ]; then
    mount -t tmpfs -o ro,nosuid,nodev,noexec,size=4k,mode=0755 sandpod-masked "$root$m"
  fi
done
mkdir -p "$root/proc" "$root/tmp" "$root/run" "$root/dev" "$root/workspace"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
if [ "$tmp_in_upper" = 0 ]; then  # else /tmp is the upper layer's (on the disk quota)
  mount -t tmpfs -o "nosuid,nodev,mode=1777,size=$tmpsize" sandpod-tmp "$root/tmp"
fi
mount -t tmpfs -o nosuid,nodev,noexec,mode=0755,size=1m sandpod-run "$root/run"
mount --bind "$ws" "$root/workspace"
mount -o remount,bind,nosuid,nodev "$root/workspace"
# nodev: a device node that appears here (the sandbox cannot mknod; root could) opens as
# nothing; each node bound below keeps the flags of the host's /dev mount, so it still works.
mount -t tmpfs -o nosuid,nodev,noexec,mode=0755,size=64k sandpod-dev "$root/dev"
for d in null zero full random urandom tty; do
  : > "$root/dev/$d"
  mount --bind "/dev/$d" "$root/dev/$d"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,nosuid,noexec devpts "$root/dev/pts"
mount -t tmpfs -o "nosuid,nodev,mode=1777,size=$shmsize" sandpod-shm "$root/dev/shm"
ln -s pts/ptmx "$root/dev/ptmx"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
# Add a line to a file of the base. Rootless, the base's files belong to a uid unmapped in our
# user namespace (no copy-up allowed): a copy in the sandbox's /run is bound over the file.
add_line() {
  if [ "$rootless" = 1 ]; then
    copy="$root/run/sandpod$(echo "$1" | tr / -)"
    { cat "$root$1"; echo "$2"; } > "$copy"
    mount --bind "$copy" "$root$1"
  else
    echo "$2" >> "$root$1"
  fi
}
if [ -f "$root/etc/passwd" ] && ! grep -q "^[^:]*:[^:]*:$uid:" "$root/etc/passwd"; then
  add_line /etc/passwd "sandbox:x:$uid:$gid:sandpod sandbox:/workspace:/bin/sh"
fi
if [ -f "$root/etc/group" ] && ! grep -q "^[^:]*:[^:]*:$gid:" "$root/etc/group"; then
  add_line /etc/group "sandbox:x:$gid:"
fi
if [ -f "$root/etc/hosts" ]; then
  add_line /etc/hosts "127.0.1.1 $name"
fi
if [ "$rootless" = 1 ]; then hostname "$name"; else echo "$name" > /proc/sys/kernel/hostname; fi
ip link set lo up
# SysV shared memory outlives its processes too: bound it like /dev/shm (this ipc namespace's).
# Rootless, a kernel that keeps ipc sysctls from the user namespace's root leaves them as they are.
{ echo "$shmsize" > /proc/sys/kernel/shmmax && echo $((shmsize / 4096)) > /proc/sys/kernel/shmall
} 2>/dev/null || [ "$rootless" = 1 ]
for tool in sh sleep umount; do
  found=
  IFS=:
  for d in $PATH; do [ -x "$root$d/$tool" ] && found=y; done
  unset IFS
  if [ -z "$found" ]; then
    echo "the sandbox's base has no $tool command (in $PATH)" >&2
    exit 1
  fi
done
read -r hostpid _ < /proc/self/stat
# The seccomp helper (a static binary) is opened now and executed after pivot_root through
# its descriptor: it loads the filter and becomes the waiting shell, which says ready, so the
# driver reads the filter's state once ready. Without it the shell waits unfiltered.
[ -z "$helper" ] || exec 9< "$helper"
cd "$root"
pivot_root . .
umount -l .
cd /
hold='echo "ready $1"; exec </dev/null >/dev/null 2>&1; while :; do sleep 2147483647 & wait; done'
[ -z "$helper" ] || exec /proc/self/fd/9 --seccomp="$seccomp" --filter-only sh -c "$hold" "$0" \
  "$hostpid$skipped"
exec sh -c "$hold" "$0" "$hostpid$skipped"
"""


@dataclasses.dataclass(frozen=True, slots=True)
class HolderLayout:
    """Everything the holder needs, all host paths."""

    sandbox_id: str
    base: Path
    upper: Path
    work: Path
    root: Path  # an empty directory: the overlay's mount point (in the holder's namespace only)
    workspace: Path
    tmp_bytes: int
    shm_bytes: int  # /dev/shm's size: a fraction of the memory limit (see Resources.shm_bytes)
    uid: int
    gid: int
    masks: Sequence[Path]
    log: Path  # the holder's stderr until it is ready
    rootless: bool = False  # build it in a user namespace mapping us to uid/gid inside
    seccomp: str = "default"  # the filter mode of sandpod-jail-exec (see seccomp.py)
    helper: str | None = None  # sandpod-jail-exec; None: the holder waits unfiltered
    tmp_in_upper: bool = False  # /tmp is the writable layer's (else a tmpfs of tmp_bytes)

    def argv(self, tools: Mapping[str, str | None], cgroup_procs: Sequence[str]) -> list[str]:
        sh, unshare = tools["sh"], tools["unshare"]
        if sh is None or unshare is None:  # hostcaps reports these missing as problems
            raise ValueError("the jail needs sh and util-linux's unshare on the host's PATH")
        for path in (self.base, self.upper, self.work, self.root, self.workspace):
            _check_path(path)
        # Rootless: --keep-caps hands the capabilities we hold in the new user namespace to the
        # holder script (as ambient ones) although it runs as a non-zero uid there.
        user = (
            ["--user", f"--map-user={self.uid}", f"--map-group={self.gid}", "--keep-caps"]
            if self.rootless
            else []
        )
        return [
            sh,
            "-c",
            LAUNCHER,
            "sandpod-launch",
            *cgroup_procs,
            "--",
            unshare,
            *user,
            "--mount",
            "--pid",
            "--ipc",
            "--uts",
            "--net",
            "--cgroup",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            "--",
            sh,
            "-c",
            HOLDER,
            "sandpod-holder",
            str(self.base),
            str(self.upper),
            str(self.work),
            str(self.root),
            str(self.workspace),
            self.sandbox_id,
            str(self.tmp_bytes),
            str(self.uid),
            str(self.gid),
            "1" if self.rootless else "0",
            self.helper or "",
            self.seccomp,
            str(self.shm_bytes),
            "1" if self.tmp_in_upper else "0",
            *(str(m) for m in self.masks),
        ]


def oom_protection(cg: SandboxCgroups, holder: int) -> str:
    """The ``holder_oom`` protection: ``"active"`` when the sandbox's OOM killer cannot pick
    its holder (pid ``holder``), else why it can."""
    if cg.holder_outside_memory:
        return ACTIVE  # not in the sandbox's memory cgroup: never its OOM killer's choice
    with contextlib.suppress(OSError, ValueError):
        if int(Path(f"/proc/{holder}/oom_score_adj").read_text()) == -1000:
            return ACTIVE
    if "memory" not in cg.limits:
        return (
            "unavailable: no memory cgroup, and this host refused the holder's "
            "oom_score_adj -1000: a host-wide OOM can kill it"
        )
    return (
        "degraded: the holder shares the sandbox's memory cgroup (cgroup v2, or a parent "
        "not delegated to us) and this host refused its oom_score_adj -1000 (no "
        "CAP_SYS_RESOURCE): an OOM in the sandbox can kill it (the Sandbox then fails with "
        "OOMKilled)"
    )


def _check_path(path: Path) -> None:
    # overlayfs options are comma- and colon-separated, and mount(8) splits on whitespace.
    text = str(path)
    if not path.is_absolute() or any(c in text for c in ",:\n\t \\"):
        raise ValueError(f"unusable path for an overlay or mount: {text!r}")


async def launch(
    layout: HolderLayout,
    tools: Mapping[str, str | None],
    cgroup_procs: Sequence[str],
    path_env: str,
    timeout: float,
) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    """Start the holder; return (the launcher process, the holder's host pid, the base's
    top-level directories left empty) once it is ready. Only a rootless holder leaves any: one
    with mounts below it cannot be layered without privileges.

    The launcher (it becomes ``unshare``) is our child: the caller keeps the Popen to reap it
    after destroy. It runs in its own session, so a signal to our process group never reaches
    a sandbox.

    Raises:
        RuntimeError: the holder exited or did not become ready in ``timeout`` seconds (the
            message quotes its log); the caller kills the cgroups and cleans up.
    """
    popen, ready_r = _start(layout, layout.argv(tools, cgroup_procs), path_env)
    try:
        line = await asyncio.wait_for(_read_line(ready_r), timeout)
    except TimeoutError:
        line = b""
    finally:
        os.close(ready_r)
    if not line:  # EOF: the holder failed; give the launcher a moment to exit and say so
        await wait_exit(popen, 2.0)
    words = line.decode(errors="replace").split()
    if len(words) >= 2 and words[0] == "ready" and words[1].isdigit():
        return popen, int(words[1]), words[2:]
    reason = "timed out" if popen.poll() is None else f"exited with {popen.returncode}"
    with contextlib.suppress(OSError):
        os.killpg(popen.pid, 9)  # the caller kills the cgroups too; this one we must reap
    await wait_exit(popen, 5.0)
    tail = layout.log.read_text(errors="replace")[-2000:].strip()
    raise RuntimeError(f"sandbox holder {reason}: {tail or 'no output'}")


def _start(
    layout: HolderLayout, argv: list[str], path_env: str
) -> tuple[subprocess.Popen[bytes], int]:
    """Fork the launcher (a few milliseconds, like execd's spawn); return it and the read end
    of its ready pipe."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    try:
        with layout.log.open("wb") as log:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=ready_w,
                stderr=log,
                env={"PATH": path_env, "LANG": "C"},
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        os.close(ready_w)
    return popen, ready_r


async def wait_exit(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait (on a pidfd, without blocking the loop) until our child exits; reap it. Returns
    whether it has exited."""
    if popen.poll() is not None:
        return True
    loop = asyncio.get_running_loop()
    fd = os.pidfd_open(popen.pid)
    try:
        exited: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _set_once, exited)
        try:
            await asyncio.wait_for(exited, timeout)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    return popen.poll() is not None


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _read_line(fd: int) -> bytes:
    """Bytes up to the first newline (or EOF) from ``fd``, without blocking the loop."""
    os.set_blocking(fd, False)
    loop = asyncio.get_running_loop()
    buf = b""
    while b"\n" not in buf:
        try:
            chunk = os.read(fd, 256)
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _set_once, ready)
            try:
                await ready
            finally:
                loop.remove_reader(fd)
            continue
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0]
