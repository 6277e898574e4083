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
3. ``holder`` (``/bin/sh``, pid 1 inside) first says its host pid (``pid <n>``: the driver gives
   the network namespace its link meanwhile, see ``launch``'s ``on_pid``), then builds the root
   while it still sees the host -- as root with the seccomp helper, in one batch of system calls
   (``sandpod-jail-exec --root-ops``: one process, not ~30 tool spawns, most of a create
   otherwise), else with the host's tools: overlayfs (lower = the read-only base, upper/work =
   the sandbox's writable layer), empty read-only tmpfs over masked host paths (the state dir
   with every other sandbox), a fresh ``/proc`` for the new pid namespace, private ``/tmp`` (a
   tmpfs, or with a disk quota the writable layer's own ``/tmp``), ``/run``, ``/dev`` (a few
   device nodes, its own devpts, ``/dev/shm``), ``/workspace`` bound from the host; bounds the
   ipc namespace's SysV shared memory to ``/dev/shm``'s size (both outlive the processes that
   filled them, charged to the sandbox's memory: they must leave room); sets the hostname,
   brings ``lo`` up (the network namespace has nothing else), adds the sandbox user to
   ``/etc/passwd`` (in the upper layer), then ``pivot_root``\\s into the new root and detaches
   the old one with the base's ``umount`` (the old root's binaries are unusable from the new
   root), so no host path is reachable any more: the base must provide ``sh``, ``sleep`` and
   ``umount``
(rootless also an ``/etc/fstab``: util-linux's ``umount`` there fails without one, so the
holder writes an empty one in the writable layer when the base, an image, has none);
4. it re-executes, through ``sandpod-jail-exec --filter-only`` (opened before ``pivot_root``,
   run from its descriptor) which loads the sandbox's seccomp filter, the base's ``sh`` (a
   short command line, no host paths) that prints ``ready <host pid> [skipped dirs]`` on stdout
   and waits forever: ``sleep`` in a ``wait`` loop, so it also reaps the orphans the kernel
   re-parents to it.

Rootless (the driver is not root), ``unshare`` also creates a user namespace mapping our uid and
gid to the sandbox's and keeps the namespace's capabilities for the holder script; the kernel
refuses an unprivileged overlay whose lower layer has mounts below it (the host root), so the
holder then layers each top-level directory of the base separately in a tmpfs root, and reports
the directories it had to leave empty (``/mnt`` with a mount inside, say) or out (a name with
characters other than ``[A-Za-z0-9._-]``, which overlay options cannot carry: reported whole,
those characters as ``?``).

The two scripts are ``launch.sh`` and ``holder.sh`` beside this module (package data, checked
by shellcheck in ``make lint``). Every value reaches them as a positional argument, never
spliced into shell text. Errors (``set -eu``) end the holder, whose stderr goes to a log the
driver quotes in ``CreateFailed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path

from sandpod_lifecycle.runtime.base import ACTIVE
from sandpod_lifecycle.runtime.cgroups import SandboxCgroups

__all__ = ["HolderLayout", "launch", "oom_protection", "wait_exit"]


def _script(name: str) -> str:
    """A shell script shipped next to this module (package data: in the wheel too). Its text
    is passed as ``sh -c``'s argument, so no file of ours is read after the holder starts."""
    return resources.files(__package__ or "sandpod_lifecycle.runtime").joinpath(name).read_text()


MAX_LOWERDIR = 3500  # bytes of lowerdir: with the other options, under mount(2)'s page of 4096
LAUNCHER = _script("launch.sh")  # joins the cgroups, spares itself from the OOM killer
HOLDER = _script("holder.sh")  # builds the root, pivots, waits (checked by shellcheck)


