"""Attack with a tenant's own NATS credential on a real nats-server in operator mode.

Tenant ``acme`` gets a credential (:func:`sandpod_bus.natsauth.tenant_creds`, as the gateway's
``POST /v1/credentials/nats`` and ``sandpod creds nats`` mint it) and tries everything it is not
meant to reach: tenant ``beta``'s sandboxes and control subjects, the global control plane,
JetStream and KV, everything (``>``), other inboxes. The server refuses each with a permissions
violation; its own sandboxes and its own control plane (on ``<prefix>.api.t.acme.…``, whose
tenant the services take from the subject, not the body) keep working, and beta's sandbox is
untouched. A real lifecycle (process runtime) serves the control plane.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from gateway_harness import mint_key
from nats.aio.client import Client

from operator_nats import OperatorNats, Violations, installation_permissions
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod_bus import Bus, BusSettings
from sandpod_bus.natsauth import (
    TenantCredential,
    creds_jwt,
    decode_jwt,
    tenant_creds,
)
from sandpod_contract.errors import ResourceInvalid, ResourceNotFound
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.subjects import Subjects
from sandpod_gateway.service import GatewayService
from sandpod_gateway.settings import GatewaySettings
from svcprocs import ServiceProc, kill_instances

__all__: list[str] = []

API = "sandpod.dev/v1alpha1"


@dataclasses.dataclass
class Platform:
    op: OperatorNats
    prefix: str
    service_creds: Path
    bus: Bus
    ids: dict[str, list[str]]  # tenant -> its sandbox ids

    def mint(self, tenant: str, tmp: Path) -> tuple[TenantCredential, Path]:
        key, ids = self.op.setup.app.key, self.ids[tenant]
        cred = tenant_creds(
            key, prefix=self.prefix, tenant=tenant, sandbox_ids=ids, now=int(time.time()), ttl=600
        )
        path = tmp / f"{tenant}-{uuid.uuid4().hex[:6]}.creds"
        path.write_text(cred.creds)
        path.chmod(0o600)
        return cred, path


async def _create(bus: Bus, subjects: Subjects, tenant: str, name: str) -> str:
    obj = {"apiVersion": API, "kind": "Sandbox", "metadata": {"name": name}, "spec": {}}
    reply = await api_call(
        bus,
        subjects,
        "sandboxes",
        "create",
        ObjectRequest(object=obj, wait_ready=30),
        ObjectReply,
        timeout=40,
    )
    assert reply.object["status"]["phase"] == "Running", reply.object["status"]
    return str(reply.object["metadata"]["name"])


@pytest.fixture
async def platform(operator_nats: OperatorNats, tmp_path: Path) -> AsyncIterator[Platform]:
    """A lifecycle replica on the operator-mode server (service creds; its execds inherit
    them), with sandboxes a1, a2 of tenant acme and b1 of tenant beta, created by the
    administrator on each tenant's subject."""
    prefix = f"tc{uuid.uuid4().hex[:8]}"
    service = operator_nats.creds("svc", installation_permissions(prefix))
    proc = ServiceProc(
        "sandpod_lifecycle",
        operator_nats.server,
        tmp_path,
        prefix,
        "lc0",
        SANDPOD_NATS_CREDS=str(service),
        SANDPOD_RUNTIME="process",
        SANDPOD_RESYNC="0.5",
        SANDPOD_DESTROY_ON_EXIT="true",
    )
    bus = await Bus.connect(BusSettings(url=operator_nats.url, creds=str(service)))
    try:
        deadline = time.monotonic() + 30
        while True:  # lifecycle starts concurrently
            try:
                await api_call(
                    bus, Subjects(prefix), "sandboxes", "list", Selection(), ObjectsReply, timeout=2
                )
                break
            except Exception:
                assert time.monotonic() < deadline, proc.tail(30)
                await asyncio.sleep(0.1)
        ids: dict[str, list[str]] = {"acme": [], "beta": []}
        for tenant, name in (("acme", "a1"), ("acme", "a2"), ("beta", "b1")):
            ids[tenant].append(await _create(bus, Subjects(prefix, tenant=tenant), tenant, name))
        assert ids == {"acme": ["acme--a1", "acme--a2"], "beta": ["beta--b1"]}
        yield Platform(operator_nats, prefix, service, bus, ids)
    finally:
        await bus.close()
        proc.stop()
        kill_instances(tmp_path)


