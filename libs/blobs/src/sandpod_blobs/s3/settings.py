"""The S3 blob store's settings: a typed dataclass read from the environment once, at start.

Environment (all ``SANDPOD_SNAPSHOT_S3_*``):

=====================  ====================================================================
``ENDPOINT``           the store's URL, e.g. ``https://s3.example.com`` or ``http://127.0.0.1:9000``
                       (required; path-style addressing: ``<endpoint>/<bucket>/<key>``)
``BUCKET``             the bucket (required; must exist, or call ``S3BlobStore.ensure_bucket``)
``REGION``             the SigV4 signing region (default ``us-east-1``)
``ACCESS_KEY_ID``      the access key id
``SECRET_ACCESS_KEY``  its secret
``CREDENTIALS_FILE``   instead of the two above: an AWS-style credentials file (``[default]``
                       with ``aws_access_key_id`` and ``aws_secret_access_key``), e.g. a mounted
                       Kubernetes Secret; read once at start
``PREFIX``             a key prefix inside the bucket (default none), e.g. ``snapshots/``
``PART_SIZE``          multipart part size in bytes (default 16 MiB, at least 5 MiB): files
                       larger than this are uploaded in parts; also the most memory one upload
                       holds
``TIMEOUT``            seconds without progress before a request fails (default 60)
=====================  ====================================================================
"""

from __future__ import annotations

import configparser
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from sandpod_contract.errors import BadRequest

__all__ = ["ENV_PREFIX", "MIN_PART_SIZE", "S3Settings"]

ENV_PREFIX = "SANDPOD_SNAPSHOT_S3_"
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's floor for every part but the last
_DEFAULT_PART_SIZE = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class S3Settings:
    """Where and how to reach an S3-compatible bucket (see the module docstring for the env)."""

    endpoint: str
    bucket: str
    access_key_id: str
    secret_access_key: str = dataclasses.field(repr=False)
    region: str = "us-east-1"
    prefix: str = ""
    part_size: int = _DEFAULT_PART_SIZE
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise BadRequest(f"S3 endpoint must be an http(s) URL, got {self.endpoint!r}")
        if not self.bucket or "/" in self.bucket:
            raise BadRequest(f"S3 bucket must be a bucket name, got {self.bucket!r}")
        if self.part_size < MIN_PART_SIZE:
            raise BadRequest(f"S3 part size must be at least {MIN_PART_SIZE} bytes")
        if self.prefix.startswith("/"):
            raise BadRequest("S3 key prefix must not start with /")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Settings:
        """Read ``SANDPOD_SNAPSHOT_S3_*`` from ``env`` (pass ``os.environ`` at start).

        Raises:
            BadRequest: a required setting is missing or a value is malformed.
        """

        def get(name: str, default: str | None = None) -> str:
            value = env.get(ENV_PREFIX + name, default)
            if value is None:
                raise BadRequest(f"{ENV_PREFIX}{name} is not set", field=ENV_PREFIX + name)
            return value

        key_id, secret = (
            env.get(ENV_PREFIX + "ACCESS_KEY_ID"),
            env.get(ENV_PREFIX + "SECRET_ACCESS_KEY"),
        )
        if creds := env.get(ENV_PREFIX + "CREDENTIALS_FILE"):
            key_id, secret = _read_credentials(Path(creds))
        if not key_id or not secret:
            raise BadRequest(
                f"set {ENV_PREFIX}ACCESS_KEY_ID and {ENV_PREFIX}SECRET_ACCESS_KEY, "
                f"or {ENV_PREFIX}CREDENTIALS_FILE"
            )
        try:
            part_size = int(get("PART_SIZE", str(_DEFAULT_PART_SIZE)))
            timeout = float(get("TIMEOUT", "60"))
        except ValueError as exc:
            raise BadRequest(f"{ENV_PREFIX}PART_SIZE/TIMEOUT: {exc}") from exc
        return cls(
            endpoint=get("ENDPOINT").rstrip("/"),
            bucket=get("BUCKET"),
            access_key_id=key_id,
            secret_access_key=secret,
            region=get("REGION", "us-east-1"),
            prefix=get("PREFIX", ""),
            part_size=part_size,
            timeout=timeout,
        )


def _read_credentials(path: Path) -> tuple[str, str]:
    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text())
        section = parser["default"]
        return section["aws_access_key_id"].strip(), section["aws_secret_access_key"].strip()
    except (OSError, KeyError, configparser.Error) as exc:
        raise BadRequest(
            f"{path}: not a credentials file with [default] aws_access_key_id and "
            f"aws_secret_access_key ({type(exc).__name__})"
        ) from exc
