"""git helpers on their own: credentials out of URLs, scrubbing, error classes, porcelain v2."""

from __future__ import annotations

import pytest

from sandpod_contract.errors import GitAuthFailed, GitError, GitNetwork, GitNotFound
from sandpod_execd.gitcreds import Scrubber, is_remote, split_credentials
from sandpod_execd.gitops import classify, parse_status
from sandpod_execd.handlers.git import _repo_name


def test_split_credentials_decodes_and_removes_userinfo() -> None:
    """user:token@ leaves the URL; percent-escapes in them are decoded."""
    assert split_credentials("https://al%40ice:p%2Fw@host:8443/o/r.git") == (
        "https://host:8443/o/r.git",
        "al@ice",
        "p/w",
    )
    assert split_credentials("https://tok@host/r.git") == ("https://host/r.git", "tok", None)
    assert split_credentials("git@github.com:o/r.git") == ("git@github.com:o/r.git", None, None)
    assert split_credentials("/srv/repo") == ("/srv/repo", None, None)


def test_remote_or_local() -> None:
    """URLs and scp-like host:path are remote; paths are local."""
    assert is_remote("https://h/r") and is_remote("git@h:r.git") and is_remote("file:///r")
    assert not is_remote("/srv/r") and not is_remote("relative/r")


def test_scrubber_removes_userinfo_and_secrets_in_every_form() -> None:
    """Any URL's user:pass@ and each secret (raw, percent-encoded) become ***."""
    scrub = Scrubber(["s3cr/t!", None, "ab"])  # too-short secrets are not scrubbed alone
    text = "fatal: https://bob:s3cr%2Ft%21@h/r.git said s3cr/t! (ab)"
    assert scrub(text) == "fatal: https://***@h/r.git said *** (ab)"


@pytest.mark.parametrize(
    ("stderr", "cls"),
    [
        ("fatal: Authentication failed for 'http://h/x.git/'", GitAuthFailed),
        (
            "fatal: could not read Username for 'https://h': terminal prompts disabled",
            GitAuthFailed,
        ),
        ("git@h: Permission denied (publickey).\nfatal: Could not read from remote", GitAuthFailed),
        ("fatal: repository '/tmp/nope' does not exist", GitNotFound),
        (
            "fatal: '/x' does not appear to be a git repository\nfatal: Could not read from remote",
            GitNotFound,
        ),
        ("fatal: Remote branch nob not found in upstream origin", GitNotFound),
        ("fatal: invalid reference: nope", GitNotFound),
        ("fatal: unable to access 'http://h/': Could not resolve host: h", GitNetwork),
        ("fatal: unable to access 'http://127.0.0.1:1/': Failed to connect", GitNetwork),
        ("error: RPC failed; curl 28 Operation too slow.", GitNetwork),
        ("fatal: a branch named 'main' already exists", GitError),
    ],
)
def test_classify(stderr: str, cls: type[GitError]) -> None:
    """git's messages map to the typed errors (checked in order: auth, missing, network)."""
    err = classify(stderr, what="git x", code=128)
    assert type(err) is cls


def test_parse_porcelain_v2() -> None:
    """Headers, ordinary, renamed, unmerged, untracked entries (names with spaces) are parsed."""
    out = b"\0".join(
        [
            b"# branch.oid 0123abcd",
            b"# branch.head main",
            b"# branch.upstream origin/main",
            b"# branch.ab +2 -1",
            b"1 .M N... 100644 100644 100644 aaaa bbbb a file.txt",
            b"2 R. N... 100644 100644 100644 aaaa bbbb R100 new name.txt",
            b"old name.txt",
            b"u UU N... 100644 100644 100644 100644 aaaa bbbb cccc both.txt",
            b"? un tracked.txt",
            b"",
        ]
    )
    st, truncated = parse_status(out, 100)
    assert (st.commit, st.branch, st.upstream, st.ahead, st.behind) == (
        "0123abcd",
        "main",
        "origin/main",
        2,
        1,
    )
    assert [(e.path, e.state, e.index, e.worktree, e.orig_path) for e in st.entries] == [
        ("a file.txt", "modified", ".", "M", None),
        ("new name.txt", "renamed", "R", ".", "old name.txt"),
        ("both.txt", "conflicted", "U", "U", None),
        ("un tracked.txt", "untracked", "?", "?", None),
    ]
    assert not truncated


def test_parse_initial_detached_and_bound() -> None:
    """(initial) and (detached) are absent values; entries past the bound set truncated."""
    out = b"# branch.oid (initial)\0# branch.head (detached)\0? a\0? b\0? c\0"
    st, truncated = parse_status(out, 2)
    assert (st.commit, st.branch, len(st.entries), truncated) == (None, None, 2, True)


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://h/org/app.git", "app"),
        ("git@h:org/app.git", "app"),
        ("/srv/app/", "app"),
        ("file:///srv/app.git", "app"),
        ("https://h/", "repo"),
    ],
)
def test_default_clone_directory(url: str, name: str) -> None:
    """Without a target, the clone is named after the repository."""
    assert _repo_name(url) == name
