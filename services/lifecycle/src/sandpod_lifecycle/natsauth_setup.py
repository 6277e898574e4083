"""``python -m sandpod_lifecycle.natsauth_setup --out DIR``: an installation's NATS operator-mode
keys, once, before installing.

Why: per-sandbox NATS credentials need a NATS in operator mode (decentralized JWT auth) and the
lifecycle holding the account's signing seed. Helm templates cannot make ed25519 keys, so this
writes everything the chart and the server need into ``DIR``:

    operator.seed            the operator's key: signs accounts. Keep it offline; not deployed.
    account.seed             the app account's key: lifecycle mints sandbox users with it.
    lifecycle.creds          service users, each with least-privilege permissions (the same
    pool.creds               definition as the embedded mode's, :mod:`sandpod_lifecycle.bus_users`:
    gateway.creds            only gateway reaches its key bucket, only lifecycle the event stream;
    client.creds             no node plane, no KV store; client is for an operator's CLI/SDK);
                             no expiry: rotate by re-running and re-deploying (see the chart
                             README)
    nats-server.conf         operator/resolver block for a nats-server config (``include`` it)
    nats-values.yaml         the same for the official NATS Helm chart (``nats.config.merge``)

JWTs are public (signed, not secret); seeds and creds files are secrets (mode 0600 here, a
Kubernetes Secret in the cluster: ``kubectl create secret generic <name> --from-file=DIR/...``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sandpod_bus.natsauth import OperatorSetup, operator_setup, server_config, user_creds
from sandpod_contract.subjects import DEFAULT_PREFIX, Subjects
from sandpod_lifecycle.bus_users import KUBERNETES_USERS, kubernetes_users

__all__ = ["SERVICES", "main", "write_setup"]

SERVICES = KUBERNETES_USERS


def _secret(path: Path, text: str) -> None:
    path.touch(mode=0o600, exist_ok=False)
    path.write_text(text)


def helm_values(setup: OperatorSetup) -> dict[str, object]:
    """``nats.config.merge`` of the official NATS chart: operator mode, memory resolver."""
    merge = {
        "operator": setup.operator_jwt,
        "system_account": setup.system.key.public,
        "resolver": "MEMORY",
        "resolver_preload": {
            setup.system.key.public: setup.system.jwt,
            setup.app.key.public: setup.app.jwt,
        },
    }
    return {"nats": {"config": {"merge": merge}}}


def write_setup(out: Path, prefix: str, now: int) -> OperatorSetup:
    """Create ``out`` (must not exist) with the files listed in the module docstring.

    Raises:
        FileExistsError: ``out`` exists (never overwrite keys).
        ValueError: ``prefix`` is not a valid subject prefix.
    """
    users = kubernetes_users(Subjects(prefix))  # validates the prefix
    out.mkdir(mode=0o700, parents=True, exist_ok=False)
    setup = operator_setup(now)
    _secret(out / "operator.seed", setup.operator.seed + "\n")
    _secret(out / "account.seed", setup.app.key.seed + "\n")
    for service, permissions in users.items():
        creds = user_creds(setup.app.key, f"sandpod-{service}", permissions, now=now)
        _secret(out / f"{service}.creds", creds)
    (out / "nats-server.conf").write_text(server_config(setup))
    # JSON is YAML: no YAML library needed for one document.
    (out / "nats-values.yaml").write_text(json.dumps(helm_values(setup), indent=2) + "\n")
    return setup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandpod_lifecycle.natsauth_setup", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="new directory for the files")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="the installation's prefix")
    args = parser.parse_args(argv)
    try:
        setup = write_setup(args.out, args.prefix, int(time.time()))
    except (FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: operator {setup.operator.public}, account {setup.app.key.public}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
