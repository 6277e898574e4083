"""Per-sandbox NATS credentials for the ``kubernetes`` runtime: when to mint, for how long.

Why: a sandbox Pod must hold a credential that reaches only its own subjects (DESIGN.md, security
model). Lifecycle holds the NATS account's signing seed (``SANDPOD_NATS_ACCOUNT_SEED_FILE``) and
mints one user JWT per sandbox (:func:`sandpod_bus.natsauth.sandbox_permissions`); the Pod driver
puts it in the Sandbox's own Secret, which the Pod mounts for execd.

Lifetime: the JWT expires at the sandbox's ``shutdownTime`` plus a margin, and never later than
``ttl`` from now (a permanent sandbox, or a far shutdown, still gets a short-lived credential).
Renewal (:meth:`CredsPolicy.stale`): re-minted when less than half of what a fresh JWT would get is
left (a long-lived sandbox at its JWT's half-life; a renewed one soon after its renew), or when a
fresh one would last longer and less than ``margin`` (at most half the ``ttl``) is left; the Secret
is rewritten, the kubelet updates the mounted file, execd's Bus sees the change and reconnects with
it (:mod:`sandpod_bus.credswatch`). Revocation: a deleted sandbox's Pod and Secret are deleted; a
copy taken out by the sandbox's code stays valid until it expires (at most ``ttl``): revoking
earlier needs the account JWT's revocation list pushed to a NATS resolver that accepts updates (the
``full`` resolver), which this installation's ``MEMORY`` resolver does not.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from sandpod_bus.natsauth import KeyPair, sandbox_permissions, user_creds
from sandpod_contract.subjects import Subjects

__all__ = ["KUBELET_DEFAULT_DELIVERY", "CredsPolicy", "Minted"]

# How long a rewritten Secret may take to reach execd in a running Pod with the kubelet's default
# syncFrequency (1 m, jittered up to 1.5x: it rewrites a Secret volume only when it syncs the Pod)
# plus execd's 5 s poll of the file. Measured on a real node: 36-63 s to the file, 38-67 s to the
# reconnect (bench/creds_rotation.py --real-node --sync-frequency 1m); a 60 s ttl (half-life 30 s)
# there had execd dropped at its first JWT's expiry.
KUBELET_DEFAULT_DELIVERY = 95.0


@dataclasses.dataclass(frozen=True, slots=True)
class Minted:
    creds: str  # the creds file's text
    expires: int  # the JWT's exp (unix seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class CredsPolicy:
    """Mints sandbox creds with the account key (see the module docstring for the lifetimes)."""

    account: KeyPair
    subjects: Subjects
    ttl: float = 86400.0
    margin: float = 300.0

    @classmethod
    def from_seed_file(
        cls, path: Path, subjects: Subjects, ttl: float, margin: float
    ) -> CredsPolicy:
        """Read the account seed. Raises OSError (unreadable) or BadRequest (not a seed)."""
        return cls(KeyPair.from_seed(path.read_text()), subjects, ttl, margin)

    def expiry(self, shutdown: float | None, now: float) -> int:
        """When a JWT minted ``now`` for a sandbox ending at ``shutdown`` should expire."""
        cap = now + self.ttl
        return math.ceil(min(cap, shutdown + self.margin) if shutdown is not None else cap)

    def too_short_for(self, delivery: float = KUBELET_DEFAULT_DELIVERY) -> bool:
        """Whether the half-life of a ttl-capped JWT is shorter than ``delivery`` (how long a
        rewritten Secret takes to reach execd): then execd is dropped when the old one expires."""
        return self.ttl / 2 < delivery

    def stale(self, expires: int, shutdown: float | None, now: float) -> bool:
        """Whether a JWT expiring at ``expires`` must be re-minted (``now``: time of asking)."""
        remaining, fresh = expires - now, self.expiry(shutdown, now) - now
        # The margin rule is for a sandbox near its end whose lifetime grew; bounded by half the
        # ttl, or a ttl under the margin would re-mint on every pass.
        soon = min(self.margin, self.ttl / 2)
        return remaining < fresh / 2 or (fresh > remaining and remaining < soon)

    def mint(self, sandbox_id: str, shutdown: float | None, now: float) -> Minted:
        expires = self.expiry(shutdown, now)
        perms = sandbox_permissions(self.subjects.sandbox_all(sandbox_id))
        name = f"sandbox:{sandbox_id}"
        return Minted(user_creds(self.account, name, perms, now=int(now), expires=expires), expires)
