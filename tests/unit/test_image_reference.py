"""Image references, platforms and manifests parsed: Docker Hub normalisation, typed refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandpod_contract.errors import ImageError, ImageNotFound, ImageUnsupported
from sandpod_image._records import Layout
from sandpod_image.manifest import (
    Index,
    Manifest,
    Platform,
    parse_config,
    parse_manifest,
    select_platform,
)
from sandpod_image.reference import InvalidReference, Reference, parse_reference
from sandpod_image.registry import Registry

HEX = "a" * 64


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("python", Reference("docker.io", "library/python", "latest")),
        ("python:3.12-slim", Reference("docker.io", "library/python", "3.12-slim")),
        ("docker.io/library/x", Reference("docker.io", "library/x", "latest")),
        ("Hub.Docker.IO/x", Reference("docker.io", "library/x", "latest")),  # a Hub alias
        ("user/app:1", Reference("docker.io", "user/app", "1")),
        ("ghcr.io/o/r:tag", Reference("ghcr.io", "o/r", "tag")),
        ("host:5000/r@sha256:" + HEX, Reference("host:5000", "r", None, "sha256:" + HEX)),
        ("localhost:5000/x", Reference("localhost:5000", "x", "latest")),
        ("localhost/x:y", Reference("localhost", "x", "y")),
        ("[::1]:5000/a/b:c", Reference("[::1]:5000", "a/b", "c")),
        ("r.io/a/b:t@sha256:" + HEX, Reference("r.io", "a/b", "t", "sha256:" + HEX)),
        ("a.b/c__d/e-f.g:Tag_1", Reference("a.b", "c__d/e-f.g", "Tag_1")),
    ],
)
def test_references_parse_and_normalise(text: str, want: Reference) -> None:
    """Each reference form parses to registry, repository, tag, digest (Hub names normalised)."""
    assert parse_reference(text) == want


def test_a_reference_prints_canonically_and_names_its_api_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """str() is the full form; a registry is its own API host; Docker Hub's API is where the
    host's registries.conf says (a mirror first), and without an entry the error says what to
    add."""
    conf = tmp_path / "registries.conf"
    conf.write_text(
        '[[registry]]\nprefix = "docker.io"\nlocation = "hub-api.internal"\n'
        '[[registry]]\nprefix = "quay.example"\nlocation = "quay.example"\n'
        '[[registry.mirror]]\nlocation = "cache.internal:5000/quay"\n'
    )
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    ref = parse_reference("python:3")
    assert str(ref) == "docker.io/library/python:3"
    assert ref.api_host == "hub-api.internal"
    assert parse_reference("quay.example/a/b").api_host == "cache.internal:5000"
    assert parse_reference("ghcr.io/o/r").api_host == "ghcr.io"
    conf.write_text("")
    with pytest.raises(ImageError, match=r'prefix = "docker.io"'):
        _ = ref.api_host
    assert ref.target == "3"
    assert parse_reference("r.io/a@sha256:" + HEX).target == "sha256:" + HEX


@pytest.mark.parametrize(
    "text",
    [
        "",
        " python",
        "Python",  # upper case is only for hosts
        "python:",
        "python:-bad",
        "a//b",
        "ghcr.io/",
        "r@sha256:abc",
        "r@sha256:" + "A" * 64,
        "r@nope",
        "x" * 300,
        "ghcr.io/o/r:" + "t" * 200,
        "bad_host!:5000/x",
    ],
)
def test_malformed_references_are_bad_requests_naming_the_input(text: str) -> None:
    """A malformed reference raises InvalidReference (a bad_request) carrying the input."""
    with pytest.raises(InvalidReference) as info:
        parse_reference(text)
    assert info.value.code == "bad_request"
    assert info.value.details["reference"] == text


def test_other_digest_algorithms_are_unsupported() -> None:
    """sha512 is a valid digest but not one Sandpod verifies: image.unsupported."""
    with pytest.raises(ImageUnsupported):
        parse_reference("r@sha512:" + "a" * 128)


def test_plain_http_only_for_loopback_or_insecure_registries() -> None:
    """A remote registry is reached over HTTPS unless marked insecure; loopback over HTTP."""
    assert Registry("ghcr.io").base == "https://ghcr.io"
    assert Registry("10.0.0.1:5000").base == "https://10.0.0.1:5000"
    assert Registry("127.0.0.1:5000").base == "http://127.0.0.1:5000"
    assert Registry("localhost:5000").base == "http://localhost:5000"
    assert Registry("[::1]:5000").base == "http://[::1]:5000"
    assert Registry("reg.lan", insecure=True).base == "http://reg.lan"


@pytest.mark.parametrize(
    "digest", ["sha256:../../../etc/passwd" + "a" * 45, "sha256:" + "G" * 64, "md5:" + "a" * 64]
)
def test_a_digest_that_is_not_hex_never_becomes_a_path(digest: str) -> None:
    """A manifest's digest names store files: anything but 64 hex digits is refused."""
    with pytest.raises(ImageUnsupported):
        Layout(Path("/store")).blob(digest)
    with pytest.raises(ImageUnsupported):
        parse_manifest(
            json.dumps(
                {
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": [{"digest": digest, "size": 1}],
                }
            ).encode()
        )