@pytest.fixture
async def connect(operator_nats: OperatorNats) -> AsyncIterator[Any]:
    opened: list[Client] = []

    async def open_(creds: Path, inbox_prefix: str) -> tuple[Client, Violations]:
        violations = Violations()
        nc = await nats.connect(
            operator_nats.url,
            user_credentials=str(creds),
            inbox_prefix=inbox_prefix,
            error_cb=violations.record,
        )
        opened.append(nc)
        return nc, violations

    yield open_
    for nc in opened:
        await nc.close()


async def test_a_tenant_credential_is_refused_everything_but_its_own(
    platform: Platform, connect: Any, tmp_path: Path
) -> None:
    """acme's credential: publishing to beta's sandbox, beta's and the global control plane,
    JetStream, KV and events, and subscribing to ``>``, beta's or anyone's inboxes, or a
    data plane, are each a permissions violation; its own subjects raise none."""
    s = Subjects(platform.prefix)
    cred, path = platform.mint("acme", tmp_path)
    nc, violations = await connect(path, cred.inbox_prefix)
    beta = platform.ids["beta"][0]
    # its own: no violation (a request to its sandbox answers; its control plane answers)
    assert (await nc.request(s.sandbox("acme--a1", "sys", "ping"), b"", timeout=5)).data
    await nc.subscribe(f"{cred.inbox_prefix}.mine")
    await nc.flush()
    assert violations.errors == []
    attempts = [
        ("publish", s.sandbox(beta, "exec", "run")),
        ("publish", s.sandbox(beta, "sys", "ping")),
        ("publish", s.api_tenant("beta", "sandboxes", "list")),
        ("publish", s.api_tenant("beta", "sandboxes", "delete")),
        ("publish", s.api("sandboxes", "list")),
        ("publish", s.api("sandboxes", "delete")),
        ("publish", s.api("pools", "apply")),
        ("publish", s.node("n1", "execd", "serve")),
        ("publish", s.event("sandbox", "acme--a1", "ready")),
        ("publish", "$JS.API.INFO"),
        ("publish", f"$JS.API.STREAM.INFO.{s.storage('events')}"),
        ("publish", f"$KV.{s.storage('resources')}.Sandbox.default.acme--a1"),
        ("publish", "_INBOX.t-beta.anything"),
        ("subscription", ">"),
        ("subscription", f"{platform.prefix}.>"),
        ("subscription", s.sandbox_all("acme--a1")),
        ("subscription", s.sandbox_all(beta)),
        ("subscription", "_INBOX.>"),
        ("subscription", "_INBOX.t-beta.>"),
        ("subscription", "$KV.>"),
        ("subscription", s.events_all()),
    ]
    for verb, subject in attempts:
        if verb == "subscription":
            await nc.subscribe(subject)
        else:
            await nc.publish(subject, b"x")
        await nc.flush()
        await violations.wait_for(f'permissions violation for {verb} to "{subject}"')
    assert nc.is_connected and len(violations.errors) == len(attempts)
    # a request on beta's sandbox never gets through
    with pytest.raises(nats.errors.Error):
        await nc.request(s.sandbox(beta, "sys", "ping"), b"", timeout=1)
    # nothing harmed: beta's sandbox runs, beta's credential reaches it
    bcred, bpath = platform.mint("beta", tmp_path)
    sbx = await AsyncSandbox.connect(
        beta,
        nats_url=platform.op.url,
        prefix=platform.prefix,
        nats_creds=str(bpath),
        tenant="beta",
        inbox_prefix=bcred.inbox_prefix,
    )
    try:
        assert (await sbx.exec(["echo", "beta"])).stdout == "beta\n"
    finally:
        await sbx.close()


