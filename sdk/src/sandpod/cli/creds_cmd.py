"""``sandpod creds nats``: a tenant's NATS credential (issue 12: per-tenant bus credentials).

Two ways to get one, the same credential either way (:func:`sandpod_bus.natsauth.tenant_creds`):

- the administrator on the host: ``sandpod creds nats --tenant acme`` signs with the NATS
  account's seed (``--seed-file``, default ``$SANDPOD_NATS_ACCOUNT_SEED_FILE``) after listing
  acme's sandboxes on acme's own control subject (with the host's NATS credential);
- a tenant anywhere: ``sandpod creds nats --gateway URL`` with its API key
  (``$SANDPOD_API_KEY``) asks the gateway's ``POST /v1/credentials/nats``.

``--out FILE`` writes the creds file (0600) and prints the environment that makes the SDK and
the CLI use it (``SANDPOD_NATS_CREDS``, ``SANDPOD_TENANT``, ``SANDPOD_NATS_INBOX_PREFIX``);
without it the credential is printed as JSON. It expires (``--ttl``): mint again to reach
sandboxes created since.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sandpod.cli.sandbox_cmd import EXIT_ERROR
from sandpod.config import resolve_nats_creds, resolve_nats_url, resolve_prefix
from sandpod.control import api_call
from sandpod.errors import BadRequest, SandboxError, SandpodError
from sandpod_bus import Bus, BusSettings
from sandpod_bus.natsauth import KeyPair, tenant_creds
from sandpod_contract.messages.sandboxes import ObjectsReply, Selection
from sandpod_contract.subjects import Subjects
from sandpod_contract.tenancy import Scope

__all__ = ["add_parsers"]

GATEWAY_TIMEOUT = 30.0


def add_parsers(sub: Any) -> None:
    creds = sub.add_parser("creds", help="credentials: a tenant's NATS credential")
    kinds = creds.add_subparsers(dest="kind", required=True, metavar="KIND")
    p = kinds.add_parser("nats", help="a NATS credential reaching only one tenant's sandboxes")
    p.add_argument("--tenant", help="mint for this tenant here (administrator, on the host)")
    p.add_argument(
        "--seed-file", help="NATS account (signing) seed (default: $SANDPOD_NATS_ACCOUNT_SEED_FILE)"
    )
    p.add_argument("--account", help="the account's public key, if the seed is a signing key")
    p.add_argument("--ttl", type=int, default=900, help="seconds it is valid (default 900)")
    p.add_argument("--gateway", help="ask this gateway instead (API key: $SANDPOD_API_KEY)")
    p.add_argument("--out", help="write the creds file here (0600) and print its environment")
    p.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    p.add_argument("--prefix", help="subject prefix (default: sandpod)")
    p.set_defaults(run=_cmd)


def _cmd(a: argparse.Namespace) -> int:
    try:
        return _nats(a)
    except (SandpodError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _nats(a: argparse.Namespace) -> int:
    if (a.tenant is None) == (a.gateway is None):
        raise BadRequest(
            "give --tenant (mint here, as the administrator) or --gateway URL "
            "(ask the gateway with $SANDPOD_API_KEY)"
        )
    body = _from_gateway(a.gateway) if a.gateway else _mint(a)
    if a.out:
        path = Path(a.out)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(body["creds"])
        path.chmod(0o600)
        print(
            f"SANDPOD_NATS_CREDS={path}\nSANDPOD_TENANT={body['tenant']}\n"
            f"SANDPOD_NATS_INBOX_PREFIX={body['inbox_prefix']}\n"
            f"SANDPOD_PREFIX={body['prefix']}"
        )
    else:
        print(json.dumps(body, indent=2))
    return 0


def _mint(a: argparse.Namespace) -> dict[str, Any]:
    seed_file = a.seed_file or os.environ.get("SANDPOD_NATS_ACCOUNT_SEED_FILE")
    if not seed_file:
        raise BadRequest(
            "no NATS account seed: pass --seed-file or set SANDPOD_NATS_ACCOUNT_SEED_FILE "
            "(the host's NATS account seed)"
        )
    try:
        key = KeyPair.from_seed(Path(seed_file).read_text())
    except OSError as exc:
        raise BadRequest(f"cannot read {seed_file}: {exc.strerror}") from exc
    scope = Scope(a.tenant)  # ValueError names the rule; argparse users get it as an error
    prefix = resolve_prefix(a.prefix)
    ids = asyncio.run(_sandboxes(a.nats_url, Subjects(prefix, tenant=scope.tenant)))
    cred = tenant_creds(
        key,
        prefix=prefix,
        tenant=scope.tenant,
        sandbox_ids=ids,
        now=int(time.time()),
        ttl=a.ttl,
        account=a.account,
    )
    return {
        "creds": cred.creds,
        "inbox_prefix": cred.inbox_prefix,
        "tenant": scope.tenant,
        "prefix": prefix,
        "expires_at": cred.expires,
        "sandboxes": {scope.name_of(i) or i: i for i in cred.sandboxes},
    }


async def _sandboxes(nats_url: str | None, subjects: Subjects) -> list[str]:
    """The tenant's sandbox ids, listed on its own control subject (the host's credential)."""
    settings = BusSettings(
        url=resolve_nats_url(nats_url), name="sandpod-cli:creds", creds=resolve_nats_creds()
    )
    bus = await Bus.connect(settings)
    try:
        listed = await api_call(bus, subjects, "sandboxes", "list", Selection(), ObjectsReply)
    finally:
        await bus.close()
    return [str(i["metadata"]["name"]) for i in listed.items]


def _from_gateway(url: str) -> dict[str, Any]:
    key = os.environ.get("SANDPOD_API_KEY")
    if not key:
        raise BadRequest("set SANDPOD_API_KEY to your gateway API key")
    if not url.startswith(("http://", "https://")):
        raise BadRequest(f"--gateway {url!r}: give an http:// or https:// URL")
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        url.rstrip("/") + "/v1/credentials/nats",
        method="POST",
        data=b"",
        headers={"authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=GATEWAY_TIMEOUT) as reply:  # noqa: S310
            body: dict[str, Any] = json.loads(reply.read())
            return body
    except urllib.error.HTTPError as exc:
        raise SandboxError(f"the gateway refused: {exc.code} {exc.read()[:300]!r}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SandboxError(f"cannot reach the gateway at {url}: {exc}") from exc
