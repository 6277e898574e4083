"""``python -m sandpod_lifecycle.embedded_auth --state-dir DIR``: the embedded NATS's users.

Why: ``sandpod up``'s nats-server must never accept an anonymous connection (any local user
could otherwise publish ``<prefix>.node.<node>.execd.serve`` and make the root execd serve an
unjailed sandbox). So the embedded NATS runs in operator mode, like a cluster's (see
:mod:`sandpod_bus.natsauth`), with one user per service, each with least-privilege
permissions. The SDK may not mint credentials (import-linter), so the supervisor runs this module
before starting nats-server. Everything lives in ``<state_dir>/nats-auth`` (mode 0700):

    setup.json           operator, system and app account keys and JWTs (made once, reused)
    account.seed         the app account's seed: signs user JWTs (tenant credentials)
    operator.conf        the server's operator/resolver block (``include``d by nats.conf)
    <user>.creds         lifecycle, pool, gateway, execd, client: re-minted on every run, so a
                         permission change in a new version takes effect at the next ``up``

Every file is 0600. The keys are made once: creds minted by an earlier run stay valid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from sandpod_bus.natsauth import (
    Account,
    KeyPair,
    OperatorSetup,
    Permissions,
    operator_setup,
    server_config,
    user_creds,
)
from sandpod_contract.errors import BadRequest
from sandpod_contract.subjects import DEFAULT_PREFIX, Subjects
from sandpod_lifecycle.bus_users import EMBEDDED_USERS, embedded_users

__all__ = ["AUTH_DIR", "USERS", "EmbeddedAuth", "embedded_permissions", "main", "provision"]

AUTH_DIR = "nats-auth"
USERS = EMBEDDED_USERS
SETUP_VERSION = 1


def embedded_permissions(subjects: Subjects, node: str) -> dict[str, Permissions]:
    """Each user's publish/subscribe allow lists: :func:`sandpod_lifecycle.bus_users.embedded_users`
    (the one definition Kubernetes mode's setup tool shares)."""
    return embedded_users(subjects, node)


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedAuth:
    """Where the files of one installation's embedded NATS auth are."""

    directory: Path

    @property
    def server_conf(self) -> Path:
        return self.directory / "operator.conf"

    @property
    def account_seed(self) -> Path:
        return self.directory / "account.seed"

    def creds(self, user: str) -> Path:
        if user not in USERS:
            raise ValueError(f"no embedded NATS user {user!r}; one of {USERS}")
        return self.directory / f"{user}.creds"


def _secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (atomic replace)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _dump(setup: OperatorSetup) -> str:
    return json.dumps(
        {
            "version": SETUP_VERSION,
            "operator": setup.operator.seed,
            "operator_jwt": setup.operator_jwt,
            "system": setup.system.key.seed,
            "system_jwt": setup.system.jwt,
            "app": setup.app.key.seed,
            "app_jwt": setup.app.jwt,
        }
    )


def _load(path: Path) -> OperatorSetup:
    """The setup saved at ``path``. Raises BadRequest if it is not one."""
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != SETUP_VERSION:
            raise BadRequest(f"{path}: unknown version {raw.get('version')!r}")
        return OperatorSetup(
            operator=KeyPair.from_seed(raw["operator"]),
            operator_jwt=str(raw["operator_jwt"]),
            system=Account(KeyPair.from_seed(raw["system"]), str(raw["system_jwt"])),
            app=Account(KeyPair.from_seed(raw["app"]), str(raw["app_jwt"])),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadRequest(f"{path} is not a Sandpod NATS setup ({exc}); move it away") from exc


def provision(state_dir: Path, prefix: str, node: str, now: int) -> EmbeddedAuth:
    """Make (once) or reuse the keys in ``<state_dir>/nats-auth``; (re)write conf and creds.

    Raises:
        BadRequest: a damaged ``setup.json``.
        ValueError: an invalid prefix or node.
    """
    subjects = Subjects(prefix)
    perms = embedded_permissions(subjects, node)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory = state_dir / AUTH_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)
    saved = directory / "setup.json"
    if saved.exists():
        setup = _load(saved)
    else:
        setup = operator_setup(now)
        _secret(saved, _dump(setup))
    saved.chmod(0o600)
    auth = EmbeddedAuth(directory)
    _secret(auth.account_seed, setup.app.key.seed + "\n")
    _secret(auth.server_conf, server_config(setup))
    for user, permissions in perms.items():
        creds = user_creds(setup.app.key, f"sandpod-{user}", permissions, now=now)
        _secret(auth.creds(user), creds)
    return auth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandpod_lifecycle.embedded_auth", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="the installation's prefix")
    parser.add_argument("--node", required=True, help="the node id lifecycle runs with")
    args = parser.parse_args(argv)
    try:
        auth = provision(args.state_dir, args.prefix, args.node, int(time.time()))
    except (BadRequest, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(auth.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
