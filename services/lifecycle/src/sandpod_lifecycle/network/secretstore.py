"""Secret values for header injection, and the placeholders a sandbox sees instead.

A policy's ``inject`` entry names a secret (``{"domain": "api.example.com", "secret": "openai",
...}``); only the egress proxy, outside the sandbox, ever reads the value. The sandbox gets an
environment variable with a *placeholder* (:func:`placeholder_env`: ``SANDPOD_SECRET_OPENAI=
sandpod-placeholder-openai``) so code written for a real key (``Authorization: Bearer
$OPENAI_KEY``) keeps working: the proxy replaces the header on the way out.

Where values live (:class:`SecretSource` is the seam):

* local runtime: :class:`FileSecretStore`, one file per secret in a 0700 directory of the
  state dir, each 0600, written atomically. Files rather than a JetStream KV bucket: the proxy
  reads a value on each intercepted connection from its own thread, with no bus round trip, and
  the values never cross NATS (whose accounts other components share).
* Kubernetes mode: ``podguard.egress.GuardSecrets``, the Pod guard's, reading the keys of the
  sandbox namespace's ``Secret`` objects an ``inject`` entry names as ``<Secret>/<key>``
  through ``sandpod_kube`` (the only module that may import ``kubernetes``), with the guard's
  own token; a ``/`` name is refused here (:func:`_check`), so it never reads a local file.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import stat
import sys
from pathlib import Path
from typing import Protocol

from sandpod_contract.network import NetworkPolicy

__all__ = [
    "FileSecretStore",
    "SecretError",
    "SecretNotFound",
    "SecretSource",
    "placeholder",
    "placeholder_env",
]

_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")
MAX_VALUE = 16 * 1024


class SecretError(Exception):
    """A secret cannot be stored or read. ``code`` is stable."""

    code = "network.secret"


class SecretNotFound(SecretError):
    code = "network.secret_not_found"


class SecretSource(Protocol):
    def get(self, name: str) -> str:
        """The value of secret ``name``. Raises SecretNotFound, SecretError."""
        ...


def placeholder(name: str) -> str:
    """What the sandbox sees in place of secret ``name``'s value."""
    return f"sandpod-placeholder-{name}"


def placeholder_env(policy: NetworkPolicy) -> dict[str, str]:
    """The environment variables a sandbox under ``policy`` gets: one per injected secret."""
    return {
        "SANDPOD_SECRET_" + re.sub(r"[^A-Z0-9]", "_", i.secret.upper()): placeholder(i.secret)
        for i in policy.inject
    }


def _check(name: str, value: str | None = None) -> None:
    if not _NAME.fullmatch(name):
        raise SecretError(f"secret name {name!r}: lower-case letters, digits, '.', '_', '-'")
    if value is not None:
        if not value or len(value) > MAX_VALUE:
            raise SecretError(f"secret {name!r}: value must be 1..{MAX_VALUE} characters")
        if any(c in value for c in "\r\n\0") or not value.isprintable():
            raise SecretError(f"secret {name!r}: value must be printable, on one line")


class FileSecretStore:
    """Secrets as files ``<directory>/<name>`` (directory 0700, files 0600, owner only)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)

    def put(self, name: str, value: str) -> None:
        """Store (or replace) ``name``. Raises SecretError for a bad name or value."""
        _check(name, value)
        path = self.directory / name
        tmp = self.directory / f".{name}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(value)
        os.replace(tmp, path)

    def get(self, name: str) -> str:
        _check(name)
        try:
            fd = os.open(self.directory / name, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise SecretNotFound(f"secret {name!r} is not stored") from None
        except OSError as exc:
            raise SecretError(f"secret {name!r}: {exc.strerror}") from exc
        with os.fdopen(fd, encoding="utf-8") as f:
            info = os.fstat(f.fileno())
            if stat.S_IMODE(info.st_mode) & 0o077 or info.st_uid != os.geteuid():
                raise SecretError(f"secret {name!r}: file must be ours with mode 0600")
            return f.read()

    def delete(self, name: str) -> None:
        _check(name)
        (self.directory / name).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m sandpod_lifecycle.network.secretstore --dir D set NAME|ls|rm NAME...``:
    what ``sandpod secret`` runs. ``set`` reads the value from stdin (or ``--from-file``),
    never from the command line, where other local users could read it in the process list."""
    parser = argparse.ArgumentParser(prog="sandpod secret")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("verb", choices=("set", "ls", "rm"))
    parser.add_argument("names", nargs="*")
    parser.add_argument("--from-file", type=Path)
    a = parser.parse_args(argv)
    try:
        store = FileSecretStore(a.dir)
        if a.verb == "set":
            if len(a.names) != 1:
                parser.error("set takes one name")
            value = a.from_file.read_text() if a.from_file else sys.stdin.read()
            store.put(a.names[0], value.rstrip("\n"))
            print(f"secret {a.names[0]!r} stored (sandboxes see {placeholder(a.names[0])})")
        elif a.verb == "ls":
            print("\n".join(p.name for p in sorted(a.dir.iterdir()) if p.name[0] != "."))
        else:
            for name in a.names:
                store.delete(name)
    except SecretError as exc:
        print(
            f"error: {exc}\nhint: names are lower-case DNS labels; values text up to 16 KiB",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(
            f"error: {exc}\nhint: the store is {a.dir}: run as the platform's user", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
