"""The Helm chart (deploy/helm/sandpod) rendered by a real helm and judged by the real API server.

Every object `helm template` renders, for several values combinations, must pass the API server's
own validation (dry-run create with strict field validation; CRDs by dry-run server-side apply).
The RBAC half is in test_helm_rbac.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s.chart import CHART, Rest, helm, missing_helm, render, unique, without_dependencies
from k8s.envtest import KUBE_VERSION, REPO, ControlPlane
from sandpod_kube import ensure_namespace

SCHEMA_CRDS = REPO / "schemas" / "crds"


@pytest.fixture(scope="module")
def helm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work dir for rendered copies of the chart; fails (never skips) without helm."""
    if problem := missing_helm():
        pytest.fail(problem)
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def admin(kube_apiserver: ControlPlane) -> Iterator[Rest]:
    """REST calls with the admin credential."""
    rest = Rest(kube_apiserver)
    yield rest
    rest.close()


def combos(ns: str) -> dict[str, dict[str, Any]]:
    """Values combinations covering every switch of the chart."""
    return {
        "defaults": {},
        "external-nats-namespaced": {
            "nats": {"enabled": False},
            "natsUrl": "nats://nats.example.com:4222",
            "rbac": {"clusterWide": False},
            "gateway": {"hpa": {"enabled": False}, "pdb": {"enabled": False}},
            "lifecycle": {"replicas": 1, "pdb": {"enabled": False}},
            "networkPolicy": {
                "natsCIDRs": ["10.20.0.0/16"],
                "natsNamespace": "messaging",
                "allowDNS": False,
            },
            "topologySpread": {"enabled": False},
            "serviceAccount": {"create": False},
        },
        "everything-on": {
            "gateway": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
            "sandboxes": {"namespaces": [f"{ns}-a", f"{ns}-b"]},
            "imagePullSecrets": [{"name": "regcred"}],
            "extraEnv": [{"name": "SANDPOD_GRACE", "value": "20"}],
            "pool": {"env": [{"name": "SANDPOD_POOL_RESYNC", "value": "5"}]},
            "podAnnotations": {"example.com/scrape": "false"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "sandpod", "operator": "Exists", "effect": "NoSchedule"}],
            "serviceAccount": {"annotations": {"example.com/role": "sandpod"}},
        },
        "nats-operator-mode": {"natsAuth": {"secret": "sandpod-nats-auth"}},
    }


