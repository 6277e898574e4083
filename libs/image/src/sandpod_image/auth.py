"""Registry credentials from a Docker ``config.json`` file, the format every tool writes.

``docker login``, ``podman login`` (``auth.json``), ``skopeo login`` and CI systems all write
``{"auths": {"<registry>": {"auth": base64("user:pass")}}}`` (or ``username``/``password``,
or an ``identitytoken`` for OAuth2 refresh tokens, or a ``registrytoken`` used as a bearer token
as it is). :func:`load_auth_file` reads one into an :class:`AuthFile`; the registry client asks it
for the :class:`AuthConfig` of one registry host. Keys are normalised the way Docker does
(Docker Hub's index URL, ``https://index.<docker.io>/v1/``, is ``docker.io``; a scheme and a
path are ignored).

Credential helpers (``credsStore``, ``credHelpers``) are not run: they execute programs of the
user's choice, which a node service must not do; such entries are ignored and the registry is
reached anonymously (the error then says so).

The file's path: the caller's option, else ``$REGISTRY_AUTH_FILE``, else
``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json`` (:func:`default_auth_path`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandpod_contract.errors import BadRequest
from sandpod_image.reference import is_docker_hub

__all__ = ["AuthConfig", "AuthFile", "default_auth_path", "load_auth_file", "registry_key"]


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Credentials for one registry (secrets never appear in ``repr``).

    Attributes:
        username: basic auth user, also sent to a token endpoint.
        password: basic auth password.
        identity_token: an OAuth2 refresh token, exchanged at the token endpoint.
        registry_token: a bearer token sent as it is.
    """

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    identity_token: str | None = field(default=None, repr=False)
    registry_token: str | None = field(default=None, repr=False)

    @property
    def has_basic(self) -> bool:
        return self.username is not None and self.password is not None


@dataclass(frozen=True, slots=True)
class AuthFile:
    """The credentials of a config.json, by normalised registry host."""

    entries: Mapping[str, AuthConfig]
    path: Path | None = None

    def lookup(self, registry: str) -> AuthConfig | None:
        """The credentials for ``registry`` (a host[:port] as in a reference), or None."""
        return self.entries.get(registry_key(registry))


def registry_key(text: str) -> str:
    """Normalise a config.json key or a host: Docker Hub's names are ``docker.io``."""
    host = text.strip()
    for scheme in ("https://", "http://"):
        if host.startswith(scheme):
            host = host[len(scheme) :]
    host = host.split("/", 1)[0].lower()
    return "docker.io" if is_docker_hub(host) else host


def default_auth_path(env: Mapping[str, str] | None = None) -> Path | None:
    """Where the credentials are when no path is given, or None when no such file exists."""
    env = os.environ if env is None else env
    candidates: list[Path] = []
    if env.get("REGISTRY_AUTH_FILE"):
        candidates.append(Path(env["REGISTRY_AUTH_FILE"]))
    if env.get("DOCKER_CONFIG"):
        candidates.append(Path(env["DOCKER_CONFIG"]) / "config.json")
    if env.get("HOME"):
        candidates.append(Path(env["HOME"]) / ".docker" / "config.json")
    return next((p for p in candidates if p.is_file()), None)


def load_auth_file(path: Path) -> AuthFile:
    """Read a Docker ``config.json`` (or podman ``auth.json``).

    Args:
        path: the file.

    Returns:
        Its credentials; entries with nothing usable (a credential helper's) are left out.

    Raises:
        BadRequest: the file cannot be read, is not JSON, or an entry is malformed (the
            message names the file and the entry, never a secret).
    """
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise BadRequest(f"cannot read the auth file {path}: {exc.strerror}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the auth file {path} is not JSON: {exc}") from exc
    auths = doc.get("auths", {}) if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        raise BadRequest(f"the auth file {path}: 'auths' is not an object")
    entries: dict[str, AuthConfig] = {}
    for key, entry in auths.items():
        config = _entry(path, str(key), entry)
        if config is not None:
            entries[registry_key(str(key))] = config
    return AuthFile(entries, path)


def _entry(path: Path, key: str, entry: Any) -> AuthConfig | None:
    if not isinstance(entry, dict):
        raise BadRequest(f"the auth file {path}: entry {key!r} is not an object")
    username, password = _str(entry, "username"), _str(entry, "password")
    if encoded := _str(entry, "auth"):
        try:
            decoded = base64.b64decode(encoded, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise BadRequest(f"the auth file {path}: {key!r}.auth is not base64") from exc
        username, sep, password = decoded.partition(":")
        if not sep:
            raise BadRequest(f"the auth file {path}: {key!r}.auth is not base64(user:password)")
    config = AuthConfig(
        username=username or None,
        password=password if username else None,
        identity_token=_str(entry, "identitytoken"),
        registry_token=_str(entry, "registrytoken"),
    )
    if not (config.has_basic or config.identity_token or config.registry_token):
        return None
    return config


def _str(entry: dict[str, Any], key: str) -> str | None:
    value = entry.get(key)
    return value if isinstance(value, str) and value else None
