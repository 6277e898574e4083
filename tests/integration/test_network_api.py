"""A sandbox's egress policy read and changed at runtime, through a real lifecycle process.

Lifecycle runs the process runtime (which enforces no egress and must say so) with a resync
period of ten minutes, so every change seen here arrived through the reconciler's watches
(of the Sandbox, and of its template), not a periodic sweep. The SDK, the CLI and raw
control-plane requests (as another tenant) are the clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
from test_lifecycle import Lifecycle, _ready_api, lifecycles  # noqa: F401 - fixture

from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod.errors import ResourceConflict, ResourceInvalid, ResourceNotFound
from sandpod_bus import Bus, BusSettings, Inbound
from sandpod_contract.codec import decode
from sandpod_contract.messages.sandboxes import (
    NetworkEvent,
    NetworkState,
    NetworkUpdate,
    ObjectReply,
    ObjectRequest,
    Ref,
)
from sandpod_contract.subjects import Subjects

__all__: list[str] = []

DEADLINE = 30.0  # far above what a loaded machine takes: the tests wait on the event itself
QUIET = {"SANDPOD_RESYNC": "600"}  # no sweep: only the watches can apply a change


@pytest.fixture
async def lc(lifecycles: Callable[..., Lifecycle]) -> Lifecycle:  # noqa: F811
    life = lifecycles(**QUIET)
    await _ready_api(life)
    return life


async def _events(bus: Bus, subjects: Subjects, name: str) -> asyncio.Queue[NetworkEvent]:
    queue: asyncio.Queue[NetworkEvent] = asyncio.Queue(maxsize=100)

    async def on(msg: Inbound) -> None:
        queue.put_nowait(decode(NetworkEvent, msg.data))

    await bus.subscribe(subjects.events_of("network", name), on)
    return queue


async def test_sdk_update_is_applied_at_once_recorded_and_idempotent(lc: Lifecycle) -> None:
    """update() changes the effective policy, the runtime applies it through the watch (the
    reply waits for it), status and an event say what the runtime made of it; the same update
    again is no change (same generation); reset() brings back the template's."""
    async with await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix) as sbx:
        first = await sbx.network.get()
        assert (first.mode, first.source, first.applied) == ("public", "template", True)
        assert not first.enforced and "process runtime" in first.reason
        events = await _events(sbx.bus, sbx.subjects, sbx.id)
        view = await sbx.network.update(
            mode="allowlist", allow=["pypi.example.org:443", "10.1.0.0/16"], deny=["*.bad.test"]
        )
        assert view.applied and view.source == "sandbox"
        assert view.generation == first.generation + 1
        assert view.allow == ("pypi.example.org:443", "10.1.0.0/16")
        event = await asyncio.wait_for(events.get(), DEADLINE)
        assert (event.type, event.generation, event.enforced) == ("updated", view.generation, False)
        assert event.policy is not None and event.policy["mode"] == "allowlist"
        info = await sbx.describe()
        status = info.object["status"]["network"]
        assert status["policy"]["allow"] == ["pypi.example.org:443", "10.1.0.0/16"]
        assert status["observedGeneration"] == view.generation and status["source"] == "sandbox"
        again = await sbx.network.update(mode="allowlist")  # nothing changes
        assert again.generation == view.generation and again.applied
        only_deny = await sbx.network.update(deny=[])  # fields not given keep their value
        assert only_deny.allow == view.allow and only_deny.deny == ()
        back = await sbx.network.reset()
        assert (back.mode, back.source, back.applied) == ("public", "template", True)


