"""The jail file's one format (``sandpod_service.jailfile``): lifecycle writes it, execd reads it.

Pure: no jail is built. The integration tests (test_jail*.py) cover the two sides on real jails;
these pin the format itself: a round trip of every field, the version and unknown-field policy,
and that the writer and the reader agree on the set of fields.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from sandpod_execd.jail import Jail
from sandpod_service.jailfile import (
    JAIL_VERSION,
    JailCgroups,
    JailDisk,
    JailFile,
    JailFileInvalid,
    JailFileVersionMismatch,
    JailReservation,
    JailWorkspace,
    decode,
    encode,
)

# Every field set, none to its "empty" value, so a field the encoder drops or the decoder
# ignores changes the round trip. Adding a field to JailFile without a default breaks this
# constructor: the test then has to be updated with it.
FULL = JailFile(
    sandbox_id="sbx-1",
    phase="running",
    holder_pid=4242,
    holder_start=987654,
    uid=200_001,
    gid=200_002,
    join=("/sys/fs/cgroup/memory/sandpod/sbx-1", "/sys/fs/cgroup/pids/sandpod/sbx-1"),
    track="/sys/fs/cgroup/freezer/sandpod/sbx-1",
    cgroups=JailCgroups(
        core="/sys/fs/cgroup/freezer/sandpod/sbx-1",
        core_version=1,
        limits={"memory": (1, "/sys/fs/cgroup/memory/sandpod/sbx-1"), "pids": (2, "/x/pids")},
    ),
    workspace=JailWorkspace(inside="/workspace", outside=Path("/state/sbx-1/disk/workspace")),
    upper=Path("/state/sbx-1/disk/upper"),
    rootfs=Path("/srv/base"),
    layers=(Path("/img/layers/sha256/aa/fs"), Path("/img/layers/sha256/bb/fs")),
    image="localhost:5000/py@sha256:" + "c" * 64,
    workdir="/app",
    shell="/bin/bash",
    env={"LANG": "C.UTF-8", "EMPTY": ""},
    userns=True,
    protections={"seccomp": "active", "disk_quota": "unavailable: no loop devices"},
    notes=("rootless: one note",),
    seccomp="nested",
    disk=JailDisk(bytes=10 * 1024**3, mount=Path("/state/sbx-1/disk")),
)


def _fields(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _raw(**changes: Any) -> bytes:
    """FULL encoded, with top-level keys replaced (or removed, for the value ``...``)."""
    data = json.loads(encode(FULL))
    for key, value in changes.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data).encode()


def test_a_jail_file_round_trips_every_field() -> None:
    """decode(encode(x)) == x for a file with every field set, creating and running alike."""
    assert decode(encode(FULL)) == FULL
    creating = dataclasses.replace(
        FULL, phase="creating", holder_pid=None, holder_start=None, track=None, disk=None
    )
    assert decode(encode(creating)) == creating
    bare = dataclasses.replace(FULL, cgroups=JailCgroups(core=None, core_version=0, limits={}))
    assert decode(encode(bare)) == bare


def test_a_reservation_round_trips() -> None:
    """The first state (uid taken, nothing else) is a versioned file too."""
    stub = JailReservation(sandbox_id="sbx-1", uid=200_001)
    assert decode(encode(stub)) == stub
    assert json.loads(encode(stub)) == {
        "version": JAIL_VERSION,
        "phase": "reserved",
        "sandbox_id": "sbx-1",
        "uid": 200_001,
    }


def test_the_writer_writes_exactly_the_fields_the_reader_reads() -> None:
    """The encoded keys (at every level) are the dataclasses' fields plus ``version``: a field
    added to one side only fails here or in the round trip."""
    data = json.loads(encode(FULL))
    assert set(data) == _fields(JailFile) | {"version"}
    assert set(data["cgroups"]) == _fields(JailCgroups)
    assert set(data["workspace"]) == _fields(JailWorkspace)
    assert set(data["disk"]) == _fields(JailDisk)
    for key in _fields(JailFile):  # and the reader needs each one
        with pytest.raises(JailFileInvalid, match=repr(key)):
            decode(_raw(**{key: ...}))


@pytest.mark.parametrize("version", [None, 0, JAIL_VERSION + 1, "1", True])
def test_another_version_is_refused_with_a_typed_error(version: object) -> None:
    """An older, newer or missing version is a JailFileVersionMismatch naming what it found."""
    raw = _raw(version=...) if version is None else _raw(version=version)
    with pytest.raises(JailFileVersionMismatch) as refused:
        decode(raw)
    assert refused.value.found == version and refused.value.expected == JAIL_VERSION


def test_the_unversioned_stub_of_older_drivers_is_refused() -> None:
    """The old ``{"uid": N}`` reservation had no version: it is not silently read as one."""
    with pytest.raises(JailFileVersionMismatch):
        decode(b'{"uid": 200001}')


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (_raw(protocol="new"), "unknown field(s) protocol"),
        (
            _raw(cgroups={"core": None, "core_version": 0, "limits": {}, "extra": 1}),
            "unknown field(s) in 'cgroups': extra",
        ),
        (_raw(uid="200001"), "'uid' must be int"),
        (_raw(uid=True), "'uid' must be int"),
        (_raw(userns=1), "'userns' must be bool"),
        (_raw(phase="paused"), "'phase' is 'paused'"),
        (_raw(seccomp="off"), "'seccomp' is 'off'"),
        (_raw(join=["/a", 3]), "'join' is not a list of strings"),
        (_raw(env={"A": 1}), "'env' is not an object of strings"),
        (
            _raw(cgroups={"core": None, "core_version": 0, "limits": {"memory": [1]}}),
            "cgroup limit 'memory'",
        ),
    ],
)
def test_a_bad_file_is_refused_with_the_reason(raw: bytes, why: str) -> None:
    """Malformed, mistyped or unknown fields: JailFileInvalid whose reason names the field."""
    with pytest.raises(JailFileInvalid) as refused:
        decode(raw)
    assert why in refused.value.reason
    assert not isinstance(refused.value, JailFileVersionMismatch)


def test_execd_refuses_a_reservation_or_another_sandboxes_file() -> None:
    """The reader's own checks on top of the format: the right sandbox, and running."""
    with pytest.raises(ValueError, match="not running"):
        Jail.from_record(JailReservation(sandbox_id="sbx-1", uid=1), "sbx-1")
    with pytest.raises(ValueError, match="not running"):
        Jail.from_record(dataclasses.replace(FULL, phase="creating"), "sbx-1")
    with pytest.raises(ValueError, match="sandbox 'sbx-1'"):
        Jail.from_record(FULL, "sbx-2")
