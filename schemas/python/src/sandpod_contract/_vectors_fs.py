"""Hand-written schemagen inputs of the ``fs`` family (see ``_schemagen_data``)."""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract.codec import Message, pack
from sandpod_contract.messages.fs import (
    FsChmod,
    FsChown,
    FsChunk,
    FsCopy,
    FsEntry,
    FsExistence,
    FsGlob,
    FsList,
    FsListing,
    FsMatch,
    FsMkdir,
    FsMove,
    FsOwner,
    FsPath,
    FsRead,
    FsRemove,
    FsRemoved,
    FsReplace,
    FsReplaced,
    FsReplaceResult,
    FsSearch,
    FsSearchResult,
    FsSkipped,
    FsUpload,
    FsUploadRef,
    FsUploadStatus,
    FsWrite,
    FsWriteChunk,
    FsWriteCommit,
    FsWriteOpen,
)

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

_MODE = {"minimum": 0, "maximum": 0o7777}
_LIMIT = {"minimum": 1}
_ID_RULE = {"minLength": 1}
# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "fs.owner": {"uid": {"minimum": 0}, "gid": {"minimum": 0}},
    "fs.read": {"offset": {"minimum": 0}, "length": {"minimum": 0}, "max_size": {"minimum": 0}},
    "fs.write": {"mode": _MODE},
    "fs.write_open": {"mode": _MODE},
    "fs.write_chunk": {"upload_id": _ID_RULE, "offset": {"minimum": 0}},
    "fs.write_commit": {
        "upload_id": _ID_RULE,
        "size": {"minimum": 0},
        "sha256": {"pattern": "^[0-9a-fA-F]{64}$"},
    },
    "fs.upload_ref": {"upload_id": _ID_RULE},
    "fs.list": {"depth": {"minimum": 1}, "limit": _LIMIT},
    "fs.glob": {"pattern": {"minLength": 1}, "limit": _LIMIT},
    "fs.search": {"query": {"minLength": 1}, "limit": _LIMIT},
    "fs.replace": {"old": {"minLength": 1}, "count": {"minimum": 1}},
    "fs.mkdir": {"mode": _MODE},
    "fs.chmod": {"mode": _MODE},
}
# message TYPE -> whole-message JSON Schema keywords (e.g. oneOf required)
MESSAGE_RULES: dict[str, dict[str, Any]] = {
    # at least one of the four; a user by id or by name, not both; the same for the group
    "fs.owner": {
        "anyOf": [{"required": [k]} for k in ("uid", "gid", "user", "group")],
        "allOf": [{"not": {"required": ["uid", "user"]}}, {"not": {"required": ["gid", "group"]}}],
    },
}

_UP = "3f9c2a7d5e8b4c1fa06b2d9e7c4a1f35"
_SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
_MiB = 1024 * 1024
_T = 1732900000.125
_ENTRY = FsEntry(
    name="main.py",
    path="/workspace/src/main.py",
    type="file",
    size=2048,
    mode=0o644,
    permissions="-rw-r--r--",
    uid=1000,
    gid=1000,
    owner="agent",
    group="agent",
    mtime=_T,
)
_DIR = FsEntry(
    name="src",
    path="/workspace/src",
    type="dir",
    size=4096,
    mode=0o755,
    permissions="drwxr-xr-x",
    uid=1000,
    gid=1000,
    owner="agent",
    group="agent",
    mtime=_T,
)
_LINK = FsEntry(
    name="latest",
    path="/workspace/latest",
    type="symlink",
    size=7,
    mode=0o777,
    permissions="lrwxrwxrwx",
    uid=1000,
    gid=1000,
    owner="agent",
    group="agent",
    mtime=_T,
    target="src/app",
)
_BARE = FsEntry(
    name="data.bin",
    path="/workspace/data.bin",
    type="file",
    size=0,
    mode=0o600,
    permissions="-rw-------",
    uid=4242,
    gid=4242,
    mtime=0.0,
)
_OWNER = FsOwner(user="agent", group="staff")

