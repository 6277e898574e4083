"""The per-template NetworkPolicy the product writes, enforced on the real node (issue 17 item 3).

Lifecycle renders one NetworkPolicy per template (``sandpod_kube.netpolicy``): no ingress, egress
to NATS and to what the template's allowlist names. The node's bridge CNI ignores it; here
kube-network-policies decides every new connection of the node's Pods against it (started for
this test only, ``k8s/nodepolicy.py``, since the other node tests' templates do not pin NATS and
would lose it). Every probe runs inside a real sandbox container, first without the agent (all
reach: the positive control), then with it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from kubernetes import client

from conftest import NatsServer
from k8s.cluster import NS, Cluster
from k8s.nodepolicy import PolicyAgent, missing_agent
from k8s.realnode import RealNode
from node.conftest import pod_env
from node.internet import PROBE, NodeInternet, pod_ip
from sandpod import AsyncSandbox
from sandpod_kube.podspec import TEMPLATE_LABEL
from sandpod_store import ObjectMeta, Resource

pytestmark = pytest.mark.timeout(500)


async def _probe(sbx: AsyncSandbox, host: str, port: int) -> str:
    return (await sbx.exec(f"{PROBE}{host} {port}", timeout=30)).stdout.strip()


def _policies(node: RealNode, template: str) -> list[dict[str, Any]]:
    """The NetworkPolicies whose selector is the template's Pods."""
    with node.settings.api_client() as api:
        listed = client.NetworkingV1Api(api).list_namespaced_network_policy(NS)
        items: list[dict[str, Any]] = api.sanitize_for_serialization(listed)["items"]
    return [
        p
        for p in items
        if p["spec"]["podSelector"].get("matchLabels", {}).get(TEMPLATE_LABEL) == template
    ]


async def test_the_templates_network_policy_is_enforced_inside_real_pods(
    node_cluster: Cluster, real_node: RealNode, node_nats: NatsServer, internet: NodeInternet
) -> None:
    """Template allowlist ``<public>:80``: with the agent, a sandbox still reaches that address
    and port (and NATS: exec works), but not the same address on another port, another
    address, or another sandbox Pod's listener; without it, all of them connect."""
    if problem := missing_agent():
        pytest.fail(problem)
    assert real_node.net is not None
    template = f"np-{uuid.uuid4().hex[:6]}"
    await node_cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name=template, namespace=NS),
            spec={"network": {"mode": "allowlist", "allow": [f"{internet.public}:80"]}},
        )
    )
    node_cluster.service(
        "sandpod_lifecycle",
        **pod_env(),
        SANDPOD_POD_NATS_PORT=str(node_nats.port),  # the policy's NATS rule: where NATS is
        SANDPOD_POD_NATS_CIDRS=f"{real_node.net.host_ip}/32",
    )
    await node_cluster.answering()
    sbx, peer = await asyncio.gather(*(node_cluster.create(template) for _ in range(2)))
    agent = PolicyAgent(real_node)
    try:
        (policy,) = await asyncio.to_thread(_policies, real_node, template)
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"], policy
        listener = await peer.proc.start("python3 -m http.server 8000", proc_id="listener")
        await listener.wait_for_port(8000, timeout=30)
        other_pod = await asyncio.to_thread(pod_ip, node_cluster, peer.id)
        forbidden = {
            "another port": (internet.public, 8080),
            "another address": (internet.public2, 80),
            "another sandbox Pod": (other_pod, 8000),
        }
        for what, (host, port) in forbidden.items():  # the bridge alone enforces nothing
            assert await _probe(sbx, host, port) == "reached", what
        await asyncio.to_thread(agent.start)
        assert await _probe(sbx, internet.public, 80) == "reached", agent.tail()
        for what, (host, port) in forbidden.items():
            assert (await _probe(sbx, host, port)).startswith("refused:"), (what, agent.tail())
        assert 'verdict="drop"' in agent.tail(100_000), "the refusals are the agent's verdicts"
        assert (await sbx.exec("echo still here")).stdout == "still here\n"
    finally:
        await asyncio.to_thread(agent.stop)
        for box in (sbx, peer):
            await box.kill()
            await box.close()
