"""Hand-written schemagen inputs of the ``git`` family (see ``_schemagen_data``)."""

from __future__ import annotations

from typing import Any

from sandpod_contract import errors
from sandpod_contract._patterns import NO_NUL as _NO_NUL
from sandpod_contract._patterns import NUL, SPACE
from sandpod_contract.codec import Message, pack
from sandpod_contract.messages.git import (
    GitCheckout,
    GitClone,
    GitDiff,
    GitEntry,
    GitHead,
    GitPatch,
    GitRepo,
    GitStatus,
)

__all__ = ["ACCEPT", "ERRORS", "EXAMPLES", "MESSAGE_RULES", "REJECT", "RULES"]

_REF: dict[str, Any] = {"minLength": 1, "pattern": f"^[^-{SPACE}][^{SPACE}]*$"}
_TIMEOUT: dict[str, Any] = {"exclusiveMinimum": 0}
# message TYPE -> field -> JSON Schema keywords for rules __post_init__ enforces
RULES: dict[str, dict[str, dict[str, Any]]] = {
    "git.clone": {
        "url": {"minLength": 1, "pattern": f"^[^-][^{NUL}]*$"},
        "target": {"pattern": _NO_NUL},
        "username": {"pattern": _NO_NUL},
        "token": {"pattern": _NO_NUL},
        "branch": _REF,
        "ref": _REF,
        "depth": {"minimum": 1},
        "timeout": _TIMEOUT,
    },
    "git.checkout": {"path": {"pattern": _NO_NUL}, "ref": _REF, "timeout": _TIMEOUT},
    "git.repo": {"path": {"pattern": _NO_NUL}, "timeout": _TIMEOUT},
    "git.diff": {
        "path": {"pattern": _NO_NUL},
        "file": {"pattern": _NO_NUL},
        "max_bytes": {"minimum": 1},
        "timeout": _TIMEOUT,
    },
}
# message TYPE -> whole-message JSON Schema keywords (e.g. oneOf required)
MESSAGE_RULES: dict[str, dict[str, Any]] = {}

_SAMPLE_CREDENTIAL = "example-not-a-real-secret"  # what a token field carries
_SHA = "9fceb02d0ae598e95dc970b74767f19372d61af8"
_DIFF = (
    "diff --git a/app.py b/app.py\nindex 3b18e51..a3c2f1e 100644\n--- a/app.py\n+++ b/app.py\n"
    "@@ -1 +1 @@\n-print('hello')\n+print('hello, world')\n"
)
# message TYPE -> [(label, instance)]: "full" first (every field set), then variants, "minimal"
EXAMPLES: dict[str, list[tuple[str, Message]]] = {
    "git.clone": [
        (
            "full",
            GitClone(
                url="https://github.com/example/app.git",
                target="/workspace/app",
                branch="main",
                ref=_SHA,
                depth=1,
                username="x-access-token",
                token=_SAMPLE_CREDENTIAL,
                timeout=300.0,
            ),
        ),
        ("minimal", GitClone(url="https://github.com/example/app.git")),
    ],
    "git.checkout": [
        (
            "full",
            GitCheckout(path="/workspace/app", ref="feature/login", create=True, timeout=30.0),
        ),
        ("minimal", GitCheckout(path="/workspace/app", ref="v1.2.0")),
    ],
    "git.head": [
        (
            "full",
            GitHead(
                path="/workspace/app",
                commit=_SHA,
                branch="main",
                url="https://***@github.com/example/app.git",
                duration=2.5,
            ),
        ),
        ("minimal", GitHead(path="/workspace/app", commit=_SHA)),
    ],
    "git.repo": [
        ("full", GitRepo(path="/workspace/app", timeout=10.0)),
        ("minimal", GitRepo(path="/workspace/app")),
    ],
    "git.status": [
        (
            "full",
            GitStatus(
                path="/workspace/app",
                commit=_SHA,
                branch="main",
                upstream="origin/main",
                ahead=2,
                behind=1,
                truncated=False,
                entries=(
                    GitEntry(path="app.py", state="modified", index=".", worktree="M"),
                    GitEntry(path="new.py", state="added", index="A", worktree="."),
                    GitEntry(
                        path="docs/guide.md",
                        state="renamed",
                        index="R",
                        worktree=".",
                        orig_path="guide.md",
                    ),
                    GitEntry(path="notes.txt", state="untracked", index="?", worktree="?"),
                ),
            ),
        ),
        ("minimal", GitStatus(path="/workspace/app")),
    ],
    "git.diff": [
        (
            "full",
            GitDiff(
                path="/workspace/app", file="app.py", staged=True, max_bytes=65536, timeout=10.0
            ),
        ),
        ("minimal", GitDiff(path="/workspace/app")),
    ],
    "git.patch": [
        ("full", GitPatch(path="/workspace/app", text=_DIFF, size=len(_DIFF), truncated=False)),
        (
            "truncated",
            GitPatch(path="/workspace/app", text=_DIFF[:40], size=5_000_000, truncated=True),
        ),
        ("minimal", GitPatch(path="/workspace/app", text="")),
    ],
    # nested in git.status
    "git.entry": [
        (
            "renamed",
            GitEntry(
                path="docs/guide.md",
                state="renamed",
                index="R",
                worktree=".",
                orig_path="docs/old.md",
            ),
        ),
        ("minimal", GitEntry(path="app.py", state="modified")),
    ],
}
# (label, type, non-canonical map a decoder must accept, why)
ACCEPT: list[tuple[str, type[Message], dict[str, Any], str]] = []
# (label, type, payload, error code, a JSON Schema validator catches it too, why)
REJECT: list[tuple[str, type[Message], bytes, str, bool, str]] = [
    ("empty-url", GitClone, pack({"v": 1, "url": ""}), "bad_request", True, "url is required"),
    (
        "option-url",
        GitClone,
        pack({"v": 1, "url": "--upload-pack=touch /tmp/x"}),
        "bad_request",
        True,
        "a url never starts with '-' (it would be read as an option)",
    ),
    (
        "option-branch",
        GitClone,
        pack({"v": 1, "url": "/srv/repo", "branch": "-b"}),
        "bad_request",
        True,
        "a branch never starts with '-'",
    ),
    (
        "zero-depth",
        GitClone,
        pack({"v": 1, "url": "/srv/repo", "depth": 0}),
        "bad_request",
        True,
        "depth >= 1",
    ),
    (
        "ref-with-space",
        GitCheckout,
        pack({"v": 1, "path": "/workspace/app", "ref": "a b"}),
        "bad_request",
        True,
        "refs have no whitespace",
    ),
    (
        "nul-in-file",
        GitDiff,
        pack({"v": 1, "path": "/workspace/app", "file": "a\x00"}),
        "bad_request",
        True,
        "no NUL in paths",
    ),
]
# one error per code of this family
ERRORS: list[errors.SandpodError] = [
    errors.GitError(),
    errors.GitAuthFailed("authentication failed for https://***@example.com/repo.git"),
    errors.GitNotFound("remote branch 'nope' not found", ref="nope"),
    errors.GitNetwork("could not resolve host example.invalid"),
    errors.GitTimeout("git clone exceeded 120s", timeout=120.0),
]
