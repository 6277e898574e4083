"""A header injection added to a *running* local sandbox, through the whole platform (root, real
netns, nftables, node resolver, egress proxy, lifecycle and the SDK).

The sandbox starts with ``public`` and no injection: it trusts no Sandpod authority (an empty
extra file, no block in its bundle) and ``https://api.example.test`` is the fake internet's own
server, whose certificate the sandbox does not trust. ``sbx.network.update(inject=...)`` then
adds the injection: the lifecycle rewrites the running sandbox's trust files through its root
(``runtime/jailtrust.py``), so a new ``curl`` with the default trust gets through the proxy and
the server sees the secret, and new commands get the secret's placeholder variable (the
lifecycle's ``sys.configure``). Removing the injection takes the authority out again.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from test_net_inject_public import fakenet, internet  # noqa: F401 (fixtures)
from test_net_lifecycle import DEADLINE, _start_platform

from conftest import NatsServer
from dnsauth import AuthServer
from egress_harness import InternetCA
from fakenet import FakeNet
from sandpod import AsyncSandbox
from sandpod_lifecycle.network.secretstore import FileSecretStore, placeholder

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)

EXTRA = "/etc/ssl/certs/sandpod-egress.pem"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
MARK = "sandpod egress authorities (managed"
HEADERS = (
    'curl -s -m 5 -H "Authorization: Bearer x" https://api.example.test/headers; echo " rc=$?"'
)


async def test_an_injection_added_at_runtime_is_trusted_by_new_commands_and_removed_again(
    nats: NatsServer,
    tmp_path: Path,
    default_rootfs: Path | None,
    fakenet: FakeNet,  # noqa: F811 (the fixture)
    internet: InternetCA,  # noqa: F811 (the fixture)
) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    auth = AuthServer()
    await auth.start()
    auth.add("api.example.test", "A", 60, fakenet.public)
    host, port = auth.address
    FileSecretStore(tmp_path / "secrets").put("tok", secret)  # the lifecycle's state dir
    proc, prefix = await _start_platform(
        nats,
        tmp_path,
        default_rootfs,
        SANDPOD_DNS_UPSTREAMS=f"{host}:{port}",
        SANDPOD_EGRESS_UPSTREAM_CA_FILE=str(internet.ca_file),
    )
    try:
        async with await AsyncSandbox.create(
            nats_url=nats.url, prefix=prefix, wait=DEADLINE, network={"mode": "public"}
        ) as sbx:

            async def run(command: str) -> str:
                return (await sbx.exec(command)).stdout

            # no injection: no Sandpod authority, the variables already there
            env = await run("echo $NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE; wc -c < " + EXTRA)
            assert env.split() == [EXTRA, BUNDLE, "0"], env
            assert (await run(f"grep -c '{MARK}' {BUNDLE}; true")).strip() == "0"
            seen = await run(HEADERS)
            assert seen.strip().endswith("rc=60"), seen  # the server's own, untrusted cert

            view = await sbx.network.update(
                inject=[{"domain": "api.example.test", "secret": "tok"}]
            )
            assert view.enforced, view
            seen = await run(HEADERS)  # a new command, the default trust
            assert f"Authorization: Bearer {secret}" in seen, seen

            async def has_placeholder() -> bool:  # new commands get the secret's variable
                return (await run("echo $SANDPOD_SECRET_TOK")).strip() == placeholder("tok")

            end = time.monotonic() + 30
            while not await has_placeholder():
                assert time.monotonic() < end, "no SANDPOD_SECRET_TOK in a new command's env"
            assert (await run(f"grep -c '{MARK}' {BUNDLE}")).strip() == "1"
            assert "BEGIN CERTIFICATE" in await run(f"cat {EXTRA}")
            assert secret not in await run(f"cat {EXTRA} {BUNDLE}; env")

            await sbx.network.update(inject=[])
            seen = await run(HEADERS)
            assert seen.strip().endswith("rc=60") and secret not in seen, seen
            assert (await run(f"grep -c '{MARK}' {BUNDLE}; true")).strip() == "0"
            assert (await run(f"wc -c < {EXTRA}")).strip() == "0"
    finally:
        proc.stop()
        await auth.close()
