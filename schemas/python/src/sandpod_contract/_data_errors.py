"""The error codes of each data-plane operation, beyond its plane's (``catalogue.DATA.errors``).

The control and node planes list their codes on each :class:`~sandpod_contract.operations.Operation`
where the family declares it; the data-plane families are many and their codes follow a few
patterns (a family's ``not_found`` on every verb naming an id, the file codes on every verb taking
a path), so they are tabled here once and joined into the catalogue. ``subjects.json`` renders
every operation's list; ``tests/contract`` checks the table names every data-plane operation.
"""

from __future__ import annotations

from sandpod_contract import errors as e

__all__ = ["DATA_ERRORS"]

ErrorTuple = tuple[type[e.SandpodError], ...]

_PAUSED: ErrorTuple = (e.SandboxPaused,)  # verbs refused while the sandbox is frozen
_SPAWN: ErrorTuple = (e.SpawnFailed, e.CommandNotFound, e.InvalidCwd)
_STREAM: ErrorTuple = (e.ExecNotFound,)
# Every path-taking verb: the path may be bad, missing, of the wrong kind or not allowed.
_PATH: ErrorTuple = (
    e.FsInvalidPath,
    e.FsNotFound,
    e.FsNotADirectory,
    e.FsPermissionDenied,
    e.FsError,
)
_WRITE: ErrorTuple = (*_PATH, e.FsIsADirectory, e.FsAlreadyExists, e.FsNoSpace, e.FsTooLarge)
_UPLOAD: ErrorTuple = (e.FsUploadNotFound, *_WRITE)
_PROC: ErrorTuple = (e.ProcNotFound,)
_SESSION: ErrorTuple = (e.SessionNotFound,)
_PTY: ErrorTuple = (e.PtyNotFound,)
_GIT: ErrorTuple = (
    *_PAUSED,
    e.GitError,
    e.GitAuthFailed,
    e.GitNotFound,
    e.GitNetwork,
    e.GitTimeout,
    e.FsInvalidPath,
    e.FsNotFound,
    e.FsPermissionDenied,
)

DATA_ERRORS: dict[str, ErrorTuple] = {
    "sys.ping": (),
    "sys.info": (),
    "sys.metrics": (),
    "sys.activity": (),
    "sys.configure": (),
    "sys.freeze": (e.SandboxError,),
    "sys.thaw": (e.SandboxError,),
    "sys.freezer": (),
    "sys.snapshot": (e.SandboxError, e.FsError),
    "exec.run": (*_PAUSED, *_SPAWN, e.ExecIdInUse),
    "exec.fetch": _STREAM,
    "exec.start": (*_PAUSED, *_SPAWN, e.ExecIdInUse),
    "exec.ack": (),  # publish only: never answered
    "exec.stdin": (*_STREAM, e.StreamClosed),
    "exec.signal": _STREAM,
    "exec.cancel": _STREAM,
    "exec.resume": _STREAM,
    "exec.status": _STREAM,
    "fs.read": (*_PATH, e.FsIsADirectory, e.FsTooLarge),
    "fs.write": _WRITE,
    "fs.write_open": _WRITE,
    "fs.write_chunk": _UPLOAD,
    "fs.write_commit": _UPLOAD,
    "fs.write_abort": (e.FsUploadNotFound,),
    "fs.stat": _PATH,
    "fs.exists": (e.FsInvalidPath, e.FsPermissionDenied, e.FsError),
    "fs.list": _PATH,
    "fs.glob": _PATH,
    "fs.search": (*_PATH, e.FsTooLarge),
    "fs.replace": (*_WRITE,),
    "fs.mkdir": _WRITE,
    "fs.remove": (*_PATH, e.FsNotEmpty),
    "fs.move": (*_WRITE, e.FsNotEmpty),
    "fs.copy": _WRITE,
    "fs.chmod": _PATH,
    "fs.chown": _PATH,
    "proc.start": (*_PAUSED, *_SPAWN, e.ProcIdInUse),
    "proc.list": (),
    "proc.status": _PROC,
    "proc.wait": _PROC,
    "proc.logs": _PROC,
    "proc.signal": _PROC,
    "proc.kill": _PROC,
    "proc.remove": _PROC,
    "proc.wait_port": _PROC,
    "session.create": (*_PAUSED, e.SessionAlreadyExists, e.SessionError, *_SPAWN),
    "session.list": (),
    "session.status": _SESSION,
    "session.delete": _SESSION,
    "session.run": (*_PAUSED, *_SESSION, e.SessionDead, e.SessionError),
    "session.cancel": (*_SESSION, e.SessionError),
    "session.fetch": (*_SESSION, e.SessionError),
    "pty.open": (*_PAUSED, e.PtyIdInUse, *_SPAWN),
    "pty.input": (*_PTY, e.PtyClosed),
    "pty.read": _PTY,
    "pty.resize": (*_PTY, e.PtyClosed),
    "pty.signal": (*_PTY, e.PtyClosed),
    "pty.get": _PTY,
    "pty.list": (),
    "pty.close": _PTY,
    "watch.start": (e.WatchLimit, e.WatchError, *_PATH),
    "watch.poll": (e.WatchNotFound,),
    "watch.stop": (e.WatchNotFound,),
    "watch.list": (),
    "git.clone": (*_GIT, e.FsAlreadyExists),
    "git.checkout": _GIT,
    "git.status": _GIT,
    "git.diff": _GIT,
}
