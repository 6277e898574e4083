"""A real nats-server in operator mode (decentralized JWT auth) for the credential tests.

Built from :func:`sandpod_bus.natsauth.server_config` exactly as an installation's would be: the
operator, the system account and the app account are preloaded into the memory resolver; users
(sandboxes, services) are minted per test by the account key and written as creds files.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from conftest import NatsServer
from sandpod_bus.natsauth import (
    INBOX_ALL,
    OperatorSetup,
    Permissions,
    operator_setup,
    server_config,
    user_creds,
)

__all__ = ["OperatorNats", "Violations", "installation_permissions"]


def installation_permissions(prefix: str) -> Permissions:
    """A test harness's user: the whole installation (its subjects, inboxes, JetStream of the
    app account). No service gets this: each has its least-privilege user
    (:mod:`sandpod_lifecycle.bus_users`); tests use it to drive and observe everything."""
    both = (f"{prefix}.>", INBOX_ALL, "$JS.>", "$KV.>", "$O.>")
    return Permissions(pub_allow=both, sub_allow=both)


class OperatorNats:
    """nats-server in operator mode plus the keys to mint users for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.setup: OperatorSetup = operator_setup(int(time.time()))
        config = root / "operator.conf"
        config.write_text(server_config(self.setup))
        (root / "js").mkdir(exist_ok=True)
        self.server = NatsServer(root / "js", config)
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
