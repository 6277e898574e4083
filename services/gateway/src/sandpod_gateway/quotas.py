"""Per-tenant quotas on what a tenant holds open at once on this replica, and the replica's
own ceiling behind them.

Every long-lived stream (SSE, WebSocket, file transfer) takes a *stream* slot and every command
(one-shot, streamed or over a WebSocket) an *exec* slot of its tenant; a tenant at its limit gets
``busy.quota_exceeded`` (429) at once, naming the quota and the setting that raises it, and never
waits. The per-tenant limits sit well below the replica's ceiling (``max_streams``), so one
tenant filling its quota leaves the replica's slots to the others; only the sum over many
tenants can reach the ceiling, which answers ``busy`` (503: add a replica). Counters are per
replica (a tenant spread over N replicas may hold N times its quota): the cheap, wait-free
bound that stops one client from starving the others here.
"""

from __future__ import annotations

import collections
import collections.abc

from sandpod_contract.errors import Busy
from sandpod_gateway.errors import QuotaExceeded

__all__ = ["Quotas", "Slot"]

SETTINGS = {
    "streams": "SANDPOD_GATEWAY_TENANT_MAX_STREAMS",
    "execs": "SANDPOD_GATEWAY_TENANT_MAX_EXECS",
}


class Slot:
    """One held unit of a tenant's quota (and, for streams, of the replica's); release is
    idempotent, so every exit path may call it."""

    def __init__(self, release: collections.abc.Callable[[], None]) -> None:
        self._release: collections.abc.Callable[[], None] | None = release

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Quotas:
    def __init__(self, max_streams: int, tenant_streams: int, tenant_execs: int) -> None:
        self.max_streams = max_streams
        self.limits = {"streams": tenant_streams, "execs": tenant_execs}
        self._held: dict[str, collections.Counter[str]] = {
            "streams": collections.Counter(),
            "execs": collections.Counter(),
        }
        self._streams_total = 0
        self.on_stream: collections.abc.Callable[[int], None] = lambda _delta: None

    def held(self, kind: str, tenant: str) -> int:
        return self._held[kind][tenant]

    def stream(self, tenant: str) -> Slot:
        """A stream slot. Raises QuotaExceeded (tenant) or Busy (replica full)."""
        self._check("streams", tenant)
        if self._streams_total >= self.max_streams:
            raise Busy("too many open streams on this gateway replica: retry, or add a replica")
        self._streams_total += 1
        self._held["streams"][tenant] += 1
        self.on_stream(1)

        def release() -> None:
            self._streams_total -= 1
            self._drop("streams", tenant)
            self.on_stream(-1)

        return Slot(release)

    def exec(self, tenant: str) -> Slot:
        """An exec slot. Raises QuotaExceeded."""
        self._check("execs", tenant)
        self._held["execs"][tenant] += 1
        return Slot(lambda: self._drop("execs", tenant))

    def streaming_exec(self, tenant: str) -> Slot:
        """The exec and the stream slot of a streamed command, as one."""
        execs = self.exec(tenant)
        try:
            stream = self.stream(tenant)
        except BaseException:
            execs.release()
            raise

        def release() -> None:
            execs.release()
            stream.release()

        return Slot(release)

    def _check(self, kind: str, tenant: str) -> None:
        limit = self.limits[kind]
        if self._held[kind][tenant] >= limit:
            raise QuotaExceeded(kind, limit, SETTINGS[kind], tenant)

    def _drop(self, kind: str, tenant: str) -> None:
        held = self._held[kind]
        held[tenant] -= 1
        if held[tenant] <= 0:
            del held[tenant]
