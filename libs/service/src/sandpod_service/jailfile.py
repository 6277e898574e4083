"""The jail file: what the local runtime (lifecycle) tells execd about one sandbox's jail.

Two processes share it: ``sandpod_lifecycle.runtime.local`` writes ``<state>/<id>/jail.json``
and ``sandpod_execd.jail`` (through ``sandpod_execd.jailfile``, which checks who could have
written it) reads it to run commands inside the jail. Both are services and may not import each
other, so the format lives here, below both, as one frozen dataclass with :func:`encode` and
:func:`decode`; neither side ever handles the raw dict.

The file goes through three states, each written whole (write to a temporary file, rename):

    reserved   :class:`JailReservation`: the directory and the sandbox's uid are taken (under
               the state dir's lock), nothing else exists yet
    creating   :class:`JailFile`, ``holder_pid`` None: cgroups and directories being made
    running    :class:`JailFile` with the holder's pid and start time: execd may serve it

Policy: the file is JSON carrying ``version`` (:data:`JAIL_VERSION`). Any change of a field, its
type or its meaning bumps the version. :func:`decode` refuses a file of another version
(:class:`JailFileVersionMismatch`: older or newer, the reader cannot know what it would miss)
and a file with a missing, mistyped **or unknown** field (:class:`JailFileInvalid`): execd is
root and the file describes its confinement, so a field it does not understand (a protection a
newer writer added, say) must stop it rather than be ignored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args

__all__ = [
    "JAIL_VERSION",
    "SECCOMP_MODES",
    "JailCgroups",
    "JailDisk",
    "JailFile",
    "JailFileInvalid",
    "JailFileVersionMismatch",
    "JailReservation",
    "JailWorkspace",
    "decode",
    "encode",
]

JAIL_VERSION = 2  # 2: an image's layers, working directory and shell
SeccompMode = Literal["default", "nested", "unconfined"]  # see lifecycle's runtime/seccomp.py
SECCOMP_MODES: tuple[str, ...] = get_args(SeccompMode)
Phase = Literal["creating", "running"]
PHASES: tuple[str, ...] = get_args(Phase)
RESERVED = "reserved"
T = TypeVar("T")


class JailFileInvalid(ValueError):
    """The bytes are not a jail file of this version: not JSON, not an object, or a field is
    missing, of the wrong type or unknown. ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JailFileVersionMismatch(JailFileInvalid):
    """A jail file of another ``version`` (``found``; None: it has none) than ``expected``."""

    def __init__(self, found: object) -> None:
        super().__init__(f"jail file version {found!r}, this reader knows {JAIL_VERSION}")
        self.found = found
        self.expected = JAIL_VERSION


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JailCgroups:
    """The sandbox's cgroup directories: ``core`` freezes and tracks (commands go in its
    ``c-<token>`` children; None: no cgroup does, rootless without delegation), ``limits`` maps
    each limit role (memory, cpu, pids) to (cgroup version, directory)."""

    core: str | None
    core_version: int
    limits: Mapping[str, tuple[int, str]]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JailWorkspace:
    """The workspace: ``inside`` the jail (``/workspace``) and the same files ``outside``."""

    inside: str
    outside: Path


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JailDisk:
    """The sandbox's own filesystem (disk quota): its size and where it is mounted."""

    bytes: int
    mount: Path


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JailReservation:
    """The first state of a sandbox's directory: its uid is taken, nothing else exists."""

    sandbox_id: str
    uid: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JailFile:
    """One sandbox's jail, being created or running.

    Attributes:
        holder_pid, holder_start: the holder (pid 1 of the sandbox) and its start time in
            clock ticks (``/proc/<pid>/stat``): together a unique identity; None while creating.
        join: cgroup directories every command joins directly; ``track``: the one whose
            ``c-<token>`` child it also joins (freezer and tracking; None: none).
        upper: the writable layer; ``rootfs``: the read-only base (the top layer's directory
            when the base is an image); ``layers``: the image's layers, bottom first (empty:
            ``rootfs`` is the whole base); ``image``: which image (``reference@digest``).
        workdir, shell: the image's working directory and shell (None: ``/workspace``, and
            execd's own choice of shell).
        userns: built in a user namespace (rootless): our host uid is the sandbox's uid inside.
        protections: name -> ``"active"`` or why not; ``notes``: what the user should know.
        disk: the disk quota, None without one.
    """

    sandbox_id: str
    phase: Phase
    holder_pid: int | None
    holder_start: int | None
    uid: int
    gid: int
    join: tuple[str, ...]
    track: str | None
    cgroups: JailCgroups
    workspace: JailWorkspace
    upper: Path
    rootfs: Path
    layers: tuple[Path, ...]
    image: str | None
    workdir: str | None
    shell: str | None
    env: Mapping[str, str]
    userns: bool
    protections: Mapping[str, str]
    notes: tuple[str, ...]
    seccomp: SeccompMode
    disk: JailDisk | None


