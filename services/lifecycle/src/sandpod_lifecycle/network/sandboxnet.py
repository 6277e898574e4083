"""What the node's network enforcers know of one sandbox, and what they report about it.

The resolver and the egress proxy see packets, not sandboxes: they find the sandbox behind a
source address through a lookup lifecycle provides (``Callable[[address], SandboxNet | None]``),
called on every query and connection, so a runtime policy update is seen by the next one.
They report refusals as :class:`Denial` values to a callback (lifecycle turns them into
rate-limited ``network.denied`` events).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

from sandpod_contract.network import NetworkPolicy

__all__ = ["Denial", "DenialKind", "SandboxLookup", "SandboxNet"]


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxNet:
    """One sandbox as the enforcers see it: its id and the policy it runs under now."""

    sandbox_id: str
    policy: NetworkPolicy


class DenialKind(enum.StrEnum):
    DNS = "dns"  # a lookup refused by a name rule or the mode
    REBINDING = "rebinding"  # an allowed name answered only addresses the policy refuses
    CONNECT = "connect"
    SNI = "sni"


@dataclasses.dataclass(frozen=True, slots=True)
class Denial:
    """One refused lookup or connection (the payload of a ``network.denied`` event)."""

    sandbox_id: str
    kind: DenialKind
    destination: str  # a DNS name, or address[:port]
    rule: str  # the rule's text, or "mode:<mode>" / "special-range" / "metadata"


# source address (text, as the socket reports it) -> the sandbox, or None for a stranger
SandboxLookup = Callable[[str], "SandboxNet | None"]
