"""Pool-service settings, read once from the environment at start-up.

| variable | default | meaning |
|---|---|---|
| ``SANDPOD_NATS_URL`` / ``NATS_URL`` | ``nats://127.0.0.1:4222`` | NATS server(s) |
| ``SANDPOD_NATS_CREDS`` | unset | NATS creds file (operator mode), watched for renewals |
| ``SANDPOD_PREFIX`` | ``sandpod`` | subject prefix (buckets are named after it) |
| ``SANDPOD_STORE`` | ``kv`` | ``kv`` (JetStream KV) or ``kube`` (CRDs: ``SANDPOD_KUBE_*``) |
| ``SANDPOD_REPLICA_ID`` | hostname-pid | lease holder name of this replica |
| ``SANDPOD_LEASE_TTL`` | 10 s | KV store: a dead replica's pools move to another after this |
| ``SANDPOD_LEADER_*`` | 15/10/2 s | kube store: leader election (``LeaderSettings``) |
| ``SANDPOD_POOL_RESYNC`` | 2 s | every pool is reconciled at least this often |
| ``SANDPOD_POOL_CREATE_RATE`` | 20 /s | member creates per second per pool (no storms) |
| ``SANDPOD_POOL_REFILL_DELAY`` | 0.1 s | after a member changes, wait this long before refilling |
| ``SANDPOD_POOL_MEMBER_GRACE`` | 60 s | a member not ready after this is replaced |
| ``SANDPOD_CLAIM_WAIT`` | 60 s | default wait for a claimed sandbox to be ready |
| ``SANDPOD_CLAIM_RECOVER_AFTER`` | 10 s | a claim unbound this long lost its handler: finish it |
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping

from sandpod_bus import BusSettings
from sandpod_contract.subjects import DEFAULT_PREFIX
from sandpod_kube import KubeSettings, LeaderSettings, store_settings
from sandpod_service import env_float, env_str

__all__ = ["PoolSettings"]


@dataclasses.dataclass(frozen=True)
class PoolSettings:
    bus: BusSettings = dataclasses.field(default_factory=BusSettings)
    prefix: str = DEFAULT_PREFIX
    kube: KubeSettings | None = None  # None: the KV store (SANDPOD_STORE=kv)
    leader: LeaderSettings = dataclasses.field(default_factory=LeaderSettings)  # kube only
    replica_id: str = dataclasses.field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}"
    )
    lease_ttl: float = 10.0
    resync: float = 2.0
    create_rate: float = 20.0
    member_grace: float = 60.0
    refill_delay: float = 0.1
    claim_wait: float = 60.0
    recover_after: float = 10.0
    grace: float = 10.0
    log_level: str = "info"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PoolSettings:
        env = os.environ if env is None else env
        base = cls()
        return cls(
            kube=store_settings(env),
            bus=BusSettings(
                url=env_str(env, ("SANDPOD_NATS_URL", "NATS_URL"), BusSettings.url),
                creds=env_str(env, "SANDPOD_NATS_CREDS", "") or None,
                name="pool",
            ),
            prefix=env_str(env, "SANDPOD_PREFIX", DEFAULT_PREFIX),
            replica_id=env_str(env, "SANDPOD_REPLICA_ID", base.replica_id),
            leader=LeaderSettings.from_env(env),
            lease_ttl=env_float(env, "SANDPOD_LEASE_TTL", base.lease_ttl, minimum=0.5),
            resync=env_float(env, "SANDPOD_POOL_RESYNC", base.resync, minimum=0.1),
            create_rate=env_float(env, "SANDPOD_POOL_CREATE_RATE", base.create_rate, minimum=0.1),
            refill_delay=env_float(env, "SANDPOD_POOL_REFILL_DELAY", base.refill_delay),
            member_grace=env_float(env, "SANDPOD_POOL_MEMBER_GRACE", base.member_grace, minimum=1),
            claim_wait=env_float(env, "SANDPOD_CLAIM_WAIT", base.claim_wait, minimum=0.1),
            recover_after=env_float(
                env, "SANDPOD_CLAIM_RECOVER_AFTER", base.recover_after, minimum=0.1
            ),
            log_level=env_str(env, "SANDPOD_LOG_LEVEL", "info"),
        )
