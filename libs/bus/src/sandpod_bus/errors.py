"""The transport's own errors: what went wrong on the wire, not what it means for a caller.

The bus cannot know what a subject nobody serves means: for a sandbox's data-plane subject it is
"no such sandbox" (or "not ready yet"), for the control plane "the lifecycle service is down",
for a node subject "that node's execd is gone". So :class:`sandpod_bus.Bus` raises
:class:`NoResponders` and each caller maps it to its domain error (``raise … from exc``) at its
boundary. Timeouts and a closed connection keep the contract's ``RequestTimeout`` and
``ConnectionLost``: those mean the same thing to every caller, and clients see those codes.

``NoResponders`` is a :class:`~sandpod_contract.errors.SandpodError` (so ``except SandpodError``
around a best-effort request still catches it) but not a wire error: defined outside the
contract module it is in no catalogue, and one that reaches a reply unmapped goes out as
``internal``, which is the bug it is.
"""

from __future__ import annotations

from sandpod_contract.errors import SandpodError

__all__ = ["NoResponders"]


class NoResponders(SandpodError):
    """Nobody subscribes to the request's subject (NATS "no responders").

    Attributes:
        subject: in ``details["subject"]``; an internal name, so callers that answer an
            outside client drop it when they map the error.
    """

    retryable = True
    summary = "nobody serves this subject"

    @property
    def subject(self) -> str:
        return str(self.details.get("subject", ""))
