"""Header injection for a ``public`` sandbox, through the whole platform (root, real netns,
nftables, node resolver, egress proxy, lifecycle and the SDK).

A ``public`` policy sends nothing to the egress proxy but the addresses the node resolver
answered the sandbox for a name an ``inject`` entry covers (its injection set). The fake
internet serves HTTP and HTTPS (a test CA the proxy is told to trust upstream) on two
addresses: ``api.example.test`` (injected) on ``public``, ``other.example.test`` on
``public2``, where ``api2.example.test`` (injected with another secret) points too.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_net_lifecycle import DEADLINE, _start_platform

from conftest import NatsServer
from dnsauth import AuthServer
from egress_harness import InternetCA, make_test_ca
from fakenet import FakeNet
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest, Ref
from sandpod_lifecycle.network.nft import Nft
from sandpod_lifecycle.network.secretstore import FileSecretStore, placeholder
from sandpod_lifecycle.runtime.installation import identity

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)

NAMES = ["api.example.test", "other.example.test", "api2.example.test"]
BEARER = '-H "Authorization: Bearer $SANDPOD_SECRET_TOK"'
ICA = "/tmp/internet-ca.pem"
EGRESS_PEM = "/etc/ssl/certs/sandpod-egress.pem"
CONNECT = (
    "bash -c 'exec 3<>/dev/tcp/api.example.test/80 && printf \"CONNECT other.example.test:80 "
    "HTTP/1.1\\r\\nHost: api.example.test\\r\\n\\r\\n\" >&3 && timeout 5 cat <&3'"
)


@pytest.fixture
def internet(tmp_path: Path) -> InternetCA:
    return make_test_ca(tmp_path / "internet", NAMES)


@pytest.fixture
def fakenet(internet: InternetCA) -> Iterator[FakeNet]:
    with FakeNet(tls_cert=internet.cert_file) as net:
        yield net
    assert not net.leftovers()


def _injection_set(state: Path, prefix: str, sandbox_id: str) -> set[str]:
    """The addresses in the sandbox's injection set now (what goes to the proxy)."""
    index = json.loads((state / "net" / f"{sandbox_id}.json").read_text())["index"]
    table = f"sandpod_{identity(prefix, state)}"
    listing = Nft().json(f"list set inet {table} j{index}")
    elems = [i["set"].get("elem", []) for i in listing if "set" in i]
    return {e["elem"]["val"] if isinstance(e, dict) else e for group in elems for e in group}