def encode(record: JailFile | JailReservation) -> bytes:
    """The file's bytes (JSON, ``version`` included, keys sorted)."""
    if isinstance(record, JailReservation):
        data: dict[str, Any] = {"phase": RESERVED, **dataclasses.asdict(record)}
    else:
        data = dataclasses.asdict(record)
    data["version"] = JAIL_VERSION
    return json.dumps(data, indent=1, sort_keys=True, default=_plain).encode()


def _plain(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not part of the jail file")


def decode(raw: bytes | str) -> JailFile | JailReservation:
    """Parse a jail file (see the module's policy).

    Raises:
        JailFileVersionMismatch: its ``version`` is not :data:`JAIL_VERSION`.
        JailFileInvalid: not JSON, not an object, or a field missing, mistyped or unknown.
    """
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise JailFileInvalid(f"not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise JailFileInvalid("not a JSON object")
    version = data.pop("version", None)
    if type(version) is not int or version != JAIL_VERSION:
        raise JailFileVersionMismatch(version)
    if data.get("phase") == RESERVED:
        del data["phase"]
        _only(data, JailReservation, "")
        return JailReservation(sandbox_id=_get(data, "sandbox_id", str), uid=_int(data, "uid"))
    _only(data, JailFile, "")
    return JailFile(
        sandbox_id=_get(data, "sandbox_id", str),
        phase=cast("Phase", _choice(data, "phase", PHASES)),
        holder_pid=_opt(data, "holder_pid", _int),
        holder_start=_opt(data, "holder_start", _int),
        uid=_int(data, "uid"),
        gid=_int(data, "gid"),
        join=_strings(data, "join"),
        track=_opt(data, "track", _str),
        cgroups=_cgroups(_object(data, "cgroups", JailCgroups)),
        workspace=_workspace(_object(data, "workspace", JailWorkspace)),
        upper=Path(_get(data, "upper", str)),
        rootfs=Path(_get(data, "rootfs", str)),
        layers=tuple(Path(p) for p in _strings(data, "layers")),
        image=_opt(data, "image", _str),
        workdir=_opt(data, "workdir", _str),
        shell=_opt(data, "shell", _str),
        env=_str_map(data, "env"),
        userns=_get(data, "userns", bool),
        protections=_str_map(data, "protections"),
        notes=_strings(data, "notes"),
        seccomp=cast("SeccompMode", _choice(data, "seccomp", SECCOMP_MODES)),
        disk=_opt(data, "disk", _disk),
    )


# -- field readers: each raises JailFileInvalid naming the field ------------------------------


def _only(data: Mapping[str, Any], cls: type[Any], where: str) -> None:
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise JailFileInvalid(f"unknown field(s) {where}{', '.join(sorted(unknown))}")


def _get(data: Mapping[str, Any], key: str, kind: type[T]) -> T:
    if key not in data:
        raise JailFileInvalid(f"missing field {key!r}")
    value = data[key]
    # bool is an int to Python, never to the format
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise JailFileInvalid(f"field {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _int(data: Mapping[str, Any], key: str) -> int:
    return _get(data, key, int)


def _str(data: Mapping[str, Any], key: str) -> str:
    return _get(data, key, str)


def _opt(
    data: Mapping[str, Any], key: str, read: Callable[[Mapping[str, Any], str], T]
) -> T | None:
    if key not in data:
        raise JailFileInvalid(f"missing field {key!r}")
    return None if data[key] is None else read(data, key)


def _choice(data: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = _str(data, key)
    if value not in allowed:
        raise JailFileInvalid(f"field {key!r} is {value!r}, not one of {', '.join(allowed)}")
    return value


def _strings(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    items = _get(data, key, list)
    if not all(isinstance(i, str) for i in items):
        raise JailFileInvalid(f"field {key!r} is not a list of strings")
    return tuple(items)


def _str_map(data: Mapping[str, Any], key: str) -> dict[str, str]:
    items = _get(data, key, dict)
    if not all(isinstance(v, str) for v in items.values()):
        raise JailFileInvalid(f"field {key!r} is not an object of strings")
    return dict(items)


def _object(data: Mapping[str, Any], key: str, cls: type[Any]) -> dict[str, Any]:
    inner: dict[str, Any] = _get(data, key, dict)
    _only(inner, cls, f"in {key!r}: ")
    return inner


def _cgroups(data: Mapping[str, Any]) -> JailCgroups:
    limits: dict[str, tuple[int, str]] = {}
    for role, pair in _get(data, "limits", dict).items():
        ok = isinstance(pair, list) and len(pair) == 2
        if not ok or type(pair[0]) is not int or not isinstance(pair[1], str):
            raise JailFileInvalid(f"cgroup limit {role!r} is not [version, directory]: {pair!r}")
        limits[role] = (pair[0], pair[1])
    return JailCgroups(
        core=_opt(data, "core", _str), core_version=_int(data, "core_version"), limits=limits
    )


def _workspace(data: Mapping[str, Any]) -> JailWorkspace:
    return JailWorkspace(inside=_str(data, "inside"), outside=Path(_str(data, "outside")))


def _disk(data: Mapping[str, Any], key: str) -> JailDisk:
    inner = _object(data, key, JailDisk)
    return JailDisk(bytes=_int(inner, "bytes"), mount=Path(_str(inner, "mount")))
