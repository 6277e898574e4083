"""Hand-written schemagen inputs of the ``fs`` family (see ``_schemagen_data``)."""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract.codec import Message

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {}
# message TYPE -> whole-message JSON Schema keywords (e.g. oneOf required)
MESSAGE_RULES: dict[str, dict[str, Any]] = {}
# message TYPE -> [(label, instance)]: "full" first (every field set), then variants, "minimal"
EXAMPLES: dict[str, list[tuple[str, Message]]] = {}
# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = []
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = []
# one error per code of this family
ERRORS: list[errors.SandpodError] = [
    errors.FsError(),
    errors.FsNotFound("/workspace/nope.txt: no such file or directory", path="/workspace/nope.txt"),
    errors.FsAlreadyExists("/workspace/a exists", path="/workspace/a"),
    errors.FsIsADirectory("/workspace/src is a directory", path="/workspace/src"),
    errors.FsNotADirectory("/workspace/f.txt/x: f.txt is not a directory",
                           path="/workspace/f.txt/x"),
    errors.FsPermissionDenied("/etc/shadow: permission denied", path="/etc/shadow"),
    errors.FsTooLarge("file of 3221225472 bytes exceeds 1073741824; read it in ranges",
                      size=3221225472, limit=1073741824),
    errors.FsInvalidPath("path contains a NUL byte"),
    errors.FsNotEmpty("/workspace/dir is not empty", path="/workspace/dir"),
    errors.FsNoSpace("no space left on device"),
]  # fmt: skip