@dataclasses.dataclass(frozen=True, slots=True)
class HolderLayout:
    """Everything the holder needs, all host paths."""

    sandbox_id: str
    base: Path  # the one lower layer (a rootfs, or the host's /) when there are no ``layers``
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
    layers: tuple[Path, ...] = ()  # stacked over base, bottom first (an image's, a build's)
    userxattr: bool = False  # overlay's own xattrs in user.overlay.* (rootless layered roots)
    # a restored workspace: read-only layers under ``workspace`` (then its upper), top first
    workspace_lower: tuple[Path, ...] = ()
    workspace_work: Path | None = None  # overlayfs scratch of the workspace (with a lower)
    # SandboxVolumes: (host source, mount path inside, read-only), bound last (see holder.sh)
    volumes: tuple[tuple[Path, str, bool], ...] = ()

    def lowerdir(self) -> str:
        """overlayfs' ``lowerdir``: the top layer first, the base last."""
        return ":".join(str(p) for p in (*reversed(self.layers), self.base))

    def overlay_options(self) -> str:
        """Extra overlay options. Rootless, the ``trusted.`` xattrs are out of reach: overlay
        keeps its own (opaque directories, copy-up state) in ``user.overlay.*`` instead, which
        is also how a rootless unpack marks an image layer's opaque directories."""
        return "userxattr" if self.userxattr else ""

    def argv(self, tools: Mapping[str, str | None], cgroup_procs: Sequence[str]) -> list[str]:
        sh, unshare = tools["sh"], tools["unshare"]
        if sh is None or unshare is None:  # hostcaps reports these missing as problems
            raise ValueError("the jail needs sh and util-linux's unshare on the host's PATH")
        ws_extra = (*self.workspace_lower, *([self.workspace_work] if self.workspace_work else []))
        for path in (
            self.base,
            *self.layers,
            self.upper,
            self.work,
            self.root,
            self.workspace,
            *ws_extra,
        ):
            _check_path(path)
        if self.workspace_lower and self.workspace_work is None:
            raise ValueError("a workspace with lower layers needs its overlay work directory")
        for source, target, _ in self.volumes:
            _check_path(source)
            _check_path(Path(target))
        if len(self.lowerdir()) > MAX_LOWERDIR:  # mount(2) takes one page of options
            raise ValueError(
                f"an image of {len(self.layers)} layers does not fit one overlay mount's "
                f"options ({len(self.lowerdir())} bytes of layer paths, at most {MAX_LOWERDIR}): "
                "squash the image or keep the image store at a shorter path"
            )
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
            self.lowerdir(),
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
            self.overlay_options(),
            ":".join(str(p) for p in self.workspace_lower),
            str(self.workspace_work or ""),
            str(len(self.volumes)),
            *(x for s, t, ro in self.volumes for x in (str(s), t, "ro" if ro else "rw")),
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
    *,
    on_pid: Callable[[int], Awaitable[object]] | None = None,
) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    """Start the holder; return (the launcher process, the holder's host pid, the base's
    top-level directories left empty) once it is ready. Only a rootless holder leaves any: one
    with mounts below it cannot be layered without privileges.

    The launcher (it becomes ``unshare``) is our child: the caller keeps the Popen to reap it
    after destroy. It runs in its own session, so a signal to our process group never reaches
    a sandbox.

    ``on_pid(holder pid)`` runs as soon as the holder's namespaces exist, while it builds the
    root (the network link, say), and has finished, whatever happened, when this returns or
    raises: its exception, when the holder is ready, is raised (the holder killed).

    Raises:
        RuntimeError: the holder exited or did not become ready in ``timeout`` seconds (the
            message quotes its log); the caller kills the cgroups and cleans up.
    """
    popen, ready_r = _start(layout, layout.argv(tools, cgroup_procs), path_env)
    lines = _Lines(ready_r)
    early: asyncio.Future[object] | None = None
    try:
        async with asyncio.timeout(timeout):
            line = await lines.next()
            first = line.decode(errors="replace").split()
            if len(first) == 2 and first[0] == "pid" and first[1].isdigit():
                if on_pid is not None:
                    early = asyncio.ensure_future(on_pid(int(first[1])))
                line = await lines.next()
    except TimeoutError:
        line = b""
    except BaseException:  # cancelled: so is the early work (the caller tears everything down)
        if early is not None:
            early.cancel()
        raise
    finally:
        os.close(ready_r)
    failed: Exception | None = None
    if early is not None:  # never left running: it is waited for on every path
        try:
            await early
        except Exception as exc:  # raised below, once the holder is dealt with
            failed = exc
    if not line:  # EOF: the holder failed; give the launcher a moment to exit and say so
        await wait_exit(popen, 2.0)
    words = line.decode(errors="replace").split()
    if len(words) >= 2 and words[0] == "ready" and words[1].isdigit():
        if failed is None:
            return popen, int(words[1]), words[2:]
        await _kill(popen)
        raise failed
    reason = "timed out" if popen.poll() is None else f"exited with {popen.returncode}"
    await _kill(popen)
    tail = layout.log.read_text(errors="replace")[-2000:].strip()
    raise RuntimeError(f"sandbox holder {reason}: {tail or 'no output'}")


async def _kill(popen: subprocess.Popen[bytes]) -> None:
    """Kill the launcher's process group and reap it (the caller kills the cgroups too)."""
    with contextlib.suppress(OSError):
        os.killpg(popen.pid, 9)
    await wait_exit(popen, 5.0)


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


class _Lines:
    """Lines from ``fd`` without blocking the loop (what follows a line is kept for the next)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._buf = b""

    async def next(self) -> bytes:
        """The next line without its newline; b"" at EOF."""
        loop = asyncio.get_running_loop()
        while b"\n" not in self._buf:
            try:
                chunk = os.read(self._fd, 256)
            except BlockingIOError:
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_reader(self._fd, _set_once, ready)
                try:
                    await ready
                finally:
                    loop.remove_reader(self._fd)
                continue
            if not chunk:
                line, self._buf = self._buf, b""
                return line  # EOF: a last line without its newline, or b""
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line
