"""The pure parts of Kubernetes-mode builds: the builder Pod's manifest, its settings, the
request/outcome documents and the build registry setting (the end to end proof is
tests/k8s/test_template_build_pods.py, on a real API server and registry)."""

from __future__ import annotations

import base64
import json

import pytest

from sandpod_contract.errors import BuildFailed, ImageAuthFailed
from sandpod_kube.buildpod import (
    BUILD_LABEL,
    BuildPod,
    BuildPodSettings,
    build_creds_secret_manifest,
    build_pod_manifest,
    build_pod_name,
)
from sandpod_kube.pods import PodState
from sandpod_kube.podspec import CREDS_KEY, CREDS_MOUNT, INSTALLATION_LABEL, SANDBOX_LABEL
from sandpod_lifecycle.builds.kube import _outcome, validate_registry
from sandpod_lifecycle.builds.podwire import MESSAGE_LIMIT, BuildOutcome, BuildRequest, image_tag
from sandpod_lifecycle.settings import LifecycleSettings

KEY = "ab" * 32


def _pod(**kw: object) -> BuildPod:
    base: dict[str, object] = {
        "template": "data",
        "namespace": "team-a",
        "owner_uid": "uid-1",
        "key": KEY,
        "installation": "sandpod",
        "request": {"template": "data"},
    }
    return BuildPod(**{**base, **kw})  # type: ignore[arg-type]


def test_the_builder_pod_is_owned_by_its_template_and_never_looks_like_a_sandbox() -> None:
    """Owned by the SandboxTemplate, labelled as a build of it and of this installation, and
    without the sandbox label (the sandbox runtime's orphan sweep lists Pods by that)."""
    m = build_pod_manifest(_pod(), BuildPodSettings())
    meta = m["metadata"]
    assert meta["name"] == build_pod_name("data", KEY) == f"data-build-{KEY[:12]}"
    assert meta["namespace"] == "team-a"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "sandpod.dev/v1alpha1",
            "kind": "SandboxTemplate",
            "name": "data",
            "uid": "uid-1",
            "controller": True,
        }
    ]
    assert meta["labels"][BUILD_LABEL] == "data" and meta["labels"][INSTALLATION_LABEL] == "sandpod"
    assert SANDBOX_LABEL not in meta["labels"]