# message TYPE -> [(label, instance)]: "full" first (every field set), then variants, "minimal"
EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "fs.read": [
        (
            "full",
            FsRead(path="/workspace/data.bin", offset=524288, length=524288, max_size=64 * _MiB),
        ),
        ("minimal", FsRead(path="notes.txt")),
    ],
    "fs.chunk": [
        (
            "basic",
            FsChunk(data=b"\x00\x01binary\xff", offset=524288, size=524297, eof=True, mtime=_T),
        ),
        ("proc-file", FsChunk(data=b"MemTotal: 2 kB\n", offset=0, size=0, eof=True, mtime=0.0)),
        ("more-follows", FsChunk(data=b"hello ", offset=0, size=11, eof=False, mtime=_T)),
    ],
    "fs.write": [
        (
            "full",
            FsWrite(
                path="/workspace/bin/run.sh",
                data=b"#!/bin/sh\necho hi\n",
                mode=0o755,
                owner=FsOwner(uid=1000, gid=1000),
                make_parents=False,
                exclusive=True,
            ),
        ),
        ("minimal", FsWrite(path="notes.txt")),
    ],
    "fs.write_open": [
        (
            "full",
            FsWriteOpen(
                path="/workspace/data/big.tar",
                mode=0o600,
                owner=_OWNER,
                make_parents=True,
                exclusive=True,
            ),
        ),
        ("minimal", FsWriteOpen(path="big.tar")),
    ],
    "fs.upload": [("basic", FsUpload(upload_id=_UP, chunk_size=512 * 1024, idle_timeout=60.0))],
    "fs.write_chunk": [
        ("basic", FsWriteChunk(upload_id=_UP, offset=524288, data=b"\x1f\x8b\x08\x00")),
    ],
    "fs.upload_status": [("basic", FsUploadStatus(upload_id=_UP, received=524292))],
    "fs.write_commit": [
        ("full", FsWriteCommit(upload_id=_UP, size=524292, sha256=_SHA)),
        ("minimal", FsWriteCommit(upload_id=_UP)),
    ],
    "fs.upload_ref": [("basic", FsUploadRef(upload_id=_UP))],
    "fs.entry": [
        ("full", _LINK),
        ("file", _ENTRY),
        ("minimal", _BARE),
    ],
    "fs.path": [
        ("full", FsPath(path="/workspace/latest", follow=True)),
        ("minimal", FsPath(path="src")),
    ],
    "fs.existence": [
        ("full", FsExistence(path="/workspace/src", exists=True, type="dir")),
        ("minimal", FsExistence(path="/workspace/nope", exists=False)),
    ],
    "fs.list": [
        (
            "full",
            FsList(path="/workspace", depth=3, hidden=False, limit=500, cursor="src/app/models.py"),
        ),
        ("minimal", FsList(path="/workspace")),
    ],
    "fs.listing": [
        (
            "full",
            FsListing(
                path="/workspace",
                entries=(_LINK, _DIR, _ENTRY),
                truncated=True,
                cursor="src/main.py",
            ),
        ),
        ("minimal", FsListing(path="/workspace/empty")),
    ],
    "fs.glob": [
        (
            "full",
            FsGlob(pattern="**/*.py", path="/workspace/src", hidden=True, type="file", limit=100),
        ),
        ("minimal", FsGlob(pattern="*.md")),
    ],
    "fs.search": [
        (
            "full",
            FsSearch(
                query=r"def \w+\(self",
                path="/workspace/src",
                glob="**/*.py",
                regex=True,
                case_sensitive=False,
                hidden=True,
                binary=True,
                limit=50,
            ),
        ),
        ("minimal", FsSearch(query="TODO")),
    ],
    "fs.search_result": [
        (
            "full",
            FsSearchResult(
                matches=(
                    FsMatch(
                        path="/workspace/src/main.py", line=12, column=5, text="    # TODO: retry"
                    ),
                ),
                files_scanned=31,
                truncated=True,
            ),
        ),
        ("minimal", FsSearchResult()),
    ],
    "fs.replace": [
        (
            "full",
            FsReplace(
                path="/workspace/src",
                old=r"print\((.*)\)",
                new=r"log(\1)",
                glob="**/*.py",
                regex=True,
                count=10,
                hidden=True,
                binary=True,
                dry_run=True,
            ),
        ),
        ("minimal", FsReplace(path="README.md", old="colour", new="color")),
    ],
    "fs.replace_result": [
        (
            "full",
            FsReplaceResult(
                files=(FsReplaced(path="/workspace/src/main.py", count=3),),
                total=3,
                skipped=(FsSkipped(path="/workspace/src/logo.png", reason="binary"),),
                truncated=True,
            ),
        ),
        ("minimal", FsReplaceResult()),
    ],
    "fs.mkdir": [
        ("full", FsMkdir(path="/workspace/a/b/c", parents=False, mode=0o700, owner=_OWNER)),
        ("minimal", FsMkdir(path="build")),
    ],
    "fs.remove": [
        ("full", FsRemove(path="/workspace/build", recursive=True, missing_ok=True)),
        ("minimal", FsRemove(path="old.txt")),
    ],
    "fs.removed": [("basic", FsRemoved(path="/workspace/build", existed=True))],
    "fs.move": [
        (
            "full",
            FsMove(
                src="/workspace/a.txt",
                dst="/workspace/archive/a.txt",
                overwrite=True,
                make_parents=True,
            ),
        ),
        ("minimal", FsMove(src="a.txt", dst="b.txt")),
    ],
    "fs.copy": [
        (
            "full",
            FsCopy(
                src="/workspace/src",
                dst="/workspace/src.bak",
                recursive=True,
                overwrite=True,
                make_parents=True,
            ),
        ),
        ("minimal", FsCopy(src="a.txt", dst="b.txt")),
    ],
    "fs.chmod": [
        ("full", FsChmod(path="/workspace/bin", mode=0o755, recursive=True)),
        ("minimal", FsChmod(path="run.sh", mode=0o700)),
    ],
    "fs.chown": [
        ("full", FsChown(path="/workspace/data", owner=FsOwner(uid=1000, gid=100), recursive=True)),
        ("minimal", FsChown(path="data", owner=FsOwner(user="agent"))),
    ],
    # nested messages (inside the replies and requests above)
    "fs.owner": [
        ("names", FsOwner(user="agent", group="staff")),
        ("ids", FsOwner(uid=1000, gid=100)),
        ("minimal", FsOwner(uid=1000)),
    ],
    "fs.match": [
        (
            "basic",
            FsMatch(
                path="/workspace/src/main.py", line=12, column=5, text="    return parse(args)"
            ),
        )
    ],
    "fs.replaced": [("basic", FsReplaced(path="/workspace/src/main.py", count=3))],
    "fs.skipped": [("basic", FsSkipped(path="/workspace/src/logo.png", reason="binary"))],
}

# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = [
    (
        "nested-unknown-fields",
        FsWrite,
        {"v": 1, "path": "a", "owner": {"v": 1, "uid": 0, "selinux": "x"}, "xattrs": {}},
        "unknown fields are ignored inside nested messages too",
    ),
]

_R = {"v": 1, "path": "a.txt"}
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    ("negative-offset", FsRead, pack({**_R, "offset": -1}), "bad_request", True, "offset >= 0"),
    (
        "mode-too-big",
        FsWrite,
        pack({**_R, "mode": 0o10000}),
        "bad_request",
        True,
        "mode is permission bits only (0..0o7777)",
    ),
    (
        "str-for-data",
        FsWrite,
        pack({**_R, "data": "text"}),
        "bad_request",
        False,
        "file content is bin, never str",
    ),
    (
        "empty-owner",
        FsWrite,
        pack({**_R, "owner": {"v": 1}}),
        "bad_request",
        True,
        "an owner names a user or a group",
    ),
    (
        "uid-and-user",
        FsChown,
        pack({**_R, "owner": {"v": 1, "uid": 0, "user": "root"}}),
        "bad_request",
        True,
        "uid or user, not both",
    ),
    (
        "bad-sha256",
        FsWriteCommit,
        pack({"v": 1, "upload_id": _UP, "sha256": "abc"}),
        "bad_request",
        True,
        "sha256 is 64 hex digits",
    ),
    ("depth-zero", FsList, pack({**_R, "depth": 0}), "bad_request", True, "depth >= 1"),
    (
        "bad-type",
        FsGlob,
        pack({"v": 1, "pattern": "*", "type": "socket"}),
        "bad_request",
        True,
        "type is file, dir, symlink or other",
    ),
    (
        "empty-old",
        FsReplace,
        pack({**_R, "old": "", "new": "x"}),
        "bad_request",
        True,
        "nothing to replace",
    ),
]
# one error per code of this family
ERRORS: list[errors.SandpodError] = [
    errors.FsError(),
    errors.FsNotFound("/workspace/nope.txt: no such file or directory", path="/workspace/nope.txt"),
    errors.FsAlreadyExists("/workspace/a exists", path="/workspace/a"),
    errors.FsIsADirectory("/workspace/src is a directory", path="/workspace/src"),
    errors.FsNotADirectory(
        "/workspace/f.txt/x: f.txt is not a directory", path="/workspace/f.txt/x"
    ),
    errors.FsPermissionDenied("/etc/shadow: permission denied", path="/etc/shadow"),
    errors.FsTooLarge(
        "file of 3221225472 bytes exceeds 1073741824; read it in ranges",
        size=3221225472,
        limit=1073741824,
    ),
    errors.FsInvalidPath("path contains a NUL byte"),
    errors.FsNotEmpty("/workspace/dir is not empty", path="/workspace/dir"),
    errors.FsNoSpace("no space left on device"),
    errors.FsUploadNotFound(f"no upload {_UP} (committed, aborted or idle for 60s)", upload_id=_UP),
]
