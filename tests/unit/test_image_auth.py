"""Registry credentials read from Docker config.json files (and podman auth.json)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from sandpod_contract.errors import BadRequest
from sandpod_image.auth import AuthConfig, default_auth_path, load_auth_file, registry_key


def write(tmp: Path, doc: object) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps(doc))
    return path


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_auth_username_password_and_identity_token_entries(tmp_path: Path) -> None:
    """auth (base64 user:pass, a ':' in the password kept), username/password and
    identitytoken entries are read; keys are normalised (scheme, path, Docker Hub aliases)."""
    path = write(
        tmp_path,
        {
            "auths": {
                "https://api.docker.io/v1/": {"auth": b64("hub:pa:ss")},  # a Hub alias
                "ghcr.io": {"username": "gh", "password": "tok"},
                "http://LOCALHOST:5000/": {"identitytoken": "refresh"},
                "reg.example": {"registrytoken": "bearer"},
            },
            "credsStore": "desktop",
        },
    )
    auth = load_auth_file(path)
    assert auth.lookup("docker.io") == AuthConfig("hub", "pa:ss")
    assert auth.lookup("ghcr.io") == AuthConfig("gh", "tok")
    assert auth.lookup("localhost:5000") == AuthConfig(identity_token="refresh")
    assert auth.lookup("reg.example") == AuthConfig(registry_token="bearer")
    assert auth.lookup("quay.io") is None


def test_secrets_never_show_in_repr() -> None:
    """An AuthConfig printed in a log shows the user name only."""
    text = repr(AuthConfig("u", "hunter2", "idtok", "regtok"))
    assert "u" in text and "hunter2" not in text and "idtok" not in text and "regtok" not in text


def test_credential_helper_entries_are_skipped(tmp_path: Path) -> None:
    """An entry with nothing usable (a credential helper's placeholder) is left out."""
    auth = load_auth_file(write(tmp_path, {"auths": {"ghcr.io": {}}, "credHelpers": {"x": "y"}}))
    assert auth.lookup("ghcr.io") is None


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"auths": []}, "'auths' is not an object"),
        ({"auths": {"r": "x"}}, "entry 'r' is not an object"),
        ({"auths": {"r": {"auth": "***"}}}, "not base64"),
        ({"auths": {"r": {"auth": b64("nocolon")}}}, r"base64\(user:password\)"),
    ],
)
def test_malformed_files_are_bad_requests_without_secrets(
    tmp_path: Path, doc: object, match: str
) -> None:
    """A malformed file raises BadRequest naming the file and entry, never the secret."""
    with pytest.raises(BadRequest, match=match) as info:
        load_auth_file(write(tmp_path, doc))
    assert "nocolon" not in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_unreadable_and_non_json_files(tmp_path: Path) -> None:
    """A missing file and a non-JSON one are BadRequest too."""
    with pytest.raises(BadRequest, match="cannot read"):
        load_auth_file(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(BadRequest, match="not JSON"):
        load_auth_file(tmp_path / "bad.json")


def test_default_path_order(tmp_path: Path) -> None:
    """REGISTRY_AUTH_FILE, then $DOCKER_CONFIG/config.json, then ~/.docker/config.json."""
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker/config.json").write_text("{}")
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_text("{}")
    explicit = write(tmp_path, {})
    env = {"HOME": str(home)}
    assert default_auth_path(env) == home / ".docker/config.json"
    env["DOCKER_CONFIG"] = str(docker)
    assert default_auth_path(env) == docker / "config.json"
    env["REGISTRY_AUTH_FILE"] = str(explicit)
    assert default_auth_path(env) == explicit
    assert default_auth_path({"HOME": str(tmp_path / "none")}) is None


def test_registry_keys() -> None:
    """Hosts compare case-insensitively, without scheme or path; Hub aliases are one."""
    assert registry_key("https://api.docker.io/v2/") == "docker.io"
    assert registry_key("Ghcr.IO") == "ghcr.io"
    assert registry_key("http://127.0.0.1:5000") == "127.0.0.1:5000"
