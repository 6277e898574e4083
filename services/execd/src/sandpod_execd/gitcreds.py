"""Keeping git credentials out of argv, logs, errors and replies.

A request may carry credentials in the URL (``https://user:token@host/repo.git``) or as separate
``username``/``token`` fields. :func:`split_credentials` takes them out of the URL, so the URL git
sees on its command line (visible to every user in ``ps``) and stores in ``.git/config`` has none.
:class:`Askpass` writes a tiny ``GIT_ASKPASS`` helper that answers git's prompts from two
environment variables; the helper file itself holds no secret, and the environment of a process is
readable only by its own user. :class:`Scrubber` removes ``user:pass@`` from any URL and every
given secret (raw and percent-encoded) from any text before it leaves execd.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterable, Iterator

__all__ = ["DEFAULT_USERNAME", "Askpass", "Scrubber", "is_remote", "split_credentials"]

DEFAULT_USERNAME = "x-access-token"  # what GitHub expects with a token; most hosts accept any
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_SCP = re.compile(r"^[^/]+:")  # user@host:path (no scheme, a colon before any slash)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
_ASKPASS = """#!/bin/sh
# Sandpod: answers git's credential prompts from the environment (never from argv or this file).
case "$1" in
  [Uu]sername*) printf '%s\\n' "$SANDPOD_GIT_USERNAME" ;;
  *) printf '%s\\n' "$SANDPOD_GIT_PASSWORD" ;;
esac
"""


def is_remote(url: str) -> bool:
    """A URL (``scheme://``) or scp-like ``host:path``, as opposed to a local path."""
    return bool(_URL.match(url) or _SCP.match(url))


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``(url without userinfo, username, password)``; percent-escapes in them are decoded."""
    if not _URL.match(url):
        return url, None, None
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    clean = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return (
        clean,
        urllib.parse.unquote(user) or None,
        urllib.parse.unquote(password) if sep else None,
    )


class Scrubber:
    """Removes credentials from text: URL userinfo, and each secret in raw and escaped forms."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= 3:  # shorter ones would mangle ordinary text
                forms |= {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret)}
        self._forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        text = _USERINFO.sub(r"\1***@", text)
        for form in self._forms:
            text = text.replace(form, "***")
        return text


class Askpass:
    """A ``GIT_ASKPASS`` helper and the environment that feeds it, removed on exit."""

    def __init__(self, username: str, password: str) -> None:
        self._username = username
        self._password = password

    @contextlib.contextmanager
    def env(self) -> Iterator[dict[str, str]]:
        """Yield the variables to add to git's environment; the helper exists meanwhile."""
        tmp = tempfile.mkdtemp(prefix="sandpod-askpass-")
        try:
            helper = os.path.join(tmp, "askpass")
            fd = os.open(helper, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
            with os.fdopen(fd, "w") as f:
                f.write(_ASKPASS)
            yield {
                "GIT_ASKPASS": helper,
                "SANDPOD_GIT_USERNAME": self._username,
                "SANDPOD_GIT_PASSWORD": self._password,
            }
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
