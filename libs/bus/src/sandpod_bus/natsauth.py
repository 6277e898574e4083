"""NATS decentralized auth: nkeys, JWTs and creds files, so each sandbox gets its own credential.

Why it exists: a sandbox Pod's execd (and so any code in that Pod) must reach only its own
subjects (DESIGN.md, security model). NATS "operator mode" does that without a server reload per
sandbox: the server trusts one operator key; the operator signs an account; the account's key
signs as many user JWTs as we like, each carrying its own publish/subscribe permissions and
expiry, and the server checks the chain on every connect.

    operator nkey --signs--> account JWT (app: JetStream on)   --preloaded into--> nats-server
                  --signs--> account JWT (system)              --preloaded into--> nats-server
    account nkey  --signs--> user JWT (one per sandbox / service) --in a creds file--> a client

No maintained Python library writes NATS JWTs, so the tiny encoding is here: header
``{"typ":"JWT","alg":"ed25519-nkey"}``, claims as in nats-io/jwt v2 (``jti``, ``iat``, ``iss``,
``sub``, ``name``, ``exp``, ``nats{...}``), signature = the issuer's nkey signature of
``b64url(header).b64url(claims)``, all base64url without padding. Keys come from the official
``nkeys`` package (nats-py's own extra). This module is pure: no I/O, no clock of its own (callers
pass ``now``). execd never imports it: execd only *uses* a creds file (``BusSettings.creds``).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from sandpod_contract.errors import BadRequest
from sandpod_contract.subjects import Subjects
from sandpod_contract.tenancy import validate_tenant

__all__ = [
    "INBOX_ALL",
    "JS_ACCOUNT_INFO",
    "MAX_TENANT_SANDBOXES",
    "NO_LIMIT",
    "Account",
    "KeyPair",
    "OperatorSetup",
    "Permissions",
    "TenantCredential",
    "creds_jwt",
    "decode_jwt",
    "encode_jwt",
    "kv_owner_subjects",
    "kv_subjects",
    "object_owner_subjects",
    "object_reader_subjects",
    "object_subjects",
    "operator_setup",
    "sandbox_permissions",
    "server_config",
    "stream_subjects",
    "tenant_creds",
    "tenant_inbox_prefix",
    "tenant_permissions",
    "user_creds",
]

INBOX_ALL = "_INBOX.>"
# The account's JetStream figures (read only): a service that makes streams or buckets asks
# them to explain a refused reservation (sandpod_bus.capacity); never granted to tenants.
JS_ACCOUNT_INFO = "$JS.API.INFO"
NO_LIMIT = -1
_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_PREFIXES = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}


@dataclasses.dataclass(frozen=True, slots=True)
class KeyPair:
    """An nkey: ``seed`` (``S...``, secret) and ``public`` (``O...``/``A...``/``U...``)."""

    seed: str
    public: str

    @classmethod
    def generate(cls, kind: str) -> KeyPair:
        """A fresh key of ``kind`` (``operator``, ``account`` or ``user``)."""
        seed = nkeys.encode_seed(os.urandom(32), _PREFIXES[kind]).decode()
        return cls.from_seed(seed)

    @classmethod
    def from_seed(cls, seed: str) -> KeyPair:
        """The key of a seed. Raises BadRequest for anything that is not an nkey seed."""
        try:
            kp = nkeys.from_seed(bytearray(seed.strip().encode()))
            return cls(seed.strip(), kp.public_key.decode())
        except (nkeys.NkeysError, ValueError, TypeError) as exc:
            raise BadRequest(f"not an nkey seed ({type(exc).__name__})") from exc

    def sign(self, data: bytes) -> bytes:
        kp = nkeys.from_seed(bytearray(self.seed.encode()))
        try:
            return bytes(kp.sign(data))
        finally:
            kp.wipe()


@dataclasses.dataclass(frozen=True, slots=True)
class Permissions:
    """A user's permissions: subjects it may publish to / subscribe to, and reply rights.

    ``resp_max`` > 0 lets the user publish that many replies to the reply subject of each
    request it received, within ``resp_ttl`` seconds (NATS ``allow_responses``), without any
    publish permission on ``_INBOX.>``.
    """

    pub_allow: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    resp_max: int = 0
    resp_ttl: float = 0.0

    def claims(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pub": {"allow": list(self.pub_allow)} if self.pub_allow else {},
            "sub": {"allow": list(self.sub_allow)} if self.sub_allow else {},
        }
        if self.resp_max > 0:
            out["resp"] = {"max": self.resp_max, "ttl": int(self.resp_ttl * 1e9)}  # Go Duration
        return out


def sandbox_permissions(sandbox_all: str) -> Permissions:
    """What one sandbox's execd needs, and nothing more.

    ``sandbox_all`` is ``Subjects.sandbox_all(id)`` (``<prefix>.sbx.<id>.>``): execd subscribes
    to it only. It publishes (a) replies to the requests it got (``resp``: one reply each) and
    (b) stream frames (exec output, PTY, watch events, file chunks) to the ``deliver`` subject a
    client named, which is a client inbox (``_INBOX.<random>``): hence publish on ``_INBOX.>``.
    It never subscribes to inboxes (it makes no requests), never touches ``<prefix>.api.>``,
    ``<prefix>.events.>``, ``$JS.>``/``$KV.>`` or another sandbox's subjects.

    ``resp`` (ttl 0: the server's default window, 2 minutes) covers replies to requests whose
    reply subject is not an ``_INBOX.`` one; a client with a custom inbox prefix gets replies
    within that window only, and no stream frames. Clients using the default ``_INBOX`` prefix
    (nats-py, the SDK, the gateway) get everything through the ``_INBOX.>`` allow.
    """
    return Permissions(pub_allow=(INBOX_ALL,), sub_allow=(sandbox_all,), resp_max=1, resp_ttl=0)


def stream_subjects(stream: str) -> tuple[str, ...]:
    """The JetStream API subjects a client needs to use stream ``stream`` and nothing else:
    create/update/info it, read messages (direct and by sequence), make and drop its consumers
    (ordered consumers, as KV watches use), and answer their flow control."""
    api = "$JS.API"
    return (
        f"{api}.STREAM.CREATE.{stream}",
        f"{api}.STREAM.UPDATE.{stream}",
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.>",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.FC.{stream}.>",
        f"$JS.ACK.{stream}.>",
    )


def kv_subjects(bucket: str) -> tuple[str, ...]:
    """What a client needs to open, read, write and watch KV bucket ``bucket`` (its stream is
    ``KV_<bucket>``; keys are messages on ``$KV.<bucket>.<key>``)."""
    return (*stream_subjects(f"KV_{bucket}"), f"$KV.{bucket}.>")


def object_subjects(bucket: str) -> tuple[str, ...]:
    """What a client needs to open, read and write object-store bucket ``bucket`` (its stream
    is ``OBJ_<bucket>``; chunks and metadata are messages on ``$O.<bucket>.>``; replacing an
    object purges its old chunks)."""
    stream = f"OBJ_{bucket}"
    return (
        *stream_subjects(stream),
        f"$JS.API.STREAM.PURGE.{stream}",
        "$JS.API.STREAM.NAMES",  # nats-py finds the stream of an object's chunks by subject
        f"$O.{bucket}.>",
    )


def kv_owner_subjects(bucket: str) -> tuple[str, ...]:
    """:func:`kv_subjects` in the compact wildcard form (see :func:`object_reader_subjects`)
    for the one service that owns the bucket (it may also delete or purge it)."""
    api, stream = "$JS.API", f"KV_{bucket}"
    return (
        f"{api}.STREAM.*.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.*.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"$JS.FC.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$KV.{bucket}.>",
    )


def object_owner_subjects(bucket: str) -> tuple[str, ...]:
    """:func:`object_subjects` in the compact wildcard form (see :func:`object_reader_subjects`)
    for the one service that reads, writes and deletes the bucket's objects."""
    api, stream = "$JS.API", f"OBJ_{bucket}"
    return (
        f"{api}.STREAM.*.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.*.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"$JS.FC.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$O.{bucket}.>",
    )


def object_reader_subjects(bucket: str) -> tuple[str, ...]:
    """:func:`object_subjects` for a reader (it may create the bucket, never write objects),
    with wildcards: a service user's JWT travels in its CONNECT line, which the server caps
    at 4 KiB, and the lifecycle's is near that already."""
    api, stream = "$JS.API", f"OBJ_{bucket}"
    return (
        f"{api}.STREAM.*.{stream}",
        f"{api}.STREAM.NAMES",  # nats-py finds the stream of an object's chunks by subject
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.*.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"$JS.FC.{stream}.>",
    )


MAX_TENANT_SANDBOXES = 500  # one allow per sandbox in the JWT: keep it far below max_payload


def tenant_inbox_prefix(tenant: str) -> str:
    """The reply-inbox prefix of ``tenant``'s clients, ``_INBOX.t-<tenant>``: a ``-`` never
    occurs in nats-py's random inbox tokens, so no other client's inbox falls under it."""
    try:
        return f"_INBOX.t-{validate_tenant(tenant)}"
    except ValueError as exc:
        raise BadRequest(str(exc), field="tenant") from exc


def tenant_permissions(prefix: str, tenant: str, sandbox_ids: Sequence[str]) -> Permissions:
    """What a tenant's own client may do, and nothing more: publish requests to its sandboxes'
    data planes (``<prefix>.sbx.<id>.>`` each) and to its tenant control subjects
    (``<prefix>.api.t.<tenant>.>``: the services take the tenant from the subject), and
    subscribe to its own inboxes (``_INBOX.t-<tenant>.>``: replies and stream frames). No
    global ``<prefix>.api.>``, no events, no JetStream or KV API, no other inbox, no ``>``.

    Raises:
        BadRequest: more than :data:`MAX_TENANT_SANDBOXES` sandboxes, or an invalid id.
    """
    subjects = Subjects(prefix)
    if len(sandbox_ids) > MAX_TENANT_SANDBOXES:
        raise BadRequest(
            f"{len(sandbox_ids)} sandboxes is more than one credential can carry "
            f"({MAX_TENANT_SANDBOXES}); delete some, or use the gateway's HTTP API",
            field="sandboxes",
        )
    try:
        data = tuple(subjects.sandbox_all(i) for i in sorted(set(sandbox_ids)))
        control = subjects.api_tenant_all(tenant)
    except ValueError as exc:
        raise BadRequest(str(exc), field="sandboxes") from exc
    return Permissions(pub_allow=(*data, control), sub_allow=(f"{tenant_inbox_prefix(tenant)}.>",))


@dataclasses.dataclass(frozen=True, slots=True)
class TenantCredential:
    """A tenant's NATS credential: the creds file text, the inbox prefix to connect with, its
    expiry (unix seconds) and the sandboxes whose data planes it reaches."""

    creds: str
    inbox_prefix: str
    expires: int
    sandboxes: tuple[str, ...]


def tenant_creds(
    signing_key: KeyPair,
    *,
    prefix: str,
    tenant: str,
    sandbox_ids: Sequence[str],
    now: int,
    ttl: int = 900,
    account: str | None = None,
) -> TenantCredential:
    """Mint ``tenant``'s credential (:func:`tenant_permissions`), valid for ``ttl`` seconds: a
    sandbox created later needs a new one (mint again).

    Args:
        signing_key: the account's key, or one of its signing keys (then ``account`` is the
            account's public key, named in the JWT as ``issuer_account``).

    Raises:
        BadRequest: see :func:`tenant_permissions`; ``ttl`` not positive.
    """
    if ttl <= 0:
        raise BadRequest("a tenant credential needs a positive lifetime", field="ttl")
    permissions = tenant_permissions(prefix, tenant, sandbox_ids)
    issuer = account if account and account != signing_key.public else None
    creds = user_creds(
        signing_key,
        f"tenant:{tenant}",
        permissions,
        now=now,
        expires=now + ttl,
        issuer_account=issuer,
    )
    return TenantCredential(
        creds, tenant_inbox_prefix(tenant), now + ttl, tuple(sorted(set(sandbox_ids)))
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_jwt(claims: Mapping[str, Any], issuer: KeyPair) -> str:
    """Sign ``claims`` (``jti`` is computed, ``iss`` set) with ``issuer``."""
    body = {**claims, "iss": issuer.public, "jti": ""}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).rstrip(b"=").decode()  # like nats-io/jwt: a hash id
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(body).encode())}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def decode_jwt(token: str) -> dict[str, Any]:
    """The claims of a JWT, its signature checked against its ``iss``. Raises BadRequest."""
    try:
        head, body, sig = token.strip().split(".")
        claims: dict[str, Any] = json.loads(_unb64(body))
        raw = base64.b32decode(claims["iss"] + "=" * (-len(claims["iss"]) % 8))
        VerifyKey(raw[1:-2]).verify(f"{head}.{body}".encode(), _unb64(sig))  # prefix, key, crc
    except (ValueError, KeyError, TypeError, BadSignatureError) as exc:
        raise BadRequest(f"not a valid NATS JWT ({type(exc).__name__})") from exc
    return claims


