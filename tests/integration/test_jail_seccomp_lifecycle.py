"""A template loosens the jail's seccomp filter only explicitly, and the Sandbox says so.

Through a real lifecycle (SANDPOD_RUNTIME=local) on a real nats-server: a sandbox of the default
template is ``Isolated=True`` with the filter active and cannot create a user namespace; one of a
template with ``security.allowNestedUserNamespaces`` can, and its ``Isolated`` condition is
``Degraded`` naming the setting. Needs root (the local runtime).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from test_lifecycle import Lifecycle, _ready_api, lifecycles  # noqa: F401 - fixture used by name

from sandpod import AsyncSandbox
from sandpod.control import api_call
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local runtime needs root: run the suite as root, as CI does"
)


async def test_the_isolated_condition_says_what_a_template_loosened(
    lifecycles: Callable[..., Lifecycle],  # noqa: F811 - the fixture imported above
) -> None:
    lc = lifecycles(SANDPOD_RUNTIME="local")
    await _ready_api(lc)
    template = {
        "kind": "SandboxTemplate",
        "metadata": {"name": "nested"},
        "spec": {"security": {"allowNestedUserNamespaces": True}},
    }
    async with await AsyncSandbox.connect("x", nats_url=lc.url, prefix=lc.prefix) as api:
        await api_call(
            api.bus, api.subjects, "templates", "apply", ObjectRequest(object=template), ObjectReply
        )
    strict = await AsyncSandbox.create(name="strict", nats_url=lc.url, prefix=lc.prefix)
    async with strict:
        loose = await AsyncSandbox.create(
            name="loose", template="nested", nats_url=lc.url, prefix=lc.prefix, wait=60
        )
        async with loose:
            r = await loose.exec("unshare -Urnm sh -c 'id -u'")
            assert (r.exit_code, r.stdout) == (0, "0\n"), r.stderr
            cond = (await loose.describe()).condition("Isolated")
            assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Degraded")
            assert "seccomp" in cond["message"] and "allowNestedUserNamespaces" in cond["message"]
            await loose.kill()
        # the loosened sandbox changed nothing for the other one
        r = await strict.exec("unshare -Urnm true; grep '^Seccomp:' /proc/self/status")
        assert r.stdout == "Seccomp:\t2\n" and "Operation not permitted" in r.stderr, r
        cond = (await strict.describe()).condition("Isolated")
        assert cond is not None and cond["status"] == "True", cond
        assert "seccomp" in cond["message"].split(", "), cond
        await strict.kill()
