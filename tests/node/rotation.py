"""Observe a sandbox's NATS credential rotate on a real node: Secret, file, connection.

Why: a rotation crosses three processes that each keep their own clock of events -- lifecycle
rewrites the Secret (seen here by a watch on the API server), the kubelet swaps the mounted
file (seen from inside the container by a watcher the sandbox runs: :data:`SWAP_WATCHER`), and
execd reconnects with it (seen by the NATS server: ``connz`` lists every connection, closed ones
too, with the user key it authenticated as and when it started and stopped). Every clock is this
machine's (the container shares the kernel), so the three can be put on one timeline
(:func:`timeline`). tests/node/test_real_creds.py asserts its order; bench/creds_rotation.py
prints its delays against the credential's half-life.

    Secret MODIFIED (watch) --> ..data swapped in the container --> connz: conn of the new key
          t_secret                        t_file                       t_conn   < old JWT's exp
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import itertools
import re
import time
from datetime import datetime
from typing import Any

from kubernetes import client, watch

from sandpod_bus.natsauth import creds_jwt, decode_jwt
from sandpod_kube.config import KubeSettings
from sandpod_kube.podspec import CREDS_KEY, CREDS_MOUNT

__all__ = [
    "SWAP_WATCHER",
    "Conn",
    "Minted",
    "Rotation",
    "connections",
    "minted",
    "parse_swaps",
    "secret_rewrites",
    "timeline",
]

# Run inside the sandbox (as its own code would): each time the kubelet swaps the volume's
# ``..data`` link, one line "<unix time> <sha256 of the creds file>" (polls every 0.1 s).
SWAP_WATCHER = (
    f"d={CREDS_MOUNT}; last=''; while :; do now=$(readlink $d/..data); "
    'if [ "$now" != "$last" ]; then '
    'echo "$(date +%s.%N) $(sha256sum < $d/' + CREDS_KEY + ' | cut -c1-64)" >> /workspace/swaps; '
    'last="$now"; fi; sleep 0.1; done'
)


@dataclasses.dataclass(frozen=True, slots=True)
class Minted:
    """One version of the sandbox's Secret: when this side saw it, and its JWT."""

    seen: float  # unix time the watch delivered it
    sha: str  # sha256 of the creds file's text (what the container's watcher prints)
    user: str  # the JWT's subject: the user key the server reports in connz
    issued: int  # the JWT's iat
    expires: int  # the JWT's exp


def minted(secret: client.V1Secret, seen: float) -> Minted:
    """The creds in ``secret`` (a creds Secret of lifecycle's), seen at ``seen``."""
    assert secret.data is not None
    text = base64.b64decode(secret.data[CREDS_KEY]).decode()
    claims = decode_jwt(creds_jwt(text))
    sha = hashlib.sha256(text.encode()).hexdigest()
    return Minted(seen, sha, str(claims["sub"]), int(claims["iat"]), int(claims["exp"]))


def secret_rewrites(
    settings: KubeSettings, namespace: str, name: str, *, after: str, count: int, timeout: float
) -> list[Minted]:
    """The next ``count`` versions of Secret ``name`` after resourceVersion ``after``, each with
    the time the watch delivered it (blocking: run it in a thread). Fewer when ``timeout``
    seconds pass first."""
    found: list[Minted] = []
    deadline = time.monotonic() + timeout
    with settings.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        while len(found) < count and (left := deadline - time.monotonic()) > 0:
            stream = watch.Watch()  # type: ignore[no-untyped-call]  # untyped in the client
            for event in stream.stream(  # type: ignore[no-untyped-call]  # untyped in the client
                core.list_namespaced_secret,
                namespace,
                timeout_seconds=max(1, int(left)),
                field_selector=f"metadata.name={name}",
                resource_version=after,
            ):
                secret = event["object"]
                assert isinstance(secret, client.V1Secret) and secret.metadata is not None
                after = str(secret.metadata.resource_version)
                if event["type"] == "MODIFIED":
                    found.append(minted(secret, time.time()))
                    if len(found) == count:
                        stream.stop()  # type: ignore[no-untyped-call]  # untyped in the client
    return found


def parse_swaps(text: str) -> list[tuple[float, str]]:
    """:data:`SWAP_WATCHER`'s lines: (unix time, sha256 of the file then). The first line is
    the file as the watcher found it at start, not a swap."""
    return [(float(t), sha) for t, sha in (line.split() for line in text.splitlines() if line)]


@dataclasses.dataclass(frozen=True, slots=True)
class Conn:
    """One client connection as the NATS server reports it."""

    user: str
    start: float
    stop: float | None
    reason: str


_FRACTION = re.compile(r"(\.\d{6})\d+")


def _when(stamp: str) -> float:
    """connz's RFC 3339 time with nanoseconds, as unix time (microseconds kept)."""
    return datetime.fromisoformat(_FRACTION.sub(r"\1", stamp).replace("Z", "+00:00")).timestamp()


def connections(connz: list[dict[str, Any]], users: set[str]) -> list[Conn]:
    """The connections (open and closed) that authenticated as one of ``users``, by start."""
    found = [
        Conn(
            str(c["authorized_user"]),
            _when(c["start"]),
            _when(c["stop"]) if c.get("stop") else None,
            str(c.get("reason", "")),
        )
        for c in connz
        if c.get("authorized_user") in users
    ]
    return sorted(found, key=lambda c: c.start)


@dataclasses.dataclass(frozen=True, slots=True)
class Rotation:
    """One rotation from JWT ``old`` to ``new``: when each part of the node saw it."""

    old: Minted
    new: Minted
    t_file: float | None  # the container's file became ``new`` (None: never seen)
    t_conn: float | None  # execd's first connection as ``new``'s user started (None: never)

    @property
    def half_life(self) -> float:
        return (self.old.expires - self.old.issued) / 2

    @property
    def file_delay(self) -> float | None:
        return None if self.t_file is None else self.t_file - self.new.seen

    @property
    def conn_delay(self) -> float | None:
        return None if self.t_conn is None else self.t_conn - self.new.seen


def timeline(
    versions: list[Minted], swaps: list[tuple[float, str]], conns: list[Conn]
) -> list[Rotation]:
    """Each consecutive pair of ``versions`` as a rotation, with the first time the container's
    file held the new one and the first connection as its user."""
    rotations = []
    for old, new in itertools.pairwise(versions):
        t_file = next((t for t, sha in swaps if sha == new.sha), None)
        t_conn = next((c.start for c in conns if c.user == new.user), None)
        rotations.append(Rotation(old, new, t_file, t_conn))
    return rotations