def _claims(
    kind: str,
    subject: str,
    name: str,
    now: int,
    nats: dict[str, Any],
    *,
    expires: int | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "iat": now,
        "sub": subject,
        "name": name,
        "nats": {**nats, "type": kind, "version": 2},
    }
    if expires is not None:
        out["exp"] = expires
    return out


def user_creds(
    account: KeyPair,
    name: str,
    permissions: Permissions,
    *,
    now: int,
    expires: int | None = None,
    user: KeyPair | None = None,
    issuer_account: str | None = None,
) -> str:
    """A creds file (the format nats-py's ``user_credentials=`` and the nats CLI read) for a new
    user (or ``user``) signed by ``account``, expiring at ``expires`` (unix seconds; None: never).
    ``issuer_account``: the account's public key when ``account`` is one of its signing keys.
    """
    user = user or KeyPair.generate("user")
    nats = {**permissions.claims(), "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT}
    if issuer_account:
        nats["issuer_account"] = issuer_account
    jwt = encode_jwt(_claims("user", user.public, name, now, nats, expires=expires), account)
    return (
        f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed}\n------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


def creds_jwt(creds: str) -> str:
    """The user JWT inside a creds file. Raises BadRequest."""
    lines = creds.splitlines()
    for i, line in enumerate(lines[:-1]):
        if "BEGIN NATS USER JWT" in line:
            return lines[i + 1].strip()
    raise BadRequest("no user JWT in the creds file")


@dataclasses.dataclass(frozen=True, slots=True)
class Account:
    """An account as the server's resolver preloads it: public key and its JWT."""

    key: KeyPair
    jwt: str


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorSetup:
    """Everything a NATS in operator mode is made of (generate once per installation)."""

    operator: KeyPair
    operator_jwt: str
    system: Account
    app: Account


def _account(operator: KeyPair, name: str, now: int, *, jetstream: bool) -> Account:
    key = KeyPair.generate("account")
    limits = {
        "subs": NO_LIMIT,
        "data": NO_LIMIT,
        "payload": NO_LIMIT,
        "imports": NO_LIMIT,
        "exports": NO_LIMIT,
        "wildcards": True,
        "conn": NO_LIMIT,
        "leaf": NO_LIMIT,
    }
    if jetstream:  # unlimited storage: JetStream on for this account
        limits |= {
            "mem_storage": NO_LIMIT,
            "disk_storage": NO_LIMIT,
            "streams": NO_LIMIT,
            "consumer": NO_LIMIT,
        }
    nats = {"limits": limits, "default_permissions": {"pub": {}, "sub": {}}}
    return Account(key, encode_jwt(_claims("account", key.public, name, now, nats), operator))


def operator_setup(now: int, name: str = "sandpod") -> OperatorSetup:
    """A new operator, its system account and the app account (JetStream enabled)."""
    operator = KeyPair.generate("operator")
    system = _account(operator, "SYS", now, jetstream=False)
    app = _account(operator, name, now, jetstream=True)
    nats = {"system_account": system.key.public}
    jwt = encode_jwt(_claims("operator", operator.public, name, now, nats), operator)
    return OperatorSetup(operator, jwt, system, app)


def server_config(setup: OperatorSetup, *, extra: Sequence[str] = ()) -> str:
    """The nats-server config block for operator mode with the memory resolver.

    ``extra`` lines (``port: 4222``, ``jetstream { store_dir: ... }``) are appended verbatim.
    Users are never listed here: the server checks each user JWT's chain at connect.
    """
    lines = [
        f"operator: {setup.operator_jwt}",
        f"system_account: {setup.system.key.public}",
        "resolver: MEMORY",
        "resolver_preload: {",
        f"  {setup.system.key.public}: {setup.system.jwt}",
        f"  {setup.app.key.public}: {setup.app.jwt}",
        "}",
        *extra,
    ]
    return "\n".join(lines) + "\n"
