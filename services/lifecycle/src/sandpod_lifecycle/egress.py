"""A running sandbox's egress policy kept applied: the reconciler's network step.

Data flow: the Sandbox's effective policy (its own ``spec.network``, else its template's, plus
the platform's always-allowed rules, ``SANDPOD_NET_ALWAYS_ALLOW``:
:func:`sandpod_contract.network.effective_policy`) is compared with ``status.network`` (what
the runtime last applied). When the policy or its source differs, the driver's
``apply_network`` makes it so (the local runtime swaps its firewall chain, the Pod runtime
re-renders its NetworkPolicy, the process runtime reports it cannot) and the result becomes the
new ``status.network`` plus a ``network.updated`` event. When only the generation moved (an env
change), ``observedGeneration`` follows without asking the runtime again. Nothing here waits or
polls: a spec or template change reaches the reconciler through its watches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sandpod_contract.network import NetworkPolicy, Rule, effective_policy
from sandpod_contract.resources import NetworkStatus, SandboxTemplateSpec
from sandpod_lifecycle.driver import Driver
from sandpod_lifecycle.events import Events
from sandpod_store import SandboxView

__all__ = ["SANDBOX_SOURCE", "TEMPLATE_SOURCE", "announce_applied", "apply_egress", "wanted"]

SANDBOX_SOURCE = "sandbox"
TEMPLATE_SOURCE = "template"


def wanted(
    view: SandboxView, template: SandboxTemplateSpec, always_allowed: Sequence[Rule] = ()
) -> tuple[NetworkPolicy, str]:
    """(the policy ``view`` should run under now, where it comes from); ``always_allowed``:
    the platform's rules, appended to its ``allow`` (not to a ``deny-all`` policy)."""
    own = view.spec.network
    source = SANDBOX_SOURCE if own is not None else TEMPLATE_SOURCE
    return effective_policy(template.network, own, always_allowed), source


async def apply_egress(
    view: SandboxView,
    template: SandboxTemplateSpec,
    driver: Driver,
    events: Events,
    *,
    fresh: bool = False,
    always_allowed: Sequence[Rule] = (),
    announce: bool = True,
) -> NetworkStatus | None:
    """The ``status.network`` ``view`` should have, applying the policy first if it changed
    (or, ``fresh``, always: a new instance has nothing applied whatever the status says); None
    when the current one is right. ``always_allowed``: see :func:`wanted`. ``announce=False``:
    the caller publishes the ``network.updated`` event (:func:`announce_applied`) once it has
    recorded the status, so a client woken by the event reads what it says.

    Raises:
        RuntimeFailure: the runtime could not apply it (the pass is retried).
    """
    policy, source = wanted(view, template, always_allowed)
    generation = view.obj.metadata.generation
    current = view.status.network
    if not fresh and current is not None and (current.policy, current.source) == (policy, source):
        if current.observed_generation == generation:
            return None
        return dataclasses.replace(current, observed_generation=generation)
    result = await driver.apply_network(view.name, policy)
    applied = NetworkStatus(
        policy=policy,
        source=source,
        enforced=result.enforced,
        reason=result.reason,
        observed_generation=generation,
    )
    if announce:
        await announce_applied(events, view, applied)
    return applied


async def announce_applied(events: Events, view: SandboxView, applied: NetworkStatus) -> None:
    """The ``network.updated`` event of a policy the runtime applied to ``view``'s instance."""
    await events.publish_network(
        name=view.name,
        namespace=view.namespace,
        type_="updated",
        generation=applied.observed_generation,
        policy=applied.policy.to_dict(),
        enforced=applied.enforced,
        reason=applied.reason,
    )
