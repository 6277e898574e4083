"""Sandbox egress through the whole platform: a lifecycle (local runtime, as root) and the SDK.

A sandbox created as a user would (the SDK, the default template: ``public``) reaches the fake
internet by address, not the metadata server, and reports its address in
``status.endpoint["address"]``; a template's ``deny-all`` reaches nothing; stopping the
platform leaves no link, table or route of its installation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conftest import NatsServer
from dnsauth import AuthServer
from fakenet import FakeNet
from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import SandpodError
from sandpod_contract.messages.sandboxes import NetworkEvent, ObjectReply, ObjectRequest, Ref
from sandpod_lifecycle.network.nft import Nft
from sandpod_lifecycle.network.secretstore import FileSecretStore
from sandpod_lifecycle.runtime.installation import identity
from svcprocs import ServiceProc

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
DEADLINE = 60.0
CURL = "curl -s -m 3 http://{}/ || echo unreachable"


@pytest.fixture
def fakenet() -> Iterator[FakeNet]:
    with FakeNet() as net:
        yield net
    assert not net.leftovers()


async def _start_platform(
    nats: NatsServer, state: Path, default_rootfs: Path | None, **extra: str
) -> tuple[ServiceProc, str]:
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    proc = ServiceProc(
        "sandpod_lifecycle",
        nats,
        state,
        prefix,
        "r0",
        SANDPOD_RUNTIME="local",
        SANDPOD_RESYNC="0.5",
        wrap=(),
        SANDPOD_DESTROY_ON_EXIT="true",
        SANDPOD_NET_REGISTRY=str(state / "net-ranges.json"),
        **extra,
    )
    end = time.monotonic() + DEADLINE
    while True:
        try:
            await AsyncSandbox.list(nats_url=nats.url, prefix=prefix)
            return proc, prefix
        except SandpodError:
            if proc.proc.poll() is not None or time.monotonic() > end:
                proc.stop()
                pytest.fail(f"lifecycle did not come up:\n{proc.tail()}")
            await asyncio.sleep(0.05)


@pytest.fixture
async def platform(
    nats: NatsServer, tmp_path: Path, default_rootfs: Path | None
) -> AsyncIterator[tuple[ServiceProc, str]]:
    proc, prefix = await _start_platform(nats, tmp_path, default_rootfs)
    try:
        yield proc, prefix
    finally:
        proc.stop()


async def _denied_event(sbx: AsyncSandbox, attempt: str, destination: str) -> NetworkEvent:
    """The sandbox's ``network.denied`` event naming ``destination`` (read through the SDK's
    ``sbx.network.events()``), refused attempts repeated until it comes (the log is
    rate-limited per sandbox: one attempt may fall between two of its slots; the first may
    also come before the subscription)."""
    got: asyncio.Queue[NetworkEvent] = asyncio.Queue()
    events = sbx.network.events()

    async def pump() -> None:
        async for event in events:
            if event.type == "denied":
                got.put_nowait(event)

    reader = asyncio.create_task(pump())
    try:
        end = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < end, "no network.denied event"
            await sbx.exec(attempt)
            with contextlib.suppress(TimeoutError):
                while (event := await asyncio.wait_for(got.get(), 1.0)).destination != destination:
                    pass
                return event
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await events.aclose()  # type: ignore[attr-defined]


async def _cli_denied_line(
    nats: NatsServer, prefix: str, sbx: AsyncSandbox, attempt: str, destination: str
) -> str:
    """``sandpod network <sbx> --events``: the policy, then a line per event; the line that
    names ``destination`` once refused attempts are repeated."""
    cli = await asyncio.create_subprocess_exec(
        SANDPOD,
        "network",
        sbx.id,
        "--events",
        "--nats-url",
        nats.url,
        "--prefix",
        prefix,
        stdout=asyncio.subprocess.PIPE,
    )
    assert cli.stdout is not None
    try:
        while b"APPLIED:" not in await asyncio.wait_for(cli.stdout.readline(), DEADLINE):
            pass
        end = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < end, "sandpod network --events printed no refusal"
            await sbx.exec(attempt)
            with contextlib.suppress(TimeoutError):
                while destination not in (
                    line := (await asyncio.wait_for(cli.stdout.readline(), 1.0)).decode()
                ):
                    pass
                return line
    finally:
        cli.terminate()
        await cli.wait()


def _ours(tag: str) -> list[str]:
    """Links, tables and routes of installations whose links carry ``tag``."""
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    left = [i["ifname"] for i in links if i["ifname"].startswith(f"sp{tag}")]
    routes = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True)
    return left + [r for r in routes.stdout.splitlines() if f"sp{tag}" in r]


async def test_a_default_sandbox_reaches_the_internet_and_reports_its_address(
    nats: NatsServer, platform: tuple[ServiceProc, str], fakenet: FakeNet
) -> None:
    """The default template is ``public``: curl in a new sandbox gets the fake internet's
    page by address and nothing from the metadata server; a refused connection is a
    ``network.denied`` event naming its address, port and protocol;
    ``status.endpoint["address"]`` is the sandbox's own address, the one its ``eth0`` carries;
    a ``deny-all`` template's sandbox gets nothing; stopping the platform removes every link,
    route and the table."""
    proc, prefix = platform
    async with await AsyncSandbox.create(nats_url=nats.url, prefix=prefix, wait=DEADLINE) as sbx:
        r = await sbx.exec(CURL.format(fakenet.public))
        assert r.stdout.strip() == "fakenet public", r
        r = await sbx.exec(CURL.format(fakenet.metadata))
        assert r.stdout.strip() == "unreachable", r
        attempt = f"curl -s -m 1 http://{fakenet.private}/ || true"
        denied = await _denied_event(sbx, attempt, f"{fakenet.private}:80/tcp")
        assert (denied.kind, denied.name) == ("connect", sbx.id) and denied.count >= 1, denied
        line = await _cli_denied_line(nats, prefix, sbx, attempt, f"{fakenet.private}:80/tcp")
        assert " denied   connect " in line, line
        reply = await api_call(
            sbx.bus, sbx.subjects, "sandboxes", "get", Ref(name=sbx.id), ObjectReply
        )
        address = reply.object["status"]["endpoint"]["address"]
        isolated = (await sbx.info()).condition("Isolated")
        assert isolated is not None and "egress" in isolated["message"], isolated
        assert "egress:" not in isolated["message"], isolated  # listed as active, not degraded
        r = await sbx.exec("cat /proc/net/fib_trie; cat /etc/resolv.conf")
        assert f"|-- {address}\n" in r.stdout and "nameserver 10." in r.stdout, r.stdout
        obj = {
            "kind": "SandboxTemplate",
            "metadata": {"name": "closed"},
            "spec": {"network": {"mode": "deny-all"}},
        }
        await api_call(
            sbx.bus, sbx.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
        )
    async with await AsyncSandbox.create(
        template="closed", nats_url=nats.url, prefix=prefix, wait=DEADLINE
    ) as closed:
        r = await closed.exec(CURL.format(fakenet.public))
        assert r.stdout.strip() == "unreachable", r
    # this platform's table, by its installation id (other installations on the host, such as
    # another test's platform, come and go meanwhile: only ours is asserted on)
    installation = identity(prefix, Path(proc.env["SANDPOD_STATE_DIR"]))
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"sandpod_{installation}" in tables.split(), tables
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    tags = {
        i["ifname"][2:8]
        for i in links
        if i["ifname"].endswith("g") and i["ifname"].startswith("sp")
    }
    assert installation[:6] in tags
    proc.stop()
    after = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"sandpod_{installation}" not in after.split(), after  # it went with the platform
    assert _ours(installation[:6]) == []


async def test_a_crashed_lifecycles_network_is_adopted_or_cleaned_by_the_next(
    nats: NatsServer, platform: tuple[ServiceProc, str], fakenet: FakeNet
) -> None:
    """SIGKILL the lifecycle: its sandbox, link and table stay. The next lifecycle of the same
    installation adopts them (the sandbox still reaches the internet under its policy); a
    sandbox whose holder died meanwhile loses its link, and its chain and record go; stopping
    leaves nothing."""
    proc, prefix = platform
    keep = await AsyncSandbox.create(nats_url=nats.url, prefix=prefix, wait=DEADLINE)
    lost = await AsyncSandbox.create(nats_url=nats.url, prefix=prefix, wait=DEADLINE)
    state = Path(proc.env["SANDPOD_STATE_DIR"])
    holder = json.loads((state / "jails" / lost.id / "jail.json").read_text())["holder_pid"]
    proc.kill()
    os.kill(holder, 9)  # while no lifecycle runs: its veth goes with its namespace
    records = {p.stem for p in (state / "net").glob("*.json")}
    assert records == {keep.id, lost.id}
    proc.proc = proc._spawn()  # the same installation starts again
    end = time.monotonic() + DEADLINE
    while (state / "net" / f"{lost.id}.json").exists():
        assert time.monotonic() < end, proc.tail()
        await asyncio.sleep(0.05)
    async with keep:
        r = await keep.exec(CURL.format(fakenet.public))
        assert r.stdout.strip() == "fakenet public", r
        r = await keep.exec(CURL.format(fakenet.metadata))
        assert r.stdout.strip() == "unreachable", r
    await lost.close()
    installation = identity(prefix, state)
    assert Nft().json("list table inet sandpod_" + installation)  # adopted, not recreated empty
    proc.stop()
    assert not list((state / "net").glob("*.json"))
    assert _ours(installation[:6]) == []
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"sandpod_{installation}" not in tables


async def test_a_name_rule_opens_only_what_the_node_resolver_answered(
    nats: NatsServer, tmp_path: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """An allowlist naming ``api.example.test:80``: the sandbox's own resolv.conf reaches the
    node resolver (on its installation's gateway address), which answers from the fake
    internet's authoritative server and opens that address in the sandbox's timed set before
    replying: curl by name works; another name is refused at DNS; another address, and the
    allowed one on another port, are refused at connect."""
    auth = AuthServer()
    await auth.start()
    auth.add("api.example.test", "A", 60, fakenet.public)
    auth.add("other.example.test", "A", 60, fakenet.public2)
    host, port = auth.address
    proc, prefix = await _start_platform(
        nats, tmp_path, default_rootfs, SANDPOD_DNS_UPSTREAMS=f"{host}:{port}"
    )
    try:
        async with await AsyncSandbox.connect("x", nats_url=nats.url, prefix=prefix) as s:
            obj = {
                "kind": "SandboxTemplate",
                "metadata": {"name": "named"},
                "spec": {"network": {"mode": "allowlist", "allow": ["api.example.test:80"]}},
            }
            await api_call(
                s.bus, s.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
            )
        async with await AsyncSandbox.create(
            template="named", nats_url=nats.url, prefix=prefix, wait=DEADLINE
        ) as sbx:
            r = await sbx.exec(CURL.format("api.example.test"))
            assert r.stdout.strip() == "fakenet public", r
            r = await sbx.exec("getent hosts other.example.test || echo refused")
            assert r.stdout.strip() == "refused", r
            for target in (fakenet.public2, f"{fakenet.public}:8080"):
                r = await sbx.exec(CURL.format(target))
                assert r.stdout.strip() == "unreachable", (target, r)
            assert auth.asked_for("api.example.test") >= 1
            assert auth.asked_for("other.example.test") == 0  # refused before the internet
    finally:
        proc.stop()
        await auth.close()


async def test_a_secret_reaches_its_domain_as_a_header_and_never_enters_the_sandbox(
    nats: NatsServer, tmp_path: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """A template injecting secret ``tok`` as ``Authorization`` for ``api.example.test``: the
    sandbox's environment, files and requests hold only the placeholder; the server receives
    the secret, put in by the node's egress proxy (the firewall sends the name rule's
    addresses on port 80 there). A request to another allowed name gets no injection."""
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    auth = AuthServer()
    await auth.start()
    auth.add("api.example.test", "A", 60, fakenet.public)
    auth.add("plain.example.test", "A", 60, fakenet.public2)
    host, port = auth.address
    secrets = tmp_path / "secrets"  # the lifecycle's state dir is tmp_path
    FileSecretStore(secrets).put("tok", secret)
    proc, prefix = await _start_platform(
        nats, tmp_path, default_rootfs, SANDPOD_DNS_UPSTREAMS=f"{host}:{port}"
    )
    try:
        async with await AsyncSandbox.connect("x", nats_url=nats.url, prefix=prefix) as s:
            network = {
                "mode": "allowlist",
                "allow": ["api.example.test:80", "plain.example.test:80"],
                "inject": [{"domain": "api.example.test", "secret": "tok"}],
            }
            obj = {
                "kind": "SandboxTemplate",
                "metadata": {"name": "injecting"},
                "spec": {"network": network},
            }
            await api_call(
                s.bus, s.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
            )
        async with await AsyncSandbox.create(
            template="injecting", nats_url=nats.url, prefix=prefix, wait=DEADLINE
        ) as sbx:
            got = 'curl -s -m 5 -H "Authorization: Bearer $SANDPOD_SECRET_TOK" http://{}/headers'
            seen = (await sbx.exec(got.format("api.example.test"))).stdout
            assert f"Authorization: Bearer {secret}" in seen, seen
            assert "sandpod-placeholder-tok" not in seen
            plain = (await sbx.exec(got.format("plain.example.test"))).stdout
            assert "Authorization: Bearer sandpod-placeholder-tok" in plain, plain
            inside = await sbx.exec(
                f"env; cat /proc/self/environ; grep -rs {secret} /etc /tmp /workspace; true"
            )
            assert secret not in inside.stdout, "the secret's value entered the sandbox"
            assert "SANDPOD_SECRET_TOK=sandpod-placeholder-tok" in inside.stdout
            bundle = await sbx.exec("cat /etc/ssl/certs/sandpod-egress.pem")
            assert "BEGIN CERTIFICATE" in bundle.stdout  # the domain's authority, for HTTPS
    finally:
        proc.stop()
        await auth.close()


async def test_the_platforms_always_allowed_names_open_under_any_allowlist_but_not_past_deny(
    nats: NatsServer, tmp_path: Path, default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """``SANDPOD_NET_ALWAYS_ALLOW=mirror.example.test:80``: a sandbox whose allowlist names
    only ``api.example.test`` reaches the mirror too (and ``status.network`` shows the rule),
    not ``other.example.test`` (same server, not in the setting); a template that denies the
    mirror keeps it refused (at DNS and by address)."""
    auth = AuthServer()
    await auth.start()
    auth.add("api.example.test", "A", 60, fakenet.public)
    auth.add("mirror.example.test", "A", 60, fakenet.public2)
    auth.add("other.example.test", "A", 60, fakenet.public2)
    host, port = auth.address
    proc, prefix = await _start_platform(
        nats,
        tmp_path,
        default_rootfs,
        SANDPOD_DNS_UPSTREAMS=f"{host}:{port}",
        SANDPOD_NET_ALWAYS_ALLOW="mirror.example.test:80",
    )
    allowlist = {"mode": "allowlist", "allow": ["api.example.test:80"]}
    denying = {**allowlist, "deny": ["mirror.example.test"]}
    try:
        async with await AsyncSandbox.connect("x", nats_url=nats.url, prefix=prefix) as s:
            for name, network in (("listed", allowlist), ("denying", denying)):
                obj = {
                    "kind": "SandboxTemplate",
                    "metadata": {"name": name},
                    "spec": {"network": network},
                }
                await api_call(
                    s.bus, s.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
                )
        async with await AsyncSandbox.create(
            template="listed", nats_url=nats.url, prefix=prefix, wait=DEADLINE
        ) as sbx:
            r = await sbx.exec(CURL.format("mirror.example.test"))
            assert r.stdout.strip() == "fakenet public2", r
            r = await sbx.exec(CURL.format("api.example.test"))
            assert r.stdout.strip() == "fakenet public", r
            r = await sbx.exec("getent hosts other.example.test || echo refused")
            assert r.stdout.strip() == "refused", r
            reply = await api_call(
                sbx.bus, sbx.subjects, "sandboxes", "get", Ref(name=sbx.id), ObjectReply
            )
            shown = reply.object["status"]["network"]["policy"]["allow"]
            assert shown == ["api.example.test:80", "mirror.example.test:80"], shown
        async with await AsyncSandbox.create(
            template="denying", nats_url=nats.url, prefix=prefix, wait=DEADLINE
        ) as sbx:
            r = await sbx.exec("getent hosts mirror.example.test || echo refused")
            assert r.stdout.strip() == "refused", r
            r = await sbx.exec(CURL.format(fakenet.public2))
            assert r.stdout.strip() == "unreachable", r
        assert auth.asked_for("other.example.test") == 0
    finally:
        proc.stop()
        await auth.close()


def test_a_bad_always_allowed_entry_stops_lifecycle_at_start_naming_it(tmp_path: Path) -> None:
    """``SANDPOD_NET_ALWAYS_ALLOW=mirror.example.com,exa mple.com``: lifecycle exits 2 before it
    connects anywhere, its message naming the variable and the entry."""
    env = {
        **os.environ,
        "SANDPOD_STATE_DIR": str(tmp_path),
        "SANDPOD_NET_ALWAYS_ALLOW": "mirror.example.com,exa mple.com",
    }
    done = subprocess.run(
        [sys.executable, "-m", "sandpod_lifecycle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert "SANDPOD_NET_ALWAYS_ALLOW: entry 'exa mple.com' is not an allow rule" in done.stderr
