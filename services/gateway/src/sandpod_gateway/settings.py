"""Gateway settings, read once from the environment at start-up and passed down.

| variable | default | meaning |
|---|---|---|
| ``SANDPOD_NATS_URL`` / ``NATS_URL`` | ``nats://127.0.0.1:4222`` | NATS server(s) |
| ``SANDPOD_NATS_CREDS`` | unset | NATS creds file (operator mode), watched for renewals |
| ``SANDPOD_PREFIX`` | ``sandpod`` | subject prefix |
| ``SANDPOD_GATEWAY_HOST`` | ``127.0.0.1`` | listen address |
| ``SANDPOD_GATEWAY_PORT`` | 8080 | listen port (0: any free port) |
| ``SANDPOD_GATEWAY_KEEPALIVE`` | 15 s | SSE comment / WebSocket ping interval on idle streams |
| ``SANDPOD_GATEWAY_RATE`` | 50 /s | requests per second per API key (token bucket refill) |
| ``SANDPOD_GATEWAY_BURST`` | 100 | token bucket size per API key |
| ``SANDPOD_GATEWAY_RATE_KEYS`` | 10000 | keys tracked by the rate limiter (LRU) |
| ``SANDPOD_GATEWAY_MAX_HEADER_BYTES`` | 16384 | requests with larger headers get 431 |
| ``SANDPOD_GATEWAY_MAX_JSON_BYTES`` | 1 MiB | JSON bodies above this get 413 |
| ``SANDPOD_GATEWAY_MAX_STREAMS`` | 1024 | concurrent SSE/WebSocket/transfer streams per replica |
| ``SANDPOD_GATEWAY_TENANT_MAX_STREAMS`` | 64 | open streams per tenant per replica (429) |
| ``SANDPOD_GATEWAY_TENANT_MAX_EXECS`` | 64 | running commands per tenant per replica (429) |
| ``SANDPOD_GATEWAY_TENANT_MAX_SANDBOXES`` | 100 | sandboxes per tenant (create: 429) |
| ``SANDPOD_GATEWAY_STREAM_WINDOW`` | 256 KiB | exec stream window: unread output per stream |
| ``SANDPOD_GATEWAY_METRICS_AUTH`` | ``admin`` | ``/metrics``: ``admin`` key/token, or ``none`` |
| ``SANDPOD_GATEWAY_METRICS_TOKEN`` | unset | a bearer token that may read ``/metrics`` |
| ``SANDPOD_GATEWAY_TICKET_TTL`` | 30 s | life of a single-use WebSocket ticket |
| ``SANDPOD_GATEWAY_KEY_CACHE`` | 4096 | verified keys cached (evicted by the bucket watch) |
| ``SANDPOD_GATEWAY_REQUEST_TIMEOUT`` | 30 s | deadline of one NATS request made for a client |
| ``SANDPOD_GATEWAY_WEB_DIR`` | ``<package>/web`` | web terminal assets (xterm.js: ``vendor/``) |
| ``SANDPOD_NATS_ACCOUNT_SEED_FILE`` | unset | NATS account (signing) seed for tenant creds |
| ``SANDPOD_NATS_ACCOUNT_PUBLIC`` | unset | the account's public key (seed: a signing key) |
| ``SANDPOD_GATEWAY_TENANT_CREDS_TTL`` | 900 s | lifetime of a minted tenant credential |
| ``SANDPOD_GATEWAY_PUBLIC_URL`` | unset | base of preview URLs handed out (else the request's) |
| ``SANDPOD_GATEWAY_PREVIEW_DOMAIN`` | unset | host previews: ``{port}-{id}.<domain>`` |
| ``SANDPOD_GATEWAY_PREVIEW_CONNECT_TIMEOUT`` | 10 s | connect to a port (no read timeout) |
| ``SANDPOD_GATEWAY_PREVIEW_LINK_TTL`` | 3600 s | default life of a signed preview link |
| ``SANDPOD_GATEWAY_PREVIEW_LINK_MAX_TTL`` | 7 days | longest life a link may ask for |
| ``SANDPOD_GATEWAY_PREVIEW_CACHE_TTL`` | 1 s | a replica trusts addresses, public ports |
| ``SANDPOD_GATEWAY_PREVIEW_FAST_PATH`` | ``true`` | ``false``: previews through uvicorn too |
| ``SANDPOD_GRACE`` | 10 s | shutdown grace for in-flight requests |
| ``SANDPOD_LOG_LEVEL`` | ``info`` | log level |

Without the seed, ``POST /v1/credentials/nats`` answers 503 ``busy.not_configured``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from sandpod_bus import BusSettings
from sandpod_contract.subjects import DEFAULT_PREFIX, Subjects
from sandpod_service import env_bool, env_float, env_int, env_str

__all__ = ["GatewaySettings"]

WEB_DIR = Path(__file__).parent / "web"


@dataclasses.dataclass(frozen=True)
class GatewaySettings:
    bus: BusSettings = dataclasses.field(default_factory=lambda: BusSettings(name="gateway"))
    prefix: str = DEFAULT_PREFIX
    host: str = "127.0.0.1"
    port: int = 8080
    keepalive: float = 15.0
    rate: float = 50.0
    burst: int = 100
    rate_keys: int = 10_000
    max_header_bytes: int = 16 * 1024
    max_json_bytes: int = 1024 * 1024
    max_streams: int = 1024
    tenant_max_streams: int = 64
    tenant_max_execs: int = 64
    tenant_max_sandboxes: int = 100
    stream_window: int = 256 * 1024
    metrics_auth: str = "admin"
    metrics_token: str = ""
    ticket_ttl: float = 30.0
    key_cache: int = 4096
    request_timeout: float = 30.0
    web_dir: Path = WEB_DIR
    grace: float = 10.0
    log_level: str = "info"
    nats_account_seed_file: Path | None = None
    nats_account_public: str | None = None
    tenant_creds_ttl: float = 900.0
    public_url: str = ""
    preview_domain: str = ""
    preview_connect_timeout: float = 10.0
    preview_link_ttl: float = 3600.0
    preview_link_max_ttl: float = 7 * 86400.0
    preview_cache_ttl: float = 1.0
    preview_fast_path: bool = True  # front.py; off: every request goes through uvicorn
    # native.py: sandpod-front (services/gateway/native) in front when it is installed; off:
    # the gateway's own front.py takes the connections
    preview_front: bool = True

    @property
    def bucket_base(self) -> str:
        """Buckets and streams are named after the prefix, like lifecycle's."""
        return Subjects(self.prefix).storage_base

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            bus=BusSettings(
                url=env_str(env, ("SANDPOD_NATS_URL", "NATS_URL"), BusSettings.url),
                creds=env_str(env, "SANDPOD_NATS_CREDS", "") or None,
                name="gateway",
            ),
            prefix=env_str(env, "SANDPOD_PREFIX", DEFAULT_PREFIX),
            host=env_str(env, "SANDPOD_GATEWAY_HOST", d.host),
            port=env_int(env, "SANDPOD_GATEWAY_PORT", d.port),
            keepalive=env_float(env, "SANDPOD_GATEWAY_KEEPALIVE", d.keepalive, minimum=0.01),
            rate=env_float(env, "SANDPOD_GATEWAY_RATE", d.rate, minimum=0.001),
            burst=env_int(env, "SANDPOD_GATEWAY_BURST", d.burst, minimum=1),
            rate_keys=env_int(env, "SANDPOD_GATEWAY_RATE_KEYS", d.rate_keys, minimum=1),
            max_header_bytes=env_int(
                env, "SANDPOD_GATEWAY_MAX_HEADER_BYTES", d.max_header_bytes, minimum=1024
            ),
            max_json_bytes=env_int(
                env, "SANDPOD_GATEWAY_MAX_JSON_BYTES", d.max_json_bytes, minimum=1024
            ),
            max_streams=env_int(env, "SANDPOD_GATEWAY_MAX_STREAMS", d.max_streams, minimum=1),
            tenant_max_streams=env_int(
                env, "SANDPOD_GATEWAY_TENANT_MAX_STREAMS", d.tenant_max_streams, minimum=1
            ),
            tenant_max_execs=env_int(
                env, "SANDPOD_GATEWAY_TENANT_MAX_EXECS", d.tenant_max_execs, minimum=1
            ),
            tenant_max_sandboxes=env_int(
                env, "SANDPOD_GATEWAY_TENANT_MAX_SANDBOXES", d.tenant_max_sandboxes, minimum=0
            ),
            stream_window=env_int(
                env, "SANDPOD_GATEWAY_STREAM_WINDOW", d.stream_window, minimum=4096
            ),
            metrics_auth=_metrics_auth(env_str(env, "SANDPOD_GATEWAY_METRICS_AUTH", "admin")),
            metrics_token=env_str(env, "SANDPOD_GATEWAY_METRICS_TOKEN", ""),
            ticket_ttl=env_float(env, "SANDPOD_GATEWAY_TICKET_TTL", d.ticket_ttl, minimum=1.0),
            key_cache=env_int(env, "SANDPOD_GATEWAY_KEY_CACHE", d.key_cache, minimum=1),
            request_timeout=env_float(
                env, "SANDPOD_GATEWAY_REQUEST_TIMEOUT", d.request_timeout, minimum=0.1
            ),
            web_dir=Path(env_str(env, "SANDPOD_GATEWAY_WEB_DIR", str(d.web_dir))),
            grace=env_float(env, "SANDPOD_GRACE", d.grace),
            log_level=env_str(env, "SANDPOD_LOG_LEVEL", "info"),
            nats_account_seed_file=Path(seed)
            if (seed := env_str(env, "SANDPOD_NATS_ACCOUNT_SEED_FILE", ""))
            else None,
            nats_account_public=env_str(env, "SANDPOD_NATS_ACCOUNT_PUBLIC", "") or None,
            tenant_creds_ttl=env_float(
                env, "SANDPOD_GATEWAY_TENANT_CREDS_TTL", d.tenant_creds_ttl, minimum=10.0
            ),
            public_url=env_str(env, "SANDPOD_GATEWAY_PUBLIC_URL", "").rstrip("/"),
            preview_domain=_domain(env_str(env, "SANDPOD_GATEWAY_PREVIEW_DOMAIN", "")),
            preview_connect_timeout=env_float(
                env,
                "SANDPOD_GATEWAY_PREVIEW_CONNECT_TIMEOUT",
                d.preview_connect_timeout,
                minimum=0.01,
            ),
            preview_link_ttl=env_float(
                env, "SANDPOD_GATEWAY_PREVIEW_LINK_TTL", d.preview_link_ttl, minimum=1.0
            ),
            preview_link_max_ttl=env_float(
                env, "SANDPOD_GATEWAY_PREVIEW_LINK_MAX_TTL", d.preview_link_max_ttl, minimum=1.0
            ),
            preview_cache_ttl=env_float(
                env, "SANDPOD_GATEWAY_PREVIEW_CACHE_TTL", d.preview_cache_ttl, minimum=0.0
            ),
            preview_fast_path=env_bool(
                env, "SANDPOD_GATEWAY_PREVIEW_FAST_PATH", d.preview_fast_path
            ),
            preview_front=env_bool(env, "SANDPOD_GATEWAY_PREVIEW_FRONT", d.preview_front),
        )


def _metrics_auth(value: str) -> str:
    if value not in ("admin", "none"):
        raise ValueError(
            f"SANDPOD_GATEWAY_METRICS_AUTH={value!r}: use 'admin' (an admin API key or "
            "SANDPOD_GATEWAY_METRICS_TOKEN) or 'none' (public)"
        )
    return value


def _domain(value: str) -> str:
    """The preview domain, lowercased, without dots at the ends ("" = host routing off)."""
    domain = value.strip().strip(".").lower()
    if domain and not all(part and part.replace("-", "").isalnum() for part in domain.split(".")):
        raise ValueError(
            f"SANDPOD_GATEWAY_PREVIEW_DOMAIN={value!r}: give a DNS name such as "
            "'preview.example.com' (each {port}-{sandbox}.<domain> must resolve to the gateway)"
        )
    return domain