def test_the_builder_pod_has_only_the_privileges_an_overlay_build_needs() -> None:
    """Root with a short capability list (everything else dropped), no token, no service
    links, a read-only root, a deadline; its result comes back as the termination message."""
    m = build_pod_manifest(_pod(runtime_class_name="gvisor", memory="1Gi"), BuildPodSettings())
    spec = m["spec"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {
        "SYS_ADMIN",
        "SYS_CHROOT",
        "SETUID",
        "SETGID",
        "CHOWN",
        "FOWNER",
        "DAC_OVERRIDE",
        "MKNOD",
    }
    assert sc["readOnlyRootFilesystem"] is True and sc["seccompProfile"] == {
        "type": "RuntimeDefault"
    }
    assert "privileged" not in sc
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 3600
    assert spec["runtimeClassName"] == "gvisor"
    assert c["resources"]["limits"] == {"memory": "1Gi"}
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert c["command"] == ["python3", "-m", "sandpod_lifecycle.builds.podmain"]
    env = {e["name"]: e for e in c["env"]}
    assert json.loads(env["SANDPOD_BUILD_REQUEST"]["value"]) == {"template": "data"}
    assert env["SANDPOD_NATS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "sandpod-nats",
        "key": "url",
    }
    assert "SANDPOD_BUILD_AUTH_FILE" not in env  # no Secret configured: anonymous push


def test_the_registry_secret_is_mounted_read_only_for_the_push() -> None:
    m = build_pod_manifest(_pod(), BuildPodSettings(registry_secret="regcred"))
    (c,) = m["spec"]["containers"]
    vol = next(v for v in m["spec"]["volumes"] if v["name"] == "registry-auth")
    assert vol["secret"]["secretName"] == "regcred" and vol["secret"]["defaultMode"] == 0o400
    assert vol["secret"]["items"] == [{"key": ".dockerconfigjson", "path": "config.json"}]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "registry-auth")
    assert mount["readOnly"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SANDPOD_BUILD_AUTH_FILE"] == f"{mount['mountPath']}/config.json"


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"SANDPOD_BUILD_DEADLINE": "soon"}, "SANDPOD_BUILD_DEADLINE"),
        ({"SANDPOD_BUILD_DEADLINE": "0"}, "SANDPOD_BUILD_DEADLINE"),
        ({"SANDPOD_BUILD_REGISTRY": "not a registry!"}, "SANDPOD_BUILD_REGISTRY"),
        ({"SANDPOD_BUILD_REGISTRY": "justaname"}, "SANDPOD_BUILD_REGISTRY"),
    ],
)
def test_bad_build_settings_fail_start_up_naming_the_variable(
    env: dict[str, str], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        LifecycleSettings.from_env(env)


def test_build_settings_are_read_once_from_the_environment() -> None:
    s = LifecycleSettings.from_env(
        {
            "SANDPOD_BUILD_REGISTRY": "registry.example:5000/team/",
            "SANDPOD_BUILD_REGISTRY_SECRET": "regcred",
            "SANDPOD_BUILD_IMAGE": "reg/sandpod-lifecycle:1",
            "SANDPOD_BUILD_DEADLINE": "600",
        }
    )
    assert s.build_registry == "registry.example:5000/team"
    assert s.build_pods == BuildPodSettings(
        image="reg/sandpod-lifecycle:1", registry_secret="regcred", deadline=600
    )
    assert LifecycleSettings.from_env({}).build_registry is None
    assert validate_registry("127.0.0.1:5000") == "127.0.0.1:5000"
    assert image_tag(KEY) == f"build-{KEY[:32]}"


def test_the_request_and_the_outcome_round_trip_and_a_newer_one_is_refused() -> None:
    req = BuildRequest("data", {"from": {}, "steps": []}, KEY, "r/b@sha256:" + "0" * 64, KEY, "t")
    assert BuildRequest.from_json(req.to_json()) == req
    raw = json.loads(req.to_json())
    with pytest.raises(ValueError, match="version"):
        BuildRequest.from_json(json.dumps({**raw, "version": 99}))
    ok = BuildOutcome(ok=True, key=KEY, image="r/data@sha256:" + "1" * 64, ran=2)
    assert BuildOutcome.from_json(ok.to_json()) == ok


def test_a_failed_outcome_fits_a_termination_message_and_raises_its_typed_error() -> None:
    """The kubelet keeps 4096 bytes: a long log tail is cut, the JSON stays whole, and the
    lifecycle gets the very error class back (the template's Built reason is its code)."""
    failure = BuildFailed(
        "step 2 (run make) failed: the command exited with 2",
        template="data",
        step=2,
        log_tail="x" * 20_000,
    )
    text = BuildOutcome.failed(failure).to_json()
    assert len(text.encode()) <= MESSAGE_LIMIT
    back = BuildOutcome.from_json(text)
    with pytest.raises(BuildFailed) as raised:
        back.raise_error()
    assert raised.value.details["step"] == 2 and raised.value.details["log_tail"].endswith("xxx")
    auth = BuildOutcome.from_json(BuildOutcome.failed(ImageAuthFailed("refused")).to_json())
    with pytest.raises(ImageAuthFailed):
        auth.raise_error()


def test_a_builder_that_died_without_a_result_says_its_last_log_line() -> None:
    """A builder that crashed before writing its result (found on the real node: a
    ``TypeError``) leaves the end of its log as the message (``FallbackToLogsOnError``); the
    build's error names the exit code and that log's last line, never just "no reason"."""
    container = build_pod_manifest(_pod(), BuildPodSettings())["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    raw = {
        "metadata": {"name": "data-build-abab", "namespace": "team-a"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "build",
                    "state": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": "Traceback (most recent call last):\n  ...\n"
                            "TypeError: TarFile.extract() got an unexpected keyword\n",
                        }
                    },
                }
            ],
        },
    }
    outcome = _outcome(PodState.of(raw), "data")
    with pytest.raises(BuildFailed) as raised:
        outcome.raise_error()
    assert raised.value.message.endswith(
        "ended Failed without a result: exit code 1: "
        "TypeError: TarFile.extract() got an unexpected keyword"
    ), raised.value.message


def test_a_builds_own_nats_creds_are_mounted_and_owned_by_its_template() -> None:
    """Operator mode: the build's Secret (owned by the template, labelled like its Pod) is
    mounted read-only, mode 0400, and the builder connects with it and its inbox prefix."""
    pod = _pod(creds_secret="data-build-x-nats", inbox_prefix="_INBOX.build-1")
    secret = build_creds_secret_manifest(pod, "CREDS", 123)
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "SandboxTemplate"
    assert secret["metadata"]["labels"][BUILD_LABEL] == "data"
    assert base64.b64decode(secret["data"][CREDS_KEY]) == b"CREDS"
    m = build_pod_manifest(pod, BuildPodSettings())
    vol = next(v for v in m["spec"]["volumes"] if v["name"] == "nats-creds")
    assert (
        vol["secret"]["secretName"] == "data-build-x-nats" and vol["secret"]["defaultMode"] == 0o400
    )
    env = {e["name"]: e.get("value") for e in m["spec"]["containers"][0]["env"]}
    assert env["SANDPOD_NATS_CREDS"] == f"{CREDS_MOUNT}/{CREDS_KEY}"
    assert env["SANDPOD_NATS_INBOX_PREFIX"] == "_INBOX.build-1"
