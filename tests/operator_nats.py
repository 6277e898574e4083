"""A real nats-server in operator mode (decentralized JWT auth) for the credential tests.

Built from :func:`sandpod_bus.natsauth.server_config` exactly as an installation's would be: the
operator, the system account and the app account are preloaded into the memory resolver; users
(sandboxes, services) are minted per test by the account key and written as creds files.
``monitor=True`` adds the server's monitoring port on loopback (``connz``: which user JWT each
connection authenticated with, and when it started), for tests that watch a credential rotate.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from conftest import NatsServer, free_port
from sandpod_bus.natsauth import (
    INBOX_ALL,
    OperatorSetup,
    Permissions,
    operator_setup,
    server_config,
    user_creds,
)
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.bus_users import kubernetes_users

__all__ = ["OperatorNats", "Violations", "installation_permissions", "kubernetes_service_users"]

SECRET_MODE = 0o400


def installation_permissions(prefix: str) -> Permissions:
    """A test harness's user: the whole installation (its subjects, inboxes, JetStream of the
    app account). No service gets this: each has its least-privilege user
    (:mod:`sandpod_lifecycle.bus_users`); tests use it to drive and observe everything."""
    both = (f"{prefix}.>", INBOX_ALL, "$JS.>", "$KV.>", "$O.>")
    return Permissions(pub_allow=both, sub_allow=both)


class OperatorNats:
    """nats-server in operator mode plus the keys to mint users for it."""

    def __init__(self, root: Path, host: str = "127.0.0.1", monitor: bool = False) -> None:
        self.root = root
        self.setup: OperatorSetup = operator_setup(int(time.time()))
        self.monitor_port = free_port() if monitor else None
        extra = [f'http: "127.0.0.1:{self.monitor_port}"'] if monitor else []
        config = root / "operator.conf"
        config.write_text(server_config(self.setup, extra=extra))
        (root / "js").mkdir(exist_ok=True)
        self.server = NatsServer(root / "js", config, host=host)
        (root / "creds").mkdir(exist_ok=True)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def account_seed(self) -> str:
        return self.setup.app.key.seed

    def creds(
        self,
        name: str,
        permissions: Permissions,
        *,
        expires: int | None = None,
        issued: int | None = None,
    ) -> Path:
        """A creds file for a new user of the app account."""
        path = self.root / "creds" / f"{name}-{uuid.uuid4().hex[:8]}.creds"
        now = int(time.time()) if issued is None else issued
        path.write_text(user_creds(self.setup.app.key, name, permissions, now=now, expires=expires))
        path.chmod(0o600)
        return path

    def connz(self) -> list[dict[str, Any]]:
        """Every connection the server knows, open and closed, with the user (public key) it
        authenticated as and its ``start``/``stop`` times (needs ``monitor=True``)."""
        if self.monitor_port is None:
            raise RuntimeError("OperatorNats(monitor=True) serves connz")
        url = f"http://127.0.0.1:{self.monitor_port}/connz?state=all&auth=true&limit=100000"
        with urllib.request.urlopen(url, timeout=10) as answer:
            body: dict[str, Any] = json.load(answer)
        return list(body.get("connections") or [])


def kubernetes_service_users(
    op: OperatorNats, prefix: str, credentials: dict[str, dict[str, str]], state: Path
) -> tuple[Path, Path]:
    """A Kubernetes-mode installation's users on ``op``: lifecycle, pool and gateway each get
    their least-privilege creds file in ``credentials`` (module -> env, as ``Cluster`` takes
    it); returns the client user's creds file (an operator's SDK) and the account seed file
    lifecycle mints sandbox creds with (``SANDPOD_NATS_ACCOUNT_SEED_FILE``)."""
    users = kubernetes_users(Subjects(prefix))
    for service in ("lifecycle", "pool", "gateway"):
        creds = op.creds(f"sandpod-{service}", users[service])
        credentials[f"sandpod_{service}"] = {"SANDPOD_NATS_CREDS": str(creds)}
    client_creds = op.creds("sandpod-client", users["client"])
    seed = state / "account.seed"
    seed.write_text(op.account_seed)
    seed.chmod(SECRET_MODE)
    return client_creds, seed


class Violations:
    """The async errors of one connection, with a way to wait for a given one."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self._changed = asyncio.Event()

    async def record(self, exc: Exception) -> None:
        """The connection's ``error_cb`` (nats-py wants a coroutine function)."""
        self.errors.append(str(exc).lower())
        self._changed.set()

    async def wait_for(self, text: str, timeout: float = 10.0) -> None:
        async def seen() -> None:
            while not any(text.lower() in e for e in self.errors):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(seen(), timeout)