def test_platforms_match_with_default_variants() -> None:
    """arm64 means v8 and arm v7 when an entry omits the variant; other archs never match."""
    assert Platform("linux", "arm64").matches(Platform("linux", "arm64", "v8"))
    assert Platform("linux", "arm", "v7").matches(Platform("linux", "arm"))
    assert not Platform("linux", "arm", "v6").matches(Platform("linux", "arm", "v7"))
    assert not Platform("linux", "amd64").matches(Platform("linux", "arm64"))
    assert str(Platform.parse("linux/arm/v7")) == "linux/arm/v7"
    with pytest.raises(ImageUnsupported):
        Platform.parse("linux")


def test_index_selection_names_what_it_has() -> None:
    """No entry for the platform: image.not_found listing the platforms there are."""
    entry = {"mediaType": "x", "digest": "sha256:" + HEX, "size": 1}
    doc = {
        "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
        "manifests": [{**entry, "platform": {"os": "linux", "architecture": "arm64"}}],
    }
    index = parse_manifest(json.dumps(doc).encode())
    assert isinstance(index, Index)
    with pytest.raises(ImageNotFound, match="linux/arm64"):
        select_platform(index, Platform(), "r")


def test_schema1_and_foreign_layer_types_are_unsupported() -> None:
    """Schema 1 manifests and non-layer media types are refused with image.unsupported."""
    with pytest.raises(ImageUnsupported, match="schema 1"):
        parse_manifest(
            b'{"schemaVersion": 1}', "application/vnd.docker.distribution.manifest.v1+json"
        )
    cfg = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        "digest": "sha256:" + HEX,
        "size": 2,
    }
    doc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": cfg,
        "layers": [{**cfg, "mediaType": "application/vnd.example.weird"}],
    }
    with pytest.raises(ImageUnsupported) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.details["media_type"] == "application/vnd.example.weird"
    doc["layers"] = []
    assert isinstance(parse_manifest(json.dumps(doc).encode()), Manifest)


def test_the_config_fields_a_sandbox_honours() -> None:
    """Env (values with '='), WorkingDir, User, Entrypoint, Cmd and diff_ids are read."""
    config = parse_config(
        json.dumps(
            {
                "architecture": "arm64",
                "config": {
                    "Env": ["A=1", "B=x=y", "EMPTY="],
                    "WorkingDir": "/w",
                    "User": "app",
                    "Entrypoint": ["/init"],
                    "Cmd": ["serve", "--port", "80"],
                    "ExposedPorts": {"80/tcp": {}},
                    "Labels": {"k": "v"},
                },
                "rootfs": {"diff_ids": ["sha256:" + HEX]},
            }
        ).encode()
    )
    assert config.env == (("A", "1"), ("B", "x=y"), ("EMPTY", ""))
    assert (config.workdir, config.user, config.architecture) == ("/w", "app", "arm64")
    assert (config.entrypoint, config.cmd) == (("/init",), ("serve", "--port", "80"))
    assert (config.exposed_ports, config.labels) == (("80/tcp",), (("k", "v"),))
    assert config.diff_ids == ("sha256:" + HEX,)
    assert parse_config(b'{"config": null}').cmd == ()


async def test_credentials_never_go_to_a_plain_http_realm_of_a_tls_registry() -> None:
    """A TLS registry whose challenge names an http:// token realm: refused, nothing sent."""
    import httpx

    from sandpod_contract.errors import ImageAuthFailed
    from sandpod_image.auth import AuthConfig

    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        challenge = 'Bearer realm="http://evil.example/token",service="r"'
        return httpx.Response(401, headers={"WWW-Authenticate": challenge})

    reg = Registry("reg.example", auth=AuthConfig("u", "p"), transport=httpx.MockTransport(answer))
    async with reg:
        with pytest.raises(ImageAuthFailed, match="plain HTTP"):
            await reg.get_manifest("a/b", "latest")
    assert sent == ["https://reg.example/v2/a/b/manifests/latest"]
