"""Run a sandbox's commands inside its local-runtime jail (execd setting ``SANDPOD_EXECD_JAIL``).

The lifecycle's local runtime driver builds each sandbox around a *holder* process: pid 1 of the
sandbox's pid namespace, owner of its mount (copy-on-write root, ``/workspace``), uts, ipc, net
and cgroup namespaces, inside the sandbox's cgroups. It writes a jail file
(:class:`sandpod_service.jailfile.JailFile`, the one format both sides use). With a
:class:`Jail`, ``SandboxContext.command()`` turns every command into one that enters the
sandbox::

    execd (root) forks, from the event-loop thread, into the sandbox's pid namespace
      └ /bin/sh   joins the command's own cgroup <track>/c-<token> and the sandbox's others
        └ nsenter -F: mount, uts, ipc, net, cgroup namespaces; root; cwd; setgroups/gid/uid
          └ /bin/sh of the jail (already the sandbox's uid): restores the command's environment
            └ the command

Why each step: the fork lands in the pid namespace because :meth:`Jail.around_fork` switches
the loop thread's ``pid_ns_for_children`` for the duration of the ``Popen`` (and back), so the
process execd holds (its pid, pidfd, process group, exit status) *is* the command, not an
``nsenter`` parent that would die first on a signal. The loop thread also gets
``no_new_privs`` there (inherited, irreversible, harmless for a root daemon): no setuid binary
in the base can raise a sandboxed process's privileges. The cgroups are joined before anything
runs, so a fork bomb or a memory hog is limited from its first instruction, and the command's
own cgroup lets ``Process.kill_tree`` find strays that re-parented to the holder. The command's
environment must not reach the root steps as it is (``LD_PRELOAD`` from a request would run code
as root on the host): they get a fixed environment plus each variable wrapped as
``SANDPOD_JAIL_ENV_<i>=NAME=VALUE`` (names nothing reads), and the jail's shell, running as the
sandbox's user, unwraps them just before the command. Values never appear on a command line,
where any host user could read them.

Paths: a command sees the jail's root; ``/workspace`` is the workspace directory outside (the
same files). The host-side checks of a command (its cwd is a directory, its program an
executable) resolve through the jail's :class:`~sandpod_execd.files.rooted.Root` (``openat2``
with ``RESOLVE_IN_ROOT``: the kernel resolves links as the jail sees them, atomically), and the
command changes to its cwd only after entering the jail's root: the launcher starts in that
root, never in a host path a sandbox link could redirect. :meth:`Jail.host_path` (a path string
below ``/proc/<holder>/root``, symlinks resolved by hand) remains only as those checks' fallback
on kernels without ``openat2`` (a check, never a write; the command still enters its cwd inside
the jail). Everything execd creates or writes for a sandbox (files, session directories) goes
through :attr:`Jail.fs_root` and fails closed without ``openat2``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import posixpath
import re
import shutil
import stat
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import structlog

from sandpod_contract.errors import CommandNotFound, InvalidCwd, SandboxUnavailable, SpawnFailed
from sandpod_execd.cgstats import CgroupDirs
from sandpod_execd.files.identity import Identity, switch_supported
from sandpod_execd.files.rooted import Root, jail_root
from sandpod_execd.process import Command
from sandpod_service.jailfile import JailFile, JailFileInvalid, JailReservation, decode
from sandpod_service.procs import cgroup_join_file

__all__ = ["Jail"]

SWEEP_AFTER = 30.0  # seconds: an empty command cgroup younger than this may be starting

log = structlog.get_logger("sandpod.execd.jail")

WORKSPACE = "/workspace"
CLONE_NEWPID = 0x20000000
PR_SET_NO_NEW_PRIVS = 38
MAX_SYMLINKS = 40
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
LAUNCH_ENV = {"PATH": HOST_PATH, "LANG": "C"}  # all the root steps ever see
# Join each cgroup named before "--" (writing 0 moves the writer), raise a negative
# oom_score_adj (execd's) to 0 (sandbox processes are always fair game for its OOM killer),
# then exec the rest.
JOIN = (
    'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; '
    'read -r adj < /proc/self/oom_score_adj; [ "$adj" -ge 0 ] || '
    'echo 0 > /proc/self/oom_score_adj || exit 125; exec "$@"'
)
# Inside, as the sandbox's user: replace the launch environment by the command's ($1 variables).
UNWRAP = r"""
unset PATH LANG
SANDPOD_JAIL_I=0
while [ "$SANDPOD_JAIL_I" -lt "$1" ]; do
  eval "SANDPOD_JAIL_KV=\$SANDPOD_JAIL_ENV_$SANDPOD_JAIL_I"
  unset "SANDPOD_JAIL_ENV_$SANDPOD_JAIL_I"
  export "${SANDPOD_JAIL_KV%%=*}=${SANDPOD_JAIL_KV#*=}"
  SANDPOD_JAIL_I=$((SANDPOD_JAIL_I + 1))