async def test_a_bad_policy_is_a_typed_error_naming_the_field(lc: Lifecycle) -> None:
    """The service refuses a bad mode or rule with ResourceInvalid naming the field (sent raw,
    past the SDK's own check); the policy stays as it was. A bad create is refused the same."""
    async with await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix) as sbx:
        before = await sbx.network.get()
        for policy, field in (
            ({"mode": "open"}, "spec.network.mode"),
            ({"mode": "allowlist", "allow": ["ok.test", "no spaces!"]}, "spec.network.allow[1]"),
            ({"deny": ["10.0.0.0/8:99999"]}, "spec.network.deny[0]"),
            ({"limits": {"maxConnections": 0}}, "spec.network.limits.maxConnections"),
        ):
            req = NetworkUpdate(name=sbx.id, policy=policy)
            with pytest.raises(ResourceInvalid) as err:
                await api_call(sbx.bus, sbx.subjects, "sandboxes", "set_network", req, NetworkState)
            assert err.value.details["field"] == field, err.value
        with pytest.raises(ResourceInvalid) as sdk_err:  # the SDK checks before sending
            await sbx.network.update(allow=["*.*bad"])
        assert sdk_err.value.details["field"] == "spec.network.allow[0]"
        assert (await sbx.network.get()).generation == before.generation
        stale = NetworkUpdate(name=sbx.id, policy={"mode": "deny-all"}, generation=99)
        with pytest.raises(ResourceConflict):
            await api_call(sbx.bus, sbx.subjects, "sandboxes", "set_network", stale, NetworkState)
    with pytest.raises(ResourceInvalid) as create_err:
        await AsyncSandbox.create(
            network={"mode": "allowlist", "allow": [""]}, nats_url=lc.url, prefix=lc.prefix
        )
    assert create_err.value.details["field"] == "spec.network.allow[0]"


async def test_create_with_a_policy_runs_under_it(lc: Lifecycle) -> None:
    """Sandbox.create(network=...) starts the sandbox with its own policy already applied."""
    policy = {"mode": "deny-all"}
    async with await AsyncSandbox.create(network=policy, nats_url=lc.url, prefix=lc.prefix) as s:
        view = await s.network.get()
        assert (view.mode, view.source, view.applied, view.generation) == (
            "deny-all",
            "sandbox",
            True,
            1,
        )


async def test_another_tenant_can_neither_read_nor_change_the_policy(lc: Lifecycle) -> None:
    """Tenant beta naming acme's sandbox (by acme's name or by its platform id) gets not-found
    on read and on update, and acme's policy is untouched; acme itself can do both."""
    bus = await Bus.connect(BusSettings(url=lc.url, name="tenants"))
    try:
        acme, beta = Subjects(lc.prefix, tenant="acme"), Subjects(lc.prefix, tenant="beta")
        name = f"n{uuid.uuid4().hex[:6]}"
        obj = {"kind": "Sandbox", "metadata": {"name": name}, "spec": {}}
        created = await api_call(
            bus,
            acme,
            "sandboxes",
            "create",
            ObjectRequest(object=obj, wait_ready=30),
            ObjectReply,
            timeout=40,
        )
        sid = created.object["metadata"]["name"]  # the platform's id: acme--<name>
        mine = await api_call(bus, acme, "sandboxes", "network", Ref(name=name), NetworkState)
        assert mine.policy["mode"] == "public"
        for target in (name, sid):
            with pytest.raises(ResourceNotFound):
                await api_call(bus, beta, "sandboxes", "network", Ref(name=target), NetworkState)
            attack = NetworkUpdate(name=target, policy={"mode": "public", "allow": ["0.0.0.0/0"]})
            with pytest.raises(ResourceNotFound):
                await api_call(bus, beta, "sandboxes", "set_network", attack, NetworkState)
        after = await api_call(bus, acme, "sandboxes", "network", Ref(name=name), NetworkState)
        assert after.generation == mine.generation and after.policy == mine.policy
        own = NetworkUpdate(name=name, policy={"mode": "deny-all"}, wait=DEADLINE)
        done = await api_call(bus, acme, "sandboxes", "set_network", own, NetworkState, timeout=40)
        assert done.policy["mode"] == "deny-all" and done.applied_generation == done.generation
        await api_call(bus, acme, "sandboxes", "delete", Ref(name=name, wait=30), ObjectReply)
    finally:
        await bus.drain()


async def test_a_template_change_reaches_its_sandboxes_but_not_their_own_policies(
    lc: Lifecycle,
) -> None:
    """Re-applying a template with another network policy changes the effective (and applied)
    policy of its running sandboxes that follow it; one with its own policy keeps it."""
    async with await AsyncSandbox.connect("default", nats_url=lc.url, prefix=lc.prefix) as admin:
        template = f"net{uuid.uuid4().hex[:6]}"

        async def apply(network: dict[str, object]) -> None:
            obj = {"kind": "SandboxTemplate", "metadata": {"name": template}, "spec": {}}
            obj["spec"] = {"network": network}
            req = ObjectRequest(object=obj)
            await api_call(admin.bus, admin.subjects, "templates", "apply", req, ObjectReply)

        await apply({"mode": "allowlist", "allow": ["one.test:443"]})
        follows = await AsyncSandbox.create(template, nats_url=lc.url, prefix=lc.prefix)
        own = await AsyncSandbox.create(
            template, network={"mode": "public"}, nats_url=lc.url, prefix=lc.prefix
        )
        async with follows, own:
            assert (await follows.network.get()).allow == ("one.test:443",)
            events = await _events(admin.bus, admin.subjects, follows.id)
            await apply({"mode": "allowlist", "allow": ["two.test:443"]})
            event = await asyncio.wait_for(events.get(), DEADLINE)
            assert event.policy is not None and event.policy["allow"] == ["two.test:443"]
            view = await follows.network.get()
            assert view.allow == ("two.test:443",) and view.applied
            kept = await own.network.get()
            assert (kept.mode, kept.source, kept.applied) == ("public", "sandbox", True)


