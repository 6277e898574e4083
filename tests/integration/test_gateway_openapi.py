"""Gateway OpenAPI: the served document equals the checked-in one, and schemathesis fuzzes every
operation against a real gateway without a server error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from gateway_harness import GatewayProcess
from hypothesis import HealthCheck, settings

from conftest import NatsServer
from sandpod_gateway.openapi import spec

__all__: list[str] = []

CHECKED_IN = Path(__file__).parents[2] / "schemas" / "openapi" / "gateway.json"
# The lifecycle events stream never ends by itself: it is tested in test_gateway_sandboxes.
schema = schemathesis.openapi.from_dict(spec()).exclude(path="/v1/events")


@pytest.fixture(scope="module")
def fuzz_target(
    nats: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """A gateway process and a key of a tenant that owns no sandbox (fuzzing never touches a
    real sandbox: commands of the process runtime would run on this host)."""
    import subprocess
    import sys

    gp = GatewayProcess(
        nats.url,
        tmp_path_factory.mktemp("fuzz") / "gateway.log",
        SANDPOD_GATEWAY_RATE="100000",
        SANDPOD_GATEWAY_BURST="100000",
    )
    made = subprocess.run(
        [sys.executable, "-m", "sandpod_gateway", "keys", "create", "--tenant", "fuzz"],
        env={"SANDPOD_NATS_URL": nats.url, "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    yield gp.url, {"authorization": f"Bearer {made.stdout.strip()}"}
    assert gp.stop() == 0


def test_served_openapi_equals_checked_in(fuzz_target: tuple[str, dict[str, str]]) -> None:
    """GET /openapi.json is exactly schemas/openapi/gateway.json (regenerate with
    `python -m sandpod_gateway openapi > schemas/openapi/gateway.json`)."""
    served = httpx.get(f"{fuzz_target[0]}/openapi.json", timeout=10).json()
    assert served == json.loads(CHECKED_IN.read_text())
    assert served["openapi"].startswith("3.1")


def no_server_error(
    ctx: object, response: schemathesis.Response, case: schemathesis.Case[Any]
) -> None:
    """A 5xx is acceptable only as a typed, retryable JSON error (a dependency is away, e.g. no
    lifecycle on this prefix); 500 internal or a non-JSON 5xx is a gateway bug."""
    if response.status_code < 500:
        return
    body = json.loads(response.text)
    assert response.status_code != 500, body
    assert set(body) >= {"code", "message", "retryable"} and body["retryable"] is True, body


@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
    ],
)
def test_fuzzed_requests_never_hit_a_server_error(
    case: schemathesis.Case[Any], fuzz_target: tuple[str, dict[str, str]]
) -> None:
    """Schema-generated requests (valid and edge-case inputs) never get a server error."""
    url, auth = fuzz_target
    response = case.call(base_url=url, headers=auth, timeout=30)
    no_server_error(None, response, case)
    assert "x-request-id" in response.headers
    if response.status_code >= 400:
        assert {"code", "message", "retryable"} <= set(json.loads(response.text))