async def test_a_tenant_credential_runs_its_own_sandboxes_and_control_plane(
    platform: Platform, tmp_path: Path
) -> None:
    """With acme's credential and inbox prefix: exec (one-shot and streamed) in its sandbox;
    its control-plane list shows only its sandboxes; naming beta's sandbox in the body of its
    own subject (get, delete) finds nothing, and beta's sandbox is still there."""
    cred, path = platform.mint("acme", tmp_path)
    sbx = await AsyncSandbox.connect(
        "acme--a1",
        nats_url=platform.op.url,
        prefix=platform.prefix,
        nats_creds=str(path),
        tenant="acme",
        inbox_prefix=cred.inbox_prefix,
    )
    try:
        assert (await sbx.exec(["echo", "mine"])).stdout == "mine\n"
        out = b""
        async with sbx.exec_stream("echo one; echo two") as st:
            async for chunk in st:  # frames to acme's own inbox
                out += chunk.data
            assert (await st.wait()).exit_code == 0
        assert out == b"one\ntwo\n"
        tenant = Subjects(platform.prefix, tenant="acme")
        listed = await api_call(sbx.bus, tenant, "sandboxes", "list", Selection(), ObjectsReply)
        assert sorted(i["metadata"]["name"] for i in listed.items) == ["acme--a1", "acme--a2"]
        for verb in ("get", "delete"):
            with pytest.raises(ResourceNotFound):
                await api_call(
                    sbx.bus, tenant, "sandboxes", verb, Ref(name="beta--b1"), ObjectReply
                )
        with pytest.raises(ResourceNotFound):  # a namespace in the body changes nothing
            await api_call(
                sbx.bus, tenant, "sandboxes", "get", Ref(name="b1", namespace="beta"), ObjectReply
            )
        # creating one of beta's ids is refused; a sandbox created on its own subject is its
        # own, whatever namespace the body names
        forged = {
            "apiVersion": API,
            "kind": "Sandbox",
            "spec": {},
            "metadata": {"name": "beta--x", "namespace": "beta"},
        }
        with pytest.raises(ResourceInvalid):
            await api_call(
                sbx.bus, tenant, "sandboxes", "create", ObjectRequest(object=forged), ObjectReply
            )
        obj = {**forged, "metadata": {"name": "x", "namespace": "beta"}}
        made = await api_call(
            sbx.bus, tenant, "sandboxes", "create", ObjectRequest(object=obj), ObjectReply
        )
        meta = made.object["metadata"]
        assert (meta["name"], meta["namespace"]) == ("acme--x", "default")
        assert meta["labels"]["sandpod.dev/tenant"] == "acme"
    finally:
        await sbx.close()
    still = await api_call(
        platform.bus,
        Subjects(platform.prefix),
        "sandboxes",
        "get",
        Ref(name="beta--b1"),
        ObjectReply,
    )
    assert "delete-requested" not in str(still.object["metadata"].get("annotations", {}))


