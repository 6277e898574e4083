"""Egress policies as NetworkPolicies on a real API server: the rendered manifests of every mode
are accepted (the API server validates ``ipBlock.except`` inside ``cidr``, port ranges...) and
read back as rendered; the Pod runtime's ``apply_network`` re-renders a template's policy."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from k8s.envtest import ControlPlane
from k8s.kubelet import FakeKubelet
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_kube import PodApi
from sandpod_kube.netpolicy import egress_policy, policy_name
from sandpod_kube.podspec import PodSettings
from sandpod_lifecycle.driver import Owner
from sandpod_lifecycle.runtime.pod import OWN_POLICY, PodDriver

SETTINGS = PodSettings(nats_namespace="nats-system", nats_cidrs=("10.96.0.10/32",))
POLICIES: dict[str, dict[str, Any]] = {
    "public": {
        "mode": "public",
        "allow": ["10.20.0.0/16:5432", "169.254.0.0/16"],
        "deny": ["11.0.0.0/8", "10.20.5.0/24", "2001:4860::/32"],
    },
    "allowlist": {
        "mode": "allowlist",
        "allow": ["1.2.3.4:8000-8100", "[2001:db8::1]:443", "api.test:443"],
    },
    "deny-all": {"mode": "deny-all"},
}


def _service_account(plane: ControlPlane, namespace: str) -> None:
    with plane.settings.api_client() as api_client:
        client.CoreV1Api(api_client).create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
        )


@pytest.fixture
async def pods(kube_apiserver: ControlPlane, namespace: str) -> AsyncIterator[PodApi]:
    await asyncio.to_thread(_service_account, kube_apiserver, namespace)
    api = PodApi(kube_apiserver.settings)
    yield api
    await api.close()


async def _read(plane: ControlPlane, namespace: str, template: str) -> dict[str, Any]:
    with plane.settings.api_client() as api_client:
        api = client.NetworkingV1Api(api_client)
        policy = await asyncio.to_thread(
            api.read_namespaced_network_policy, policy_name(template), namespace
        )
        return api_client.sanitize_for_serialization(policy)  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", sorted(POLICIES))
async def test_each_mode_renders_a_policy_the_api_server_accepts_as_rendered(
    kube_apiserver: ControlPlane, namespace: str, pods: PodApi, mode: str
) -> None:
    """The API server stores the rendered spec unchanged (its validation refuses an except
    outside its cidr, an endPort below port, a v6 except in a v4 block...)."""
    manifest, _ = egress_policy(
        namespace, f"t-{mode}", NetworkPolicy.from_dict(POLICIES[mode]), SETTINGS
    )
    await pods.apply_network_policy(manifest)
    stored = await _read(kube_apiserver, namespace, f"t-{mode}")
    assert stored["spec"]["egress"] == manifest["spec"]["egress"]
    assert stored["spec"]["podSelector"] == {"matchLabels": {"sandpod.dev/template": f"t-{mode}"}}
    assert stored["spec"]["policyTypes"] == ["Ingress", "Egress"]


async def test_apply_network_re_renders_the_templates_policy(
    kube_apiserver: ControlPlane, namespace: str, pods: PodApi, tmp_path: Path
) -> None:
    """A template's new policy reaches its NetworkPolicy through apply_network (enforced when
    it is all CIDRs); a sandbox's own policy is reported not enforced and never rendered into
    the template's (that would widen its neighbours' egress)."""
    templates = {"web": SandboxTemplateSpec(network=NetworkPolicy.from_dict({"mode": "deny-all"}))}

    async def read(ns: str, name: str | None) -> SandboxTemplateSpec:
        return templates[name or "default"]

    driver = PodDriver(
        pods,
        SETTINGS,
        installation=f"i{uuid.uuid4().hex[:6]}",
        ready_timeout=30,
        namespace=namespace,
        templates=read,
    )
    kubelet = FakeKubelet(kube_apiserver.settings, namespace, tmp_path)
    kubelet.run_execd = False
    async with kubelet:
        spec = SandboxSpec(template_ref="web")
        await driver.ensure("s1", spec, templates["web"], Owner(namespace, "uid-1"))
        first = await _read(kube_apiserver, namespace, "web")
        assert len(first["spec"]["egress"]) == 1  # deny-all: NATS only
        cidrs = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["10.1.0.0/16:443"]})
        templates["web"] = SandboxTemplateSpec(network=cidrs)
        result = await driver.apply_network("s1", cidrs)
        assert result.enforced and result.reason == ""
        second = await _read(kube_apiserver, namespace, "web")
        assert second["spec"]["egress"][-1] == {
            "to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        }
        own = NetworkPolicy.from_dict({"mode": "public"})
        result = await driver.apply_network("s1", own)
        assert not result.enforced and result.reason.startswith(OWN_POLICY)
        assert (await _read(kube_apiserver, namespace, "web"))["spec"] == second["spec"]
        await driver.destroy("s1")
        await kubelet.until("s1 deleted", lambda: "s1" not in kubelet.seen)
