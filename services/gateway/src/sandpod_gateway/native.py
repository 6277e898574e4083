"""The native front: ``sandpod-front`` (Rust, ``services/gateway/native``) takes the gateway's
connections and relays a preview request on a kept admission itself, without Python.

Why (``bench/preview.py``): a round trip through any Python relay costs 1.3x the app's own
before the gateway does anything; the whole fast path in :mod:`sandpod_gateway.front` reached
2.2-2.4x against a target of 1.5x.

How the two share the work -- the gateway stays the only place that decides:

- The gateway binds the public socket and starts the front with it (``pass_fds``); uvicorn, with
  :class:`~sandpod_gateway.front.FrontProtocol`, serves a Unix socket in a directory only the
  gateway's user can enter. The front sends every request it cannot carry there, unchanged but
  for :data:`PEER` (the client's address, trusted only on that socket; the front drops the
  client's own).
- When the gateway admits a preview request on a :class:`~sandpod_gateway.preview.Pass`, its
  response carries the pass to the front (:meth:`NativeFront.pass_line`) in a header whose name
  holds a secret only the two know, so no app can plant one in its own response. The front keeps
  it for that client connection and relays the connection's next requests with the same
  credential headers and Host, for the same sandbox port, itself.
- What a pass was decided on is checked by the front on every request: the gateway bumps an
  epoch in a shared page (:class:`Epoch`) whenever a cached key or Sandbox record changes or
  leaves its cache, and a pass lives no longer than the Sandbox record it read. So a revoked key
  or a port made private ends every pass at once, as in :meth:`PreviewGate.recall`.
- The front reports each request it relayed (:class:`FrontReport`, in batches: a datagram per
  request would wake the gateway per request), and the gateway writes the same log line and
  metrics as for its own.

If the front exits, the gateway starts it again (the listening socket stays open meanwhile, so
connections wait in its backlog rather than being refused). Without the binary, or with
``SANDPOD_GATEWAY_PREVIEW_FRONT=false``, uvicorn serves the public socket itself, as before.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import mmap
import os
import secrets
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, ClassVar

import structlog

from sandpod_gateway.context import Context
from sandpod_gateway.middleware import PREVIEW_HOST, PREVIEW_PATH, record
from sandpod_gateway.preview import Pass, PreviewGate, PreviewRoute

__all__ = [
    "PEER",
    "Epoch",
    "FrontPass",
    "FrontReport",
    "NativeFront",
    "find_front",
    "peer_of",
    "with_front_peer",
]

log = structlog.get_logger("sandpod.gateway.native")

PEER = b"x-sandpod-front-peer"
BINARY = "sandpod-front"
_RESTART_MAX = 5.0


def find_front() -> Path | None:
    """``sandpod-front`` beside this Python (``make install`` builds it into the venv), else on
    PATH; None when neither has it."""
    beside = Path(sys.executable).parent / BINARY
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(BINARY)
    return Path(found) if found else None


def peer_of(headers: list[tuple[bytes, bytes]]) -> tuple[str, int] | None:
    """The client address the front named (``ip:port``, ``[v6]:port``), or None."""
    for k, v in headers:
        if k == PEER:
            host, _, port = v.decode("latin-1").rpartition(":")
            if host and port.isdigit():
                return host.strip("[]"), int(port)
    return None


_App = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def with_front_peer(app: _App) -> _App:
    """The ASGI app, seeing the client the front named (on the front's socket uvicorn has no
    peer address)."""

    async def wrapped(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] in ("http", "websocket") and not scope.get("client"):
            scope["client"] = peer_of(scope["headers"])
        await app(scope, receive, send)

    return wrapped


@dataclasses.dataclass(frozen=True, slots=True)
class FrontPass:
    """A kept admission as the front reads it (``native/src/pass.rs``, ``Wire``): JSON, then
    base64url without padding, in one response header. ``native/vectors.json`` holds cases
    both sides check."""

    VERSION: ClassVar[int] = 1
    up: str  # "address:port" of the sandbox's app (the Host it gets)
    prefix: str  # the path form's prefix; "" for the host form
    creds: list[tuple[str, str]]  # the credential headers as the app gets them (latin-1)
    proto: str  # X-Forwarded-Proto
    ttl: float  # seconds the Sandbox record stays the gateway's cached one
    epoch: int  # the epoch the decision was made at
    tenant: str
    sandbox: str
    by_host: bool

    def encode(self) -> bytes:
        wire = {"v": self.VERSION, **dataclasses.asdict(self)}
        raw = json.dumps(wire, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=")


@dataclasses.dataclass(frozen=True, slots=True)
class FrontReport:
    """One request the front relayed itself (``native/src/report.rs``): a line of
    tab-separated fields, ``v1 method status micros request-id by-host tenant sandbox
    dropped`` (``dropped``: records lost since the last one that went); the front sends lines
    in batches, a datagram every 50 ms or every 16 KiB."""

    method: str
    status: int
    seconds: float
    request_id: str
    by_host: bool
    tenant: str
    sandbox: str
    dropped: int

    @classmethod
    def parse(cls, data: bytes) -> FrontReport | None:
        """The report in ``data``, or None when it is not one."""
        fields = data.decode("utf-8", "replace").split("\t")
        if len(fields) != 9 or fields[0] != "v1":
            return None
        _, method, status, micros, rid, by_host, tenant, sandbox, dropped = fields
        if not (status.isdigit() and micros.isdigit() and dropped.isdigit()):
            return None
        if by_host not in ("0", "1"):
            return None
        return cls(
            method,
            int(status),
            int(micros) / 1e6,
            rid,
            by_host == "1",
            tenant,
            sandbox,
            int(dropped),
        )


class Epoch:
    """A counter in a page shared with the front (a memfd): bumped whenever a cached key or
    Sandbox record changes or leaves, read by the front on every request it carries."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("sandpod-front-epoch", 0)
        os.ftruncate(self.fd, mmap.PAGESIZE)
        self._page = mmap.mmap(self.fd, mmap.PAGESIZE)
        self.value = 1
        struct.pack_into("=Q", self._page, 0, self.value)

    def bump(self) -> None:
        self.value += 1
        struct.pack_into("=Q", self._page, 0, self.value)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._page.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class NativeFront:
    """The front process, its shared page, its report socket and the gateway's own socket."""

    def __init__(self, ctx: Context, binary: Path) -> None:
        self.ctx = ctx
        self.binary = binary
        self.secret = secrets.token_hex(16)
        self._header = b"x-sandpod-pass-" + self.secret.encode()
        self.epoch = Epoch()
        self._dir = tempfile.mkdtemp(prefix="sandpod-front-")  # 0700: only our user enters
        self.backend = os.path.join(self._dir, "gateway.sock")
        self._reports, self._their_reports = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._reports.setblocking(False)
        with contextlib.suppress(OSError):
            self._reports.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self.starts = 0  # how many times the front was started (tests: the restart)
        self.dropped = 0  # reports the front could not send (the gateway was behind)
        self.relayed = 0  # requests the front reported relaying itself

    def backend_socket(self) -> socket.socket:
        """The Unix socket uvicorn serves for the front."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.backend)
        os.chmod(self.backend, 0o600)
        sock.listen(1024)
        sock.setblocking(False)
        return sock

    # -- passes ----------------------------------------------------------------------------------

    def pass_line(
        self,
        gate: PreviewGate,
        kept: Pass,
        scope: dict[str, Any],
        route: PreviewRoute,
        *,
        epoch: int,
    ) -> bytes | None:
        """The response header line handing ``kept`` to the front, or None when it may not
        keep it (the Sandbox record is about to leave the cache, or ``epoch``, read when the
        decision began, moved on since: a revocation may have raced it)."""
        ok = kept.admitted
        if epoch != self.epoch.value:
            return None
        ttl = self.ctx.targets.fresh_for(ok.target.sandbox_id)
        if ttl <= 0:
            return None
        # the app's view of the request, as the gateway makes it: the front applies it as is
        headers = gate.upstream_headers(scope, route, ok.address)
        made = dict(headers)
        wire = FrontPass(
            up=made[b"host"].decode(),
            prefix=route.prefix,
            creds=[
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in headers
                if k in (b"authorization", b"x-api-key", b"cookie")
            ],
            proto=made[b"x-forwarded-proto"].decode(),
            ttl=ttl,
            epoch=epoch,
            tenant=ok.tenant or "",
            sandbox=ok.target.sandbox_id,
            by_host=route.by_host,
        )
        return self._header + b": " + wire.encode() + b"\r\n"

    # -- the process -----------------------------------------------------------------------------

    async def run(self, public: socket.socket, stopping: asyncio.Event) -> None:
        """Run the front on ``public`` until ``stopping`` is set, starting it again whenever
        it exits."""
        loop = asyncio.get_running_loop()
        reports = self._reports.fileno()
        loop.add_reader(reports, self._drain)
        backoff = 0.2
        try:
            while not (stopping.is_set() or self._stopping):
                started = time.monotonic()
                proc = await self._spawn(public)
                waiter = asyncio.ensure_future(proc.wait())
                stopper = asyncio.ensure_future(stopping.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if stopping.is_set() or self._stopping:
                    waiter.cancel()
                    return
                log.error(
                    "front_exited",
                    code=proc.returncode,
                    hint="started again; its stderr above says why it stopped",
                )
                if time.monotonic() - started > 10:
                    backoff = 0.2
                await asyncio.sleep(backoff)  # connections wait in the listen backlog
                backoff = min(backoff * 2, _RESTART_MAX)
        finally:
            loop.remove_reader(reports)

    async def _spawn(self, public: socket.socket) -> asyncio.subprocess.Process:
        s = self.ctx.settings
        fds = (public.fileno(), self.epoch.fd, self._their_reports.fileno())
        argv = [str(self.binary), "--listen-fd", str(fds[0]), "--backend", self.backend]
        argv += ["--epoch-fd", str(fds[1]), "--report-fd", str(fds[2])]
        argv += ["--keepalive", "5", "--connect-timeout", str(s.preview_connect_timeout)]
        argv += ["--grace", str(max(s.grace, 0.0)), "--parent", str(os.getpid())]
        env = {"SANDPOD_FRONT_SECRET": self.secret, "PATH": os.environ.get("PATH", "")}
        self._proc = await asyncio.create_subprocess_exec(*argv, pass_fds=fds, env=env)
        self.starts += 1
        log.info("front_started", pid=self._proc.pid, binary=str(self.binary))
        return self._proc

    async def stop(self, grace: float) -> None:
        """Stop the front (its connections get ``grace`` to finish); :meth:`close` frees what
        it used once :meth:`run` has returned."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace + 2)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    def close(self) -> None:
        self.epoch.close()
        self._reports.close()
        self._their_reports.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- reports ---------------------------------------------------------------------------------

    def _drain(self) -> None:
        """The front's records of the requests it relayed: the gateway's log line and metrics."""
        for _ in range(64):  # then let the loop run; the reader fires again
            try:
                data = self._reports.recv(1 << 16)
            except OSError:  # nothing more now (BlockingIOError), or closed
                return
            for line in data.split(b"\n"):
                if line:
                    self._record(line)

    def _record(self, line: bytes) -> None:
        report = FrontReport.parse(line)
        if report is None:
            log.warning("front_report_malformed", size=len(line))
            return
        self.relayed += 1
        if report.dropped:
            self.dropped += report.dropped
            log.warning("front_reports_dropped", count=report.dropped)
        record(
            self.ctx,
            report.method,
            PREVIEW_HOST if report.by_host else PREVIEW_PATH,
            report.status,
            report.seconds,
            tenant=report.tenant,
            request_id=report.request_id,
            sandbox_id=report.sandbox or None,
            via="front",
        )