async def test_the_gateway_mints_a_tenant_credential_for_the_api_key(
    platform: Platform, tmp_path: Path
) -> None:
    """``POST /v1/credentials/nats`` with acme's key: a credential whose JWT allows exactly
    acme's sandboxes' data planes and acme's control subjects and inbox, which runs a command
    in acme's sandbox; without the account seed the endpoint is a 503 ``busy.not_configured``."""
    seed = tmp_path / "account.seed"
    seed.write_text(platform.op.account_seed)
    seed.chmod(0o600)
    bus_settings = BusSettings(url=platform.op.url, creds=str(platform.service_creds))
    base = GatewaySettings(bus=bus_settings, prefix=platform.prefix, port=0, grace=2.0)
    started = []
    try:
        for settings in (dataclasses.replace(base, nats_account_seed_file=seed), base):
            gw_bus = await Bus.connect(settings.bus)
            service = GatewayService(settings)
            await service.start(gw_bus)
            started.append((service, gw_bus))
        (minting, mbus), (plain, _) = started
        key = await mint_key(type("G", (), {"bus": mbus, "service": minting})(), "acme")
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=plain.url, headers=headers) as c:
            r = await c.post("/v1/credentials/nats")
            assert r.status_code == 503 and r.json()["code"] == "busy.not_configured", r.text
        async with httpx.AsyncClient(base_url=minting.url, headers=headers) as c:
            r = await c.post("/v1/credentials/nats")
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["sandboxes"] == {"a1": "acme--a1", "a2": "acme--a2"}
        perms = decode_jwt(creds_jwt(body["creds"]))["nats"]
        s = Subjects(platform.prefix)
        assert sorted(perms["pub"]["allow"]) == sorted(
            [s.sandbox_all("acme--a1"), s.sandbox_all("acme--a2"), s.api_tenant_all("acme")]
        )
        assert perms["sub"]["allow"] == [f"{body['inbox_prefix']}.>"]
        assert body["expires_at"] - time.time() <= 900
        path = tmp_path / "acme.creds"
        path.write_text(body["creds"])
        sbx = await AsyncSandbox.connect(
            "acme--a2",
            nats_url=platform.op.url,
            prefix=platform.prefix,
            nats_creds=str(path),
            tenant="acme",
            inbox_prefix=body["inbox_prefix"],
        )
        try:
            assert (await sbx.exec(["echo", "via-gateway"])).stdout == "via-gateway\n"
        finally:
            await sbx.close()
        # the tenant's CLI asks the same endpoint with its API key
        env = {**os.environ, "SANDPOD_API_KEY": key}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sandpod", "creds", "nats", "--gateway", minting.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        via_cli = json.loads(done.stdout)
        assert via_cli["tenant"] == "acme" and via_cli["sandboxes"] == body["sandboxes"]
        env["SANDPOD_API_KEY"] = "spk_nope_nope"
        refused = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sandpod", "creds", "nats", "--gateway", minting.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 125 and "401" in refused.stderr, refused.stderr
    finally:
        for service, gw_bus in started:
            await service.stop(2.0)
            await gw_bus.drain()


async def test_the_cli_mints_a_tenant_credential_on_the_host(
    platform: Platform, tmp_path: Path
) -> None:
    """``sandpod creds nats --tenant beta --out FILE`` (the administrator, with the host's
    credential and the account seed): a 0600 creds file and the environment to use it, which
    reaches beta's sandbox and nothing of acme's."""
    seed = tmp_path / "account.seed"
    seed.write_text(platform.op.account_seed)
    out = tmp_path / "beta.creds"
    env = {
        **os.environ,
        "SANDPOD_NATS_URL": platform.op.url,
        "SANDPOD_PREFIX": platform.prefix,
        "SANDPOD_NATS_CREDS": str(platform.service_creds),
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "sandpod",
            "creds",
            "nats",
            "--tenant",
            "beta",
            "--seed-file",
            str(seed),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    printed = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert printed["SANDPOD_NATS_CREDS"] == str(out) and printed["SANDPOD_TENANT"] == "beta"
    assert out.stat().st_mode & 0o777 == 0o600
    perms = decode_jwt(creds_jwt(out.read_text()))["nats"]
    s = Subjects(platform.prefix)
    assert sorted(perms["pub"]["allow"]) == [s.api_tenant_all("beta"), s.sandbox_all("beta--b1")]
    sbx = await AsyncSandbox.connect(
        "beta--b1",
        nats_url=platform.op.url,
        prefix=platform.prefix,
        nats_creds=str(out),
        tenant="beta",
        inbox_prefix=printed["SANDPOD_NATS_INBOX_PREFIX"],
    )
    try:
        assert (await sbx.exec(["echo", "cli"])).stdout == "cli\n"
    finally:
        await sbx.close()
    bad = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sandpod", "creds", "nats", "--tenant", "beta"],
        env={k: v for k, v in env.items() if k != "SANDPOD_NATS_ACCOUNT_SEED_FILE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 125 and "--seed-file" in bad.stderr
