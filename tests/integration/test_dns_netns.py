"""The node resolver as a sandbox meets it: glibc's own stub resolver, in a network namespace,
over a veth pair, asking the resolver on the host end.

Each test makes its own namespace (unique name), a veth pair with a random /30 from the
benchmarking range 198.18.0.0/15, and ``/etc/netns/<name>/resolv.conf`` (``ip netns exec``
mounts it over /etc/resolv.conf), so ``getent`` inside resolves through the resolver exactly
as a sandbox's programs will. Everything is removed at the end and checked gone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator

import pytest
from dns_harness import FakeSink, policy
from prometheus_client import CollectorRegistry

from dnsauth import AuthServer
from netns_pair import NetnsPair
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.resolver import NodeResolver, ResolverSettings
from sandpod_lifecycle.network.sandboxnet import SandboxNet

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("getent") is None,
    reason="needs root, iproute2 and getent (run the suite as root, as CI does)",
)


class Netns(NetnsPair):
    """A client namespace whose resolver is the node resolver on the host end."""

    def __init__(self) -> None:
        super().__init__("dns")

    async def getent(self, *args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            "ip",
            "netns",
            "exec",
            self.name,
            "getent",
            *args,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode is not None
        return proc.returncode, out.decode()


@pytest.fixture
async def world() -> AsyncIterator[tuple[Netns, AuthServer, dict[str, SandboxNet], FakeSink]]:
    ns = Netns()
    auth = AuthServer()
    auth.add("open.test", "A", 300, "11.22.0.1")
    auth.add("evil.test", "A", 300, "11.22.0.66")
    auth.add("rebind.test", "A", 300, "127.0.0.1")
    sandboxes: dict[str, SandboxNet] = {}
    sink = FakeSink()
    try:
        ns.create()
        await auth.start()
        resolver = NodeResolver(
            ResolverSettings(upstreams=(auth.address,)),
            [(ns.gateway, 53)],
            lookup=sandboxes.get,
            sink=sink,
            metrics=NetworkMetrics(CollectorRegistry()),
        )
        await resolver.start()
        try:
            yield ns, auth, sandboxes, sink
        finally:
            await resolver.close()
    finally:
        await auth.close()
        ns.remove()


async def test_glibc_in_a_namespace_resolves_under_the_policy(
    world: tuple[Netns, AuthServer, dict[str, SandboxNet], FakeSink],
) -> None:
    """getent inside the namespace: the allowed name resolves (and reached the sink first),
    a denied one fails without reaching the upstream, a rebinding answer fails."""
    ns, auth, sandboxes, sink = world
    sandboxes[ns.address] = SandboxNet("sbx-ns", policy("allowlist", ["open.test", "rebind.test"]))
    code, out = await ns.getent("ahostsv4", "open.test")
    assert code == 0 and "11.22.0.1" in out
    assert [(c[0], c[2]) for c in sink.calls] == [("sbx-ns", [("11.22.0.1", 300)])]
    code, out = await ns.getent("ahostsv4", "evil.test")
    assert code == 2 and out == ""
    assert auth.asked_for("evil.test") == 0
    code, _ = await ns.getent("ahostsv4", "rebind.test")
    assert code == 2


async def test_policy_update_reaches_glibc_at_once(
    world: tuple[Netns, AuthServer, dict[str, SandboxNet], FakeSink],
) -> None:
    """An update that denies, then allows again, is what the very next lookup sees (a
    refusal is not negatively cached by the stub)."""
    ns, _, sandboxes, _ = world
    sandboxes[ns.address] = SandboxNet("sbx-ns", policy("public"))
    assert (await ns.getent("ahostsv4", "open.test"))[0] == 0
    sandboxes[ns.address] = SandboxNet("sbx-ns", policy("deny-all"))
    assert (await ns.getent("ahostsv4", "open.test"))[0] == 2
    sandboxes[ns.address] = SandboxNet("sbx-ns", policy("public"))
    assert (await ns.getent("ahostsv4", "open.test"))[0] == 0


async def test_a_stranger_address_is_refused(
    world: tuple[Netns, AuthServer, dict[str, SandboxNet], FakeSink],
) -> None:
    """The namespace's address is no sandbox: nothing resolves, nothing reaches upstream."""
    ns, auth, _, _ = world
    assert (await ns.getent("ahostsv4", "open.test"))[0] == 2
    assert auth.asked == []