def _cli(lc: Lifecycle, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDPOD_NATS_URL": lc.url, "SANDPOD_PREFIX": lc.prefix}
    return subprocess.run(
        [sys.executable, "-m", "sandpod", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_the_cli_shows_and_changes_the_policy(lc: Lifecycle) -> None:
    """``sandpod network`` shows the policy, adds and removes rules, prints json, refuses a bad
    rule with the field and a hint (exit 125, nothing changed); ``sandpod ls`` shows the mode."""
    async with await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix) as sbx:
        shown = await asyncio.to_thread(_cli, lc, "network", sbx.id)
        assert shown.returncode == 0, shown.stderr
        assert "public (from the template)" in shown.stdout and "NOT enforced" in shown.stdout
        args = ("network", sbx.id, "--mode", "allowlist", "--allow", "a.test:443")
        changed = await asyncio.to_thread(_cli, lc, *args, "--allow", "10.0.0.0/8", "-o", "json")
        assert changed.returncode == 0, changed.stderr
        data = json.loads(changed.stdout)
        assert data["mode"] == "allowlist" and data["allow"] == ["a.test:443", "10.0.0.0/8"]
        assert data["applied"] is True and data["source"] == "sandbox"
        removed = await asyncio.to_thread(
            _cli, lc, "network", sbx.id, "--remove-allow", "a.test:443", "--deny", "x.test"
        )
        assert removed.returncode == 0, removed.stderr
        view = await sbx.network.get()
        assert (view.allow, view.deny) == (("10.0.0.0/8",), ("x.test",))
        bad = await asyncio.to_thread(_cli, lc, "network", sbx.id, "--allow", "bad rule!")
        assert bad.returncode == 125
        assert "spec.network.allow[1]" in bad.stderr and "hint:" in bad.stderr
        assert (await sbx.network.get()).generation == view.generation
        both = await asyncio.to_thread(_cli, lc, "network", sbx.id, "--reset", "--allow", "a.b")
        assert both.returncode == 125 and "--reset" in both.stderr and "hint:" in both.stderr
        reset = await asyncio.to_thread(_cli, lc, "network", sbx.id, "--reset", "-o", "yaml")
        assert reset.returncode == 0 and "source: template" in reset.stdout, reset.stderr
        missing = await asyncio.to_thread(_cli, lc, "network", "no-such-sandbox")
        assert missing.returncode == 125 and "sandpod ls" in missing.stderr
        listed = await asyncio.to_thread(_cli, lc, "ls")
        header, *rows = listed.stdout.splitlines()
        assert "NETWORK" in header.split()
        row = next(r.split() for r in rows if r.startswith(sbx.id))
        assert row[header.split().index("NETWORK")] == "public"  # after the reset


async def test_the_local_runtime_applies_updates_and_says_what_it_enforces(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811
) -> None:
    """On the local runtime (jails) an update reaches the driver through the watch while the
    sandbox runs and serves commands; the status says whether it is enforced, and why not."""
    if os.geteuid() != 0:
        pytest.skip("the local runtime needs root (run the suite as root, as CI does)")
    lc = lifecycles(SANDPOD_RUNTIME="local", **QUIET)
    await _ready_api(lc)
    async with await AsyncSandbox.create(nats_url=lc.url, prefix=lc.prefix) as sbx:
        first = await sbx.network.get()
        assert first.applied and (first.enforced or first.reason)
        view = await sbx.network.update(mode="deny-all")
        assert view.applied and view.mode == "deny-all" and (view.enforced or view.reason)
        assert (await sbx.exec("echo still-here")).stdout == "still-here\n"  # nothing restarted
        await sbx.kill()