async def test_a_public_sandbox_gets_its_header_only_on_its_domain_and_nothing_else_is_touched(
    nats: NatsServer,
    tmp_path: Path,
    default_rootfs: Path | None,
    fakenet: FakeNet,
    internet: InternetCA,
) -> None:
    """``mode: public`` + inject ``tok`` for api.example.test: the server sees the secret over
    HTTP and HTTPS (the sandbox holds the placeholder; its TLS is the sandbox authority's);
    other.example.test is reached directly (its own certificate, the placeholder, its address
    never in the injection set); the injected name pinned to another address, a Host other
    than the SNI, a CONNECT to another host, and a pin to an address answered for another
    injected name never get the secret out."""
    secret, secret2 = f"s3cr3t-{uuid.uuid4().hex}", f"other-{uuid.uuid4().hex}"
    auth = AuthServer()
    await auth.start()
    auth.add("api.example.test", "A", 60, fakenet.public)
    auth.add("other.example.test", "A", 60, fakenet.public2)
    auth.add("api2.example.test", "A", 60, fakenet.public2)
    host, port = auth.address
    store = FileSecretStore(tmp_path / "secrets")  # the lifecycle's state dir is tmp_path
    store.put("tok", secret)
    store.put("tok2", secret2)
    proc, prefix = await _start_platform(
        nats,
        tmp_path,
        default_rootfs,
        SANDPOD_DNS_UPSTREAMS=f"{host}:{port}",
        SANDPOD_EGRESS_UPSTREAM_CA_FILE=str(internet.ca_file),
    )
    network = {
        "mode": "public",
        "inject": [
            {"domain": "api.example.test", "secret": "tok"},
            {"domain": "api2.example.test", "secret": "tok2"},
        ],
    }
    try:
        async with await AsyncSandbox.connect("x", nats_url=nats.url, prefix=prefix) as s:
            obj = {
                "kind": "SandboxTemplate",
                "metadata": {"name": "open-injecting"},
                "spec": {"network": network},
            }
            await api_call(
                s.bus, s.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
            )
        async with await AsyncSandbox.create(
            template="open-injecting", nats_url=nats.url, prefix=prefix, wait=DEADLINE
        ) as sbx:
            reply = await api_call(
                sbx.bus, sbx.subjects, "sandboxes", "get", Ref(name=sbx.id), ObjectReply
            )
            status = reply.object["status"]["network"]
            assert status["enforced"] and status["policy"]["mode"] == "public", status
            pem = internet.ca_file.read_text()
            await sbx.exec(f"cat > {ICA} <<'EOF'\n{pem}EOF")

            async def run(command: str) -> str:
                return (await sbx.exec(command)).stdout

            # the injected domain, HTTP and HTTPS: the secret reaches the server
            for url, ca in (
                ("http://api.example.test", ""),
                ("https://api.example.test", EGRESS_PEM),
            ):
                cacert = f"--cacert {ca} " if ca else ""
                seen = await run(f"curl -s -m 5 {cacert}{BEARER} {url}/headers")
                assert f"Authorization: Bearer {secret}" in seen, (url, seen)
                assert placeholder("tok") not in seen
            own = await run(f"curl -s -m 5 --cacert {ICA} https://api.example.test/ || echo mitm")
            assert own.strip().endswith("mitm"), own  # not the server's own certificate
            # another public domain: direct, its own certificate, the placeholder
            for url in ("https://other.example.test", "http://other.example.test"):
                seen = await run(f"curl -s -m 5 --cacert {ICA} {BEARER} {url}/headers")
                assert f"Authorization: Bearer {placeholder('tok')}" in seen, (url, seen)
                assert secret not in seen
            assert _injection_set(tmp_path, prefix, sbx.id) == {fakenet.public}
            # the injected name pinned elsewhere (not in the set): direct, placeholder only
            for scheme, p in (("http", 80), ("https", 443)):
                pin = f"--resolve api.example.test:{p}:{fakenet.public2} --cacert {ICA}"
                seen = await run(f"curl -s -m 5 {pin} {BEARER} {scheme}://api.example.test/headers")
                assert placeholder("tok") in seen and secret not in seen, (scheme, seen)
            # SNI api.example.test, Host other.example.test: refused before the server
            mismatch = f'-H "Host: other.example.test" --cacert {EGRESS_PEM}'
            seen = await run(f"curl -s -m 5 {mismatch} {BEARER} https://api.example.test/headers")
            assert "Host 'other.example.test' is not api.example.test" in seen, seen
            assert secret not in seen
            # plain HTTP to api's address with another Host: that name's, not injected
            seen = await run(
                f'curl -s -m 5 -H "Host: other.example.test" {BEARER} http://api.example.test/headers'
            )
            assert placeholder("tok") in seen and secret not in seen, seen
            # a CONNECT through api's server to another host: refused
            seen = await run(CONNECT)
            assert "403 Forbidden" in seen and "names another host" in seen, seen
            # pinned to an address the resolver answered for api2.example.test: refused
            assert fakenet.public2 in await run("getent hosts api2.example.test")
            assert _injection_set(tmp_path, prefix, sbx.id) == {fakenet.public, fakenet.public2}
            pin = f"--resolve api.example.test:80:{fakenet.public2}"
            seen = await run(f"curl -s -m 5 {pin} {BEARER} http://api.example.test/headers")
            assert "not-resolved" in seen and secret not in seen and secret2 not in seen, seen
            seen = await run(
                'curl -s -m 5 -H "Authorization: Bearer $SANDPOD_SECRET_TOK2" '
                "http://api2.example.test/headers"
            )
            assert f"Authorization: Bearer {secret2}" in seen, seen
            inside = await run(f"env; grep -rs {secret} /etc /tmp /workspace; true")
            assert secret not in inside and secret2 not in inside
    finally:
        proc.stop()
        await auth.close()
