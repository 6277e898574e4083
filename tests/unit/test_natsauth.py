"""NATS JWT minting (sandpod_bus.natsauth) and the sandbox creds lifetime policy (podcreds)."""

from __future__ import annotations

import base64
import json

import pytest

from sandpod_bus.natsauth import (
    KeyPair,
    creds_jwt,
    decode_jwt,
    operator_setup,
    sandbox_permissions,
    user_creds,
)
from sandpod_contract.errors import BadRequest
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.runtime.podcreds import CredsPolicy

NOW = 1_800_000_000
HOUR = 3600


def test_user_jwt_carries_the_claims_nats_expects_signed_by_the_account() -> None:
    """Header, issuer, subject, expiry, permissions, and a signature checked against ``iss``."""
    setup = operator_setup(NOW)
    creds = user_creds(
        setup.app.key, "sandbox:a", sandbox_permissions("p.sbx.a.>"), now=NOW, expires=NOW + HOUR
    )
    token = creds_jwt(creds)
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = decode_jwt(token)
    assert claims["iss"] == setup.app.key.public and claims["sub"].startswith("U")
    assert (claims["iat"], claims["exp"], claims["name"]) == (NOW, NOW + HOUR, "sandbox:a")
    assert claims["nats"]["type"] == "user" and claims["nats"]["version"] == 2
    assert claims["nats"]["sub"] == {"allow": ["p.sbx.a.>"]}
    assert claims["nats"]["pub"] == {"allow": ["_INBOX.>"]}
    assert claims["nats"]["resp"] == {"max": 1, "ttl": 0}
    assert "-----BEGIN USER NKEY SEED-----\nSU" in creds
    operator = decode_jwt(setup.operator_jwt)
    assert operator["nats"]["system_account"] == setup.system.key.public
    assert decode_jwt(setup.app.jwt)["nats"]["limits"]["disk_storage"] == -1  # JetStream on


def test_a_tampered_jwt_is_refused() -> None:
    """Widening the permissions in a signed JWT breaks its signature."""
    setup = operator_setup(NOW)
    token = creds_jwt(user_creds(setup.app.key, "a", sandbox_permissions("p.sbx.a.>"), now=NOW))
    head, body, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["nats"]["sub"] = {"allow": [">"]}
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(BadRequest):
        decode_jwt(f"{head}.{forged}.{sig}")


def test_a_seed_that_is_not_an_nkey_is_a_typed_error() -> None:
    with pytest.raises(BadRequest):
        KeyPair.from_seed("not-a-seed")
    key = KeyPair.generate("account")
    assert KeyPair.from_seed(key.seed + "\n") == key  # a seed file's trailing newline is fine


def policy() -> CredsPolicy:
    return CredsPolicy(KeyPair.generate("account"), Subjects("p"), ttl=24 * HOUR, margin=300)


def test_expiry_follows_the_sandbox_lifetime_capped_by_the_ttl() -> None:
    """shutdownTime + margin; a permanent or far sandbox gets ``ttl`` from now."""
    p = policy()
    assert p.expiry(NOW + HOUR, NOW) == NOW + HOUR + 300
    assert p.expiry(None, NOW) == NOW + 24 * HOUR
    assert p.expiry(NOW + 30 * 24 * HOUR, NOW) == NOW + 24 * HOUR


def test_renewal_at_half_life_after_a_renew_and_never_in_a_loop() -> None:
    p = policy()
    short = p.expiry(NOW + HOUR, NOW)  # a one-hour sandbox: never re-minted while it lives
    assert not any(p.stale(short, NOW + HOUR, NOW + t) for t in range(0, HOUR + 300, 60))
    permanent = p.expiry(None, NOW)  # re-minted once half of the ttl has gone
    assert not p.stale(permanent, None, NOW + 11 * HOUR)
    assert p.stale(permanent, None, NOW + 13 * HOUR)
    # A renew (shutdownTime moved a day later): re-minted, and the new one is not stale.
    assert p.stale(short, NOW + 25 * HOUR, NOW + 10 * 60)
    renewed = p.expiry(NOW + 25 * HOUR, NOW + 10 * 60)
    assert not p.stale(renewed, NOW + 25 * HOUR, NOW + 11 * 60)
    # A renew by one minute: re-minted before the old one runs out, not only at its last second.
    assert not p.stale(short, NOW + HOUR + 60, NOW + 30 * 60)
    assert p.stale(short, NOW + HOUR + 60, NOW + HOUR + 60)


def test_a_ttl_shorter_than_the_margin_renews_at_half_life_not_on_every_pass() -> None:
    """ttl 60 s, margin 300 s: a JWT capped by the ttl is fresh for its first half, stale after
    (before the fix, the margin rule made it stale one second after minting, every pass)."""
    p = CredsPolicy(KeyPair.generate("account"), Subjects("p"), ttl=60, margin=300)
    for shutdown in (None, NOW + HOUR):
        jwt_exp = p.expiry(shutdown, NOW)
        assert jwt_exp == NOW + 60
        assert not any(p.stale(jwt_exp, shutdown, NOW + t) for t in range(30))
        assert p.stale(jwt_exp, shutdown, NOW + 31)


def test_a_ttl_whose_half_life_a_default_kubelet_cannot_meet_is_flagged() -> None:
    """A 60 s ttl (half-life 30 s) is shorter than a default kubelet's Secret delivery (~95 s
    worst: 1 m syncFrequency, jitter, execd's poll); the default ttl and 190 s are not."""
    key = KeyPair.generate("account")
    assert CredsPolicy(key, Subjects("p"), ttl=60).too_short_for()
    assert not CredsPolicy(key, Subjects("p"), ttl=190).too_short_for()
    assert not CredsPolicy(key, Subjects("p")).too_short_for()
    assert not CredsPolicy(key, Subjects("p"), ttl=60).too_short_for(delivery=15)  # 10 s sync


def test_minted_creds_are_scoped_to_the_sandbox() -> None:
    minted = policy().mint("s1", NOW + HOUR, NOW)
    claims = decode_jwt(creds_jwt(minted.creds))
    assert claims["exp"] == minted.expires == NOW + HOUR + 300
    assert claims["nats"]["sub"] == {"allow": ["p.sbx.s1.>"]}
