"""Kubernetes-mode settings and manifests: what the environment selects, what a Pod is made of.

No API server here (tests/k8s has the real one); these are the pure parts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandpod_contract.network import NetworkPolicy
from sandpod_kube import KubeSettings
from sandpod_kube.netpolicy import egress_policy
from sandpod_kube.podspec import PodSettings, SandboxPod, pod_manifest
from sandpod_lifecycle.settings import LifecycleSettings
from sandpod_pool.settings import PoolSettings


def test_the_kv_store_is_the_default_and_needs_no_kubernetes_settings() -> None:
    """Without SANDPOD_STORE both control-plane services use the KV store."""
    assert LifecycleSettings.from_env({}).kube is None
    assert PoolSettings.from_env({}).kube is None


def test_an_explicit_server_with_a_token_file_and_namespace_scope(tmp_path: Path) -> None:
    """SANDPOD_STORE=kube with SANDPOD_KUBE_SERVER: the token file and the namespace scope."""
    token = tmp_path / "token"
    token.write_text("abc.def\n")
    env = {
        "SANDPOD_STORE": "kube",
        "SANDPOD_KUBE_SERVER": "https://10.0.0.1:6443",
        "SANDPOD_KUBE_CA_FILE": "/ca.crt",
        "SANDPOD_KUBE_TOKEN_FILE": str(token),
        "SANDPOD_KUBE_NAMESPACE": "sandboxes",
    }
    for settings in (LifecycleSettings.from_env(env), PoolSettings.from_env(env)):
        expected = KubeSettings(
            host="https://10.0.0.1:6443",
            ca_file="/ca.crt",
            token_file=str(token),
            namespace="sandboxes",
        )
        assert settings.kube == expected


def test_a_rotated_token_file_is_sent_from_the_next_request_on(tmp_path: Path) -> None:
    """Projected ServiceAccount tokens rotate: the client re-reads the file when it changes."""
    token = tmp_path / "token"
    token.write_text("first\n")
    settings = KubeSettings(host="https://10.0.0.1:6443", token_file=str(token))
    with settings.api_client() as api_client:
        cfg = api_client.configuration
        assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer first"
        token.write_text("second\n")
        os.utime(token, ns=(1, 10**18))  # a different mtime, whatever the clock's resolution
        assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer second"


def test_a_kubeconfig_is_read_when_no_server_is_given(tmp_path: Path) -> None:
    """SANDPOD_KUBECONFIG names the kubeconfig whose current context is used."""
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://k.example:6443'}}]\n"
        "users: [{name: u, user: {token: t0k}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    settings = KubeSettings.from_env({"SANDPOD_KUBECONFIG": str(config)})
    assert (settings.host, settings.token) == ("https://k.example:6443", "t0k")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SANDPOD_STORE": "etcd"}, "SANDPOD_STORE"),
        ({"SANDPOD_RUNTIME": "kubernetes"}, "needs SANDPOD_STORE=kube"),
        (
            {
                "SANDPOD_STORE": "kube",
                "SANDPOD_KUBE_SERVER": "https://x",
                "SANDPOD_KUBE_TOKEN_FILE": "/nonexistent/token",
            },
            "SANDPOD_KUBE_TOKEN_FILE",
        ),
        ({"SANDPOD_POD_NATS_CIDRS": "10.0.0.0/8,nats"}, "SANDPOD_POD_NATS_CIDRS"),
        ({"SANDPOD_POD_RUN_AS_USER": "-1"}, "SANDPOD_POD_RUN_AS_USER"),
        ({"SANDPOD_POD_NATS_POD_LABELS": "nats"}, "SANDPOD_POD_NATS_POD_LABELS"),
    ],
)
def test_bad_kubernetes_settings_fail_start_up_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    """A malformed store, runtime or Pod setting is refused with the variable's name."""
    with pytest.raises(ValueError, match=message):
        LifecycleSettings.from_env(env)


def test_a_pod_without_a_template_image_or_limits_still_is_hardened() -> None:
    """The default image is used, no resources are set, and the securityContext is the same."""
    pod = SandboxPod(
        name="s1", namespace="ns", owner_uid="u1", template="default", installation="sandpod"
    )
    manifest = pod_manifest(pod, PodSettings(default_image="busybox:1", run_as_user=4242))
    spec = manifest["spec"]
    assert "runtimeClassName" not in spec
    main = spec["containers"][0]
    assert main["image"] == "busybox:1" and main["resources"] == {}
    assert main["securityContext"]["runAsUser"] == 4242
    assert spec["securityContext"]["fsGroup"] == 4242
    assert manifest["metadata"]["labels"]["sandpod.dev/installation"] == "sandpod"


def test_a_template_without_egress_gets_only_nats_and_never_a_destinationless_rule() -> None:
    """No egress: the policy allows NATS at its named pods/CIDRs only, no DNS, no ingress; with
    no NATS destination configured there is no NATS rule at all (never "port 4222 anywhere")."""
    settings = PodSettings.from_env(
        {
            "SANDPOD_POD_NATS_NAMESPACE": "nats",
            "SANDPOD_POD_NATS_POD_LABELS": "app=nats,tier=bus",
            "SANDPOD_POD_NATS_CIDRS": "10.96.0.0/12",
            "SANDPOD_POD_NATS_PORT": "4223",
        }
    )
    deny_all = NetworkPolicy.from_dict({"mode": "deny-all"})
    policy, unenforceable = egress_policy("ns", "t", deny_all, settings)
    assert unenforceable == [] and policy["spec"]["ingress"] == []
    assert policy["spec"]["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nats"}},
                    "podSelector": {"matchLabels": {"app": "nats", "tier": "bus"}},
                },
                {"ipBlock": {"cidr": "10.96.0.0/12"}},
            ],
            "ports": [{"protocol": "TCP", "port": 4223}],
        }
    ]
    unpinned, _ = egress_policy("ns", "t", NetworkPolicy(), PodSettings())
    egress = unpinned["spec"]["egress"]
    assert not any(p["port"] == 4222 for rule in egress for p in rule.get("ports", []))
    public = next(r for r in egress if "to" in r)
    assert [b["ipBlock"]["cidr"] for b in public["to"]] == ["0.0.0.0/0", "::/0"]