done
unset SANDPOD_JAIL_I SANDPOD_JAIL_KV
shift
exec "$@"
"""
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_libc = ctypes.CDLL(None, use_errno=True)


@functools.cache
def _host_pidns() -> int:
    """execd's own pid namespace (opened once, kept open), to switch the thread back to."""
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


@functools.cache
def _fast_entry() -> str | None:
    """``sandpod-jail-exec`` (built from ``services/execd/native`` by ``make install``), found
    next to the interpreter or on PATH; None: the portable sh + nsenter chain is used."""
    beside = Path(sys.executable).parent / "sandpod-jail-exec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("sandpod-jail-exec")
    if found is None:
        log.warning(
            "jail_entry_degraded",
            reason="sandpod-jail-exec is not built: commands enter the jail through sh + "
            "nsenter WITHOUT a seccomp filter; install gcc and libseccomp-dev, then make install",
        )
    return found


def _no_new_privs() -> None:
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "prctl")


def _start_time(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2 :].split()[19])


class Jail:
    """One sandbox's jail, loaded from the driver's jail file."""

    seccomp = "default"  # the filter mode of its commands (the jail file's "seccomp")

    def __init__(self, record: JailFile, sandbox_id: str) -> None:
        if record.sandbox_id != sandbox_id:
            raise ValueError(
                f"the jail file is sandbox {record.sandbox_id!r}'s, not {sandbox_id!r}"
            )
        if record.phase != "running" or record.holder_pid is None:
            raise ValueError(f"sandbox {sandbox_id!r} is not running (phase {record.phase})")
        self.sandbox_id = sandbox_id
        self.holder: int = record.holder_pid
        self.holder_start = record.holder_start
        self.uid, self.gid = record.uid, record.gid
        self.userns = record.userns
        # The seccomp filter every command gets (see jail_exec.c).
        self.seccomp = record.seccomp
        self.join = record.join
        self.track = record.track
        self.workspace = record.workspace.outside
        self.upper = record.upper  # the root's writes
        self.cgroups = CgroupDirs.from_jail(record.cgroups)  # None: no cgroup (rootless)
        self.env = dict(record.env)
        self.workdir = record.workdir or WORKSPACE  # an image's WorkingDir, else /workspace
        self.image_shell = record.shell  # an image's shell (its Cmd, when that is a shell)
        self.root = f"/proc/{self.holder}/root"
        sh, nsenter = shutil.which("sh", path=HOST_PATH), shutil.which("nsenter", path=HOST_PATH)
        if sh is None or nsenter is None:
            raise ValueError("the jail needs sh and nsenter (util-linux) on the host")
        self._sh, self._nsenter = sh, nsenter
        if os.geteuid() != 0 and not self.userns:
            raise ValueError("entering a jail built as root needs root: run execd as root")
        # Opened before the identity check: if the holder is the right one now, this fd is its
        # pid namespace for good (a recycled pid can never redirect our forks).
        self._pidns = os.open(f"/proc/{self.holder}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.check()
            if not self.has_program("/bin/sh"):
                raise ValueError(f"sandbox {sandbox_id!r}: its root has no /bin/sh")
        except BaseException:
            self.close()
            raise

    @classmethod
    def load(cls, path: Path, sandbox_id: str) -> Jail:
        """Read the jail file at ``path``. Raises ValueError if it is unusable (a
        :class:`~sandpod_service.jailfile.JailFileInvalid` if it is not a jail file)."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read jail file {path}: {exc}") from exc
        return cls.from_record(decode(raw), sandbox_id)

    @classmethod
    def from_record(cls, record: JailFile | JailReservation, sandbox_id: str) -> Jail:
        """The jail of a decoded jail file. Raises ValueError unless it is ``sandbox_id``'s and
        running."""
        if isinstance(record, JailReservation):
            raise JailFileInvalid(f"sandbox {sandbox_id!r} is not running (phase reserved)")
        return cls(record, sandbox_id)

    def close(self) -> None:
        """Release the pid namespace handle (execd keeps its jails for its whole life)."""
        if self._pidns >= 0:
            os.close(self._pidns)
            self._pidns = -1

    def check(self) -> None:
        """Raise SandboxUnavailable unless the holder is alive (and still the same process)."""
        if _start_time(self.holder) != self.holder_start:
            raise SandboxUnavailable(
                f"sandbox {self.sandbox_id!r}: its jail is gone (holder {self.holder} exited)",
                sandbox_id=self.sandbox_id,
            )

    @property
    def owner(self) -> tuple[int, int] | None:
        """(uid, gid) to give files execd creates for the sandbox; None: they are already the
        sandbox's (rootless, our host uid is the sandbox's uid inside)."""
        return None if self.userns else (self.uid, self.gid)

    @functools.cached_property
    def identity(self) -> Identity | None:
        """Whose rights execd uses on the jail's files: its user's (uid, gid and no supplementary
        group, as its commands run). None where execd needs no switch, or cannot make one:
        rootless (our uid already is the sandbox's user inside the user namespace) or a sandbox
        that runs as root."""
        if self.userns or self.uid == 0 or not switch_supported():
            return None
        return Identity(self.uid, self.gid, ())

    # -- paths ---------------------------------------------------------------------------------

    def inside(self, cwd: str | None) -> str:
        """The absolute jail path for a request's cwd (default: the image's working directory,
        else the workspace; relative: below the workspace)."""
        if not cwd:
            return self.workdir
        joined = posixpath.join(WORKSPACE, cwd)  # an absolute cwd replaces the workspace
        return "/" + posixpath.normpath(joined).lstrip("/")

    def resolve(self, path: str) -> str:
        """``path`` (absolute, in the jail) with symlinks resolved as the jail sees them.

        A component that does not exist ends the resolution (the rest is kept as given).
        """
        todo = [p for p in path.split("/") if p not in ("", ".")]
        done: list[str] = []
        hops = 0
        while todo:
            part = todo.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            host = self.root + "/" + "/".join([*done, part])
            try:
                st = os.lstat(host)
            except (OSError, ValueError):
                return "/" + "/".join([*done, part, *todo])
            if not stat.S_ISLNK(st.st_mode):
                done.append(part)
                continue
            hops += 1
            if hops > MAX_SYMLINKS:
                return "/" + "/".join([*done, part, *todo])  # ELOOP: a path that won't exist
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p not in ("", ".")] + todo
        return "/" + "/".join(done)

    def host_path(self, path: str) -> str:
        """The host path showing what ``path`` (absolute, in the jail) shows inside."""
        resolved = self.resolve(path)
        if resolved == WORKSPACE or resolved.startswith(WORKSPACE + "/"):
            return str(self.workspace) + resolved[len(WORKSPACE) :]
        return self.root + resolved

    @functools.cached_property
    def fs_root(self) -> Root:
        """The jail's root as a :class:`Root` (opened on first use, kept for the jail's life).

        Raises:
            SandboxUnavailable: the jail is gone.
        """
        return jail_root(self)

    def _open_inside(self, path: str, flags: int) -> int | None:
        """A descriptor of ``path`` (absolute, in the jail) resolved by the kernel inside the
        jail's root; None if it does not resolve there."""
        root = self.fs_root
        try:
            if not root.usable:  # no openat2 (Linux < 5.6): the string walk is all there is
                return os.open(self.host_path(path), flags | os.O_CLOEXEC)
            return root.open(path, flags)
        except OSError:
            return None

    def has_program(self, path: str) -> bool:
        """Whether ``path`` (absolute, in the jail) is an executable file there."""
        fd = self._open_inside(path, os.O_PATH)
        if fd is None:
            return False
        try:
            # /proc/self/fd/N names the object resolved above and nothing else; effective ids:
            # the fs identity in force (the sandbox user's inside Root.acting), not the real uid.
            return stat.S_ISREG(os.fstat(fd).st_mode) and os.access(
                f"/proc/self/fd/{fd}", os.X_OK, effective_ids=True
            )
        finally:
            os.close(fd)

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` (absolute, in the jail) is a directory there."""
        fd = self._open_inside(path, os.O_PATH | os.O_DIRECTORY)
        if fd is not None:
            os.close(fd)
        return fd is not None

    def can_enter(self, path: str) -> bool:
        """Whether ``path`` (absolute, in the jail) is a directory the sandbox's user may enter
        (call inside ``fs_root.acting()`` for the user's rights)."""
        fd = self._open_inside(path, os.O_PATH | os.O_DIRECTORY)
        if fd is None:
            return False
        try:
            return os.access(f"/proc/self/fd/{fd}", os.X_OK, effective_ids=True)
        finally:
            os.close(fd)

    def _find_program(self, program: str, cwd: str, path_env: str) -> bool:
        if "/" in program:
            return self.has_program(posixpath.join(cwd, program))
        return any(self.has_program(posixpath.join(cwd, d, program)) for d in path_env.split(":"))

    # -- commands ------------------------------------------------------------------------------

    def command(
        self, argv: tuple[str, ...], cwd: str, env: Mapping[str, str], *, stdin: bool
    ) -> Command:
        """A Command that runs ``argv`` inside the jail in ``cwd`` (a jail path) with ``env``.

        ``cwd`` is checked in the jail's root and entered only inside it: the Command's own
        ``cwd`` (where the launcher starts on the host) is the jail's root, and its ``env`` the
        launch environment with ``env`` wrapped in it.

        Raises:
            SandboxUnavailable: the jail is gone.
            InvalidCwd: ``cwd`` is not a directory inside the jail.
            CommandNotFound: ``argv[0]`` is not an executable inside the jail.
            SpawnFailed: an environment variable name is not a shell name (the jail's shell
                could not set it).
        """
        self.check()
        bad = sorted(k for k in env if not NAME_RE.fullmatch(k))
        if bad:
            raise SpawnFailed(
                f"environment variable names must be letters, digits and _ in a jail: {bad[:5]}",
                program=argv[0] if argv else "",
            )
        inside = cwd  # resolved by the kernel in the jail's root, by the check and the chdir
        program = argv[0] if argv else ""
        # Checked with the sandbox user's rights (the launcher enters cwd before it drops root).
        with self.fs_root.acting():
            if not self.is_dir(inside):
                raise InvalidCwd(f"working directory {inside!r} does not exist", cwd=inside)
            if not self.can_enter(inside):
                raise InvalidCwd(
                    f"working directory {inside!r}: permission denied to the sandbox's user "
                    f"(uid {self.uid}); choose a directory it may enter",
                    cwd=inside,
                )
            found = (
                bool(program)
                and "=" not in program
                and self._find_program(program, inside, env.get("PATH", HOST_PATH))
            )
        if not found:
            raise CommandNotFound(f"{program!r}: command not found", program=program)
        own = self._command_cgroup() if self.track is not None else None
        joins = [cgroup_join_file(d) for d in (*([own] if own else []), *self.join)]
        helper = _fast_entry()
        # Rootless, the user namespace is entered first (it grants the rights to enter the
        # others) and the pid namespace too, by a fork in the entry step (see around_fork).
        if helper is not None:  # one small exec instead of sh -> nsenter -> sh
            launch: tuple[str, ...] = (
                helper,
                f"--seccomp={self.seccomp}",
                *(["--userns"] if self.userns else []),
                *joins,
                "--",
                str(self.holder),
                inside,
                str(self.uid),
                str(self.gid),
                "--",
                *argv,
            )
        else:  # no filter on this path: the Sandbox's Isolated condition says so (see _fast_entry)
            spaces = ("-U", "--preserve-credentials", "-p") if self.userns else ("-F",)
            launch = (
                self._sh,
                "-c",
                JOIN,
                "sandpod-jail",
                *joins,
                "--",
                self._nsenter,
                *spaces,
                "-t",
                str(self.holder),
                "-m",
                "-u",
                "-i",
                "-n",
                "-C",
                "-r",
                f"--wdns={inside}",
                "-S",
                str(self.uid),
                "-G",
                str(self.gid),
                "--",
                "/bin/sh",
                "-c",
                UNWRAP,
                "sandpod-env",
                str(len(env)),
                *argv,
            )
        wrapped = {f"SANDPOD_JAIL_ENV_{i}": f"{k}={v}" for i, (k, v) in enumerate(env.items())}
        return Command(
            argv=launch,
            cwd=self.root,  # not a path below it: a sandbox link could redirect that walk
            env={**LAUNCH_ENV, **wrapped},
            stdin=stdin,
            around_fork=None if self.userns else self.around_fork,
            cgroup=own,
        )

    def _command_cgroup(self) -> str:
        """A fresh cgroup for one command under ``track``; empty ones of finished commands are
        removed first, so their number stays bounded by the commands still running."""
        if self.track is None:  # callers ask only when the jail file names one
            raise SandboxUnavailable(
                f"sandbox {self.sandbox_id!r}: its jail has no tracking cgroup",
                sandbox_id=self.sandbox_id,
            )
        self.sweep()
        own = f"{self.track}/c-{uuid.uuid4().hex[:16]}"
        try:
            os.mkdir(own)
        except FileNotFoundError:
            raise SandboxUnavailable(
                f"sandbox {self.sandbox_id!r}: its cgroups are gone", sandbox_id=self.sandbox_id
            ) from None
        return own

    def sweep(self) -> None:
        """rmdir the command cgroups that no longer hold a process (busy ones refuse).

        One made in the last :data:`SWEEP_AFTER` seconds is left alone: it may belong to a
        command being started right now, whose process has not joined it yet (an empty cgroup
        then, which a concurrent command's sweep would otherwise remove under it)."""
        if self.track is None:
            return
        young = time.time() - SWEEP_AFTER
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.track):
                if entry.name.startswith("c-") and entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_ctime < young:
                            os.rmdir(entry.path)

    @contextlib.contextmanager
    def around_fork(self) -> Iterator[None]:
        """Make the calling thread's next fork land in the sandbox's pid namespace."""
        host = _host_pidns()
        _no_new_privs()
        _setns(self._pidns, CLONE_NEWPID)
        try:
            yield
        finally:
            _setns(host, CLONE_NEWPID)
