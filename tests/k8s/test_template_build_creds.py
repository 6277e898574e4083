"""A template build on Kubernetes with NATS in operator mode: the builder Pod connects as a user
of its own, which can do the build's two things on the bus (publish its progress, read the
``copy`` contexts) and nothing else.

The installation of tests/k8s/test_pod_creds.py (``op_cluster``: every service as its own
least-privilege user, the SDK as the client user, lifecycle with the account seed), a real
registry, and the fake kubelet writing the builder Pod's Secret volume as the Pod spec says.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from kubernetes import client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from k8s.cluster import NS, Cluster
from k8s.test_pod_creds import LIFECYCLE_ENV, _no_violations, op_cluster  # noqa: F401 - fixture
from k8s.test_template_build_pods import (
    PASSWORD,
    SECRET,
    USER,
    _base_image,
    _build,
    _registry_secret,
)
from registry import TestRegistry
from runnable_image import docker_config
from sandpod.templates import Template
from sandpod_bus.natsauth import creds_jwt, decode_jwt
from sandpod_contract.subjects import Subjects
from sandpod_image.auth import AuthConfig
from sandpod_kube.podspec import CREDS_KEY

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="a build's run step mounts an overlay and chroots: run the suite as root, as CI does",
)


@pytest.fixture(scope="module")
def creds_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRegistry]:
    reg = TestRegistry(tmp_path_factory.mktemp("creds-registry"), users={USER: PASSWORD})
    reg.start()
    yield reg
    reg.stop()


async def test_the_builder_pod_has_a_nats_user_of_its_own_that_reaches_only_its_build(
    op_cluster: tuple[Cluster, Path],  # noqa: F811 - the fixture imported above
    creds_registry: TestRegistry,
    tmp_path: Path,
) -> None:
    """Operator mode: a build with a copy step (the context read from JetStream) and a run step
    succeeds, its progress reaching the client; the builder's JWT allows only its template's
    build subject, that bucket's JetStream API and its own inbox prefix; with it, the control
    plane and the sandboxes' subjects are refused (an attack with the copy the kubelet wrote);
    its Secret is deleted with the Pod."""
    c, seed = op_cluster
    creds = docker_config(
        tmp_path / "config.json", creds_registry, AuthConfig(username=USER, password=PASSWORD)
    )
    _registry_secret(c, creds)
    base = await _base_image(creds_registry, tmp_path)
    c.service(
        "sandpod_lifecycle",
        SANDPOD_NATS_ACCOUNT_SEED_FILE=str(seed),
        SANDPOD_IMAGE_AUTH_FILE=str(creds),
        SANDPOD_BUILD_REGISTRY=f"{creds_registry.host}/sandpod",
        SANDPOD_BUILD_REGISTRY_SECRET=SECRET,
        **LIFECYCLE_ENV,
    )
    await c.answering()
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "f").write_text("from the context\n")
    name = f"kc-{uuid.uuid4().hex[:6]}"
    logs: list[str] = []
    t = Template(name).from_image(base).copy(context, "/ctx").run("echo step-ran; cat /ctx/f")
    info = await _build(c, t, logs)
    assert info.phase == "Ready" and info.image, info
    assert "  | step-ran" in logs and "  | from the context" in logs, logs

    (pod,) = c.kubelet.builds
    pod_name = pod["metadata"]["name"]
    secret_name = f"{pod_name}-nats"
    text = (c.state / "pods" / pod_name / "volumes" / "nats-creds" / CREDS_KEY).read_text()
    claims = decode_jwt(creds_jwt(text))["nats"]
    s = Subjects(c.prefix)
    pub, sub = claims["pub"]["allow"], claims["sub"]["allow"]
    ours = [p for p in pub if p.startswith(f"{c.prefix}.")]
    assert ours == [s.event("template", name, "build")], pub  # no API, no sandbox, no events
    assert all(p.startswith(("$JS.", "$O.", f"{c.prefix}.")) for p in pub), pub
    assert not any(p.startswith("$O.") and "build-contexts" not in p for p in pub)
    (inbox,) = sub
    assert inbox.startswith("_INBOX.build-") and inbox != "_INBOX.>"

    # The attack: the builder's credential, taken out, against the control plane.
    creds_file = tmp_path / "stolen.creds"
    creds_file.write_text(text)
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(
        c.nats.url,
        user_credentials=str(creds_file),
        inbox_prefix=inbox.removesuffix(".>").encode(),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        with pytest.raises((NoRespondersError, NatsTimeout)):
            await nc.request(s.api("sandboxes", "list"), b"\x80", timeout=1)
        await nc.subscribe(f"{c.prefix}.sbx.>")
        await nc.flush(timeout=2)
    finally:
        await nc.close()
    assert any("permissions violation" in str(e).lower() for e in errors), errors

    with c.plane.settings.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        names = [x.metadata.name for x in core.list_namespaced_secret(NS).items if x.metadata]
    assert secret_name not in names  # deleted with the Pod
    _no_violations(c)