def dry_run(admin: Rest, docs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Send each doc to the API server with dryRun=All: (refusals and warnings, unserved kinds).

    CRDs go first by server-side apply (they are installed already); the rest by create.
    """
    problems, unserved = [], []
    for doc in (d for d in docs if d["kind"] == "CustomResourceDefinition"):
        reply = admin.apply(doc, dry_run=True)
        if reply.status_code != 200:
            problems.append(f"CRD {doc['metadata']['name']}: {reply.status_code} {reply.text}")
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            continue
        if admin.resource(doc["apiVersion"], doc["kind"]) is None:
            unserved.append(doc["kind"])
            continue
        reply = admin.create(doc, dry_run=True)
        ok = reply.status_code == 201
        if reply.status_code == 409:  # it exists (default/sandpod-nats of a Kubernetes-mode test
            # in the same session): validated as the update an install would apply
            reply = admin.apply(doc, dry_run=True)
            ok = reply.status_code == 200
        if not ok:
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {reply.text}")
        elif reply.headers.get("Warning"):
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {reply.headers['Warning']}")
    return problems, unserved


def test_chart_crds_are_exactly_schemas_crds() -> None:
    """deploy/helm/sandpod/crds/ holds byte-identical copies of schemas/crds/*.yaml, no more."""
    chart_files = {p.name: p.read_bytes() for p in (CHART / "crds").iterdir()}
    schema_files = {p.name: p.read_bytes() for p in SCHEMA_CRDS.glob("*.yaml")}
    assert chart_files == schema_files, (
        "the chart's CRDs drifted from schemas/crds: run `cp schemas/crds/*.yaml "
        "deploy/helm/sandpod/crds/`"
    )


def test_rendered_crds_equal_schemas_crds(helm_dir: Path) -> None:
    """helm template --include-crds emits exactly the CRD objects of schemas/crds/."""
    docs = render(helm_dir, {}, release="crds", namespace="sandpod")
    rendered = sorted(
        (d for d in docs if d["kind"] == "CustomResourceDefinition"),
        key=lambda d: d["metadata"]["name"],
    )
    expected = [
        doc
        for path in sorted(SCHEMA_CRDS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    assert rendered == sorted(expected, key=lambda d: d["metadata"]["name"])


def test_chart_declares_the_nats_dependency_with_jetstream() -> None:
    """Chart.yaml depends on the official nats chart (conditional); values turn JetStream on."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (dep,) = meta["dependencies"]
    assert dep["name"] == "nats"
    assert dep["repository"] == "https://nats-io.github.io/k8s/helm/charts/"
    assert dep["condition"] == "nats.enabled"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["nats"]["enabled"] is True
    assert values["nats"]["config"]["jetstream"]["enabled"] is True


def test_helm_lint_strict_finds_nothing_but_the_unfetched_dependency(helm_dir: Path) -> None:
    """helm lint --strict: clean without the dependency list; the real chart only misses nats."""
    version = ("--kube-version", KUBE_VERSION)
    stripped = helm("lint", "--strict", str(without_dependencies(helm_dir)), *version)
    assert stripped.returncode == 0, stripped.stdout + stripped.stderr
    real = helm("lint", "--strict", str(CHART), *version)
    warnings = [line for line in real.stdout.splitlines() if line.startswith("[WARNING]")]
    assert warnings == [f"[WARNING] {CHART}: chart directory is missing these dependencies: nats"]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"gatway": {"port": 8080}}, "gatway"),  # a misspelt key is not silently ignored
        ({"gateway": {"port": "http"}}, "port"),
        ({"natsUrl": "http://nats:4222"}, "natsUrl"),
        ({"rbac": {"clusterWide": "yes"}}, "clusterWide"),
    ],
)
def test_values_schema_refuses_bad_values(
    helm_dir: Path, values: dict[str, Any], complaint: str
) -> None:
    """values.schema.json makes helm refuse unknown keys and mistyped values before rendering."""
    with pytest.raises(subprocess.CalledProcessError) as info:
        render(helm_dir, values, release="bad", namespace="sandpod")
    assert "values don't meet the specifications of the schema" in info.value.stderr
    assert complaint in info.value.stderr


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"nats": {"enabled": False}}, "natsUrl is required"),
        # an egress rule with no destination would let sandboxes reach anything on that port
        ({"nats": {"enabled": False}, "natsUrl": "nats://n:4222"}, "set networkPolicy.nats"),
    ],
)
def test_external_nats_needs_a_url_and_a_policy_destination(
    helm_dir: Path, values: dict[str, Any], complaint: str
) -> None:
    """nats.enabled=false without natsUrl or a NATS egress destination fails the render."""
    with pytest.raises(subprocess.CalledProcessError) as info:
        render(helm_dir, values, release="nourl", namespace="sandpod")
    assert complaint in info.value.stderr


def test_kube_mode_needs_leader_election(helm_dir: Path) -> None:
    """store=kube without the leader-election Leases fails the render (nobody would ever lead);
    store=kv renders without the Lease Roles."""
    with pytest.raises(subprocess.CalledProcessError) as info:
        render(
            helm_dir, {"leaderElection": {"enabled": False}}, release="nolease", namespace="sandpod"
        )
    assert "leaderElection.enabled=false with store=kube" in info.value.stderr
    docs = render(
        helm_dir,
        {"leaderElection": {"enabled": False}, "store": "kv"},
        release="kvmode",
        namespace="sandpod",
    )
    assert not [d for d in docs if d["kind"] == "Role" and "leases" in d["metadata"]["name"]]


@pytest.mark.parametrize(
    "combo", ["defaults", "external-nats-namespaced", "everything-on", "nats-operator-mode"]
)
def test_every_rendered_object_passes_the_api_servers_dry_run(
    helm_dir: Path, admin: Rest, kube_apiserver: ControlPlane, combo: str
) -> None:
    """Each object of the render is accepted by the real API server (dryRun=All, strict fields)."""
    ns = unique("helm")
    values = combos(ns)[combo]
    docs = render(helm_dir, values, release=unique("r"), namespace=ns)
    for name in [ns, *values.get("sandboxes", {}).get("namespaces", [])]:
        ensure_namespace(kube_apiserver.settings, name)
    assert len([d for d in docs if d["kind"] == "CustomResourceDefinition"]) == 6
    problems, unserved = dry_run(admin, docs)
    assert problems == []
    # The Prometheus Operator's CRDs are not part of this cluster: only the ServiceMonitor is
    # left to the schema of whoever installs that operator.
    assert unserved == (["ServiceMonitor"] if combo == "everything-on" else [])
    egress = [r for d in docs if d["kind"] == "NetworkPolicy" for r in d["spec"].get("egress", [])]
    assert egress and all(rule.get("to") for rule in egress)  # an empty `to` allows everywhere
    kinds = {d["kind"] for d in docs}
    assert {
        "Deployment",
        "NetworkPolicy",
        "ClusterRole" if combo != "external-nats-namespaced" else "Role",
    } <= kinds


def test_dry_run_refuses_what_the_api_server_would(
    helm_dir: Path, admin: Rest, kube_apiserver: ControlPlane
) -> None:
    """The validation has teeth: a misspelt field and a bad quantity in values are refused."""
    ns = unique("helm")
    ensure_namespace(kube_apiserver.settings, ns)
    values = {
        "extraEnv": [{"name": "SANDPOD_GRACE", "valu": "20"}],
        "gateway": {"resources": {"requests": {"cpu": "lots"}}},
    }
    problems, _ = dry_run(admin, render(helm_dir, values, release=unique("r"), namespace=ns))
    assert any('unknown field \\"spec.template.spec.containers[0].env[' in p for p in problems), (
        problems
    )
    assert any("quantities must match" in p for p in problems), problems


def test_workloads_are_hardened(helm_dir: Path) -> None:
    """Every container: non-root, read-only root, no escalation, ALL caps dropped, resources set."""
    docs = render(helm_dir, {}, release="hard", namespace="sandpod")
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert sorted(d["metadata"]["name"] for d in deployments) == [
        "hard-sandpod-gateway",
        "hard-sandpod-lifecycle",
        "hard-sandpod-pool",
    ]
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} == {
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
        }
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"] and container["resources"]["limits"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["SANDPOD_NATS_URL"] == "nats://hard-nats.sandpod.svc:4222"
            if container["name"] != "gateway":
                assert (env["SANDPOD_STORE"], env["SANDPOD_RUNTIME"]) == ("kube", "kubernetes")
    gateway = next(d for d in deployments if d["metadata"]["name"].endswith("gateway"))
    pod = gateway["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # it never calls the API server
    probes = pod["containers"][0]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_nats_operator_mode_gives_each_service_only_its_own_keys(helm_dir: Path) -> None:
    """natsAuth.secret: each service mounts only its own creds (0400, read-only) and points
    SANDPOD_NATS_CREDS at it; only lifecycle gets the account seed; without it, none do."""
    values = {"natsAuth": {"secret": "sandpod-nats-auth"}}
    docs = render(helm_dir, values, release="auth", namespace="sandpod")
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        component = dep["metadata"]["name"].removeprefix("auth-sandpod-")
        pod = dep["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "nats-auth")["secret"]
        items = {i["key"]: i["path"] for i in volume["items"]}
        seed = {"account.seed": "account.seed"} if component == "lifecycle" else {}
        assert items == {f"{component}.creds": "nats.creds", **seed}
        assert volume["secretName"] == "sandpod-nats-auth" and volume["defaultMode"] == 0o400
        container = pod["containers"][0]
        assert {"name": "nats-auth", "mountPath": "/etc/sandpod/nats", "readOnly": True} in (
            container["volumeMounts"]
        )
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SANDPOD_NATS_CREDS"] == "/etc/sandpod/nats/nats.creds"
        assert env.get("SANDPOD_NATS_ACCOUNT_SEED_FILE") == (
            "/etc/sandpod/nats/account.seed" if component == "lifecycle" else None
        )
    plain = render(helm_dir, {}, release="plain", namespace="sandpod")
    for dep in (d for d in plain if d["kind"] == "Deployment"):
        names = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert not names & {"SANDPOD_NATS_CREDS", "SANDPOD_NATS_ACCOUNT_SEED_FILE"}
