"""The synchronous SDK: the same surface as :mod:`sandpod.aio`, blocking.

Each method runs its async twin on the SDK's private loop thread (:mod:`sandpod._loop`).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from sandpod._loop import run
from sandpod._twins import iterate, twin
from sandpod.aio import AsyncSandbox
from sandpod.control import SandboxInfo
from sandpod.exec.args import DEFAULT_TIMEOUT, Command
from sandpod.exec.sync import ExecStream
from sandpod.exec.types import ExecResult
from sandpod.fs import Files
from sandpod.git import Git
from sandpod.network import Network
from sandpod.pools import ClaimInfo
from sandpod.proc import Processes
from sandpod.pty import Ptys
from sandpod.session import Sessions
from sandpod.snapshots import Snapshots
from sandpod.watch import Watches
from sandpod_contract.messages.sandboxes import SandboxEvent
from sandpod_contract.messages.system import Activity, Info, SandboxMetrics

if TYPE_CHECKING:
    from sandpod.volumes import VolumeMount

__all__ = ["ExecStream", "Sandbox"]


class Sandbox:
    """A blocking handle on one sandbox.

    ``Sandbox.connect("default").exec("/workspace", "date")``
    """

    def __init__(self, inner: AsyncSandbox) -> None:
        self._inner = inner
        self.fs = Files(inner.fs)
        self.proc = Processes(inner.proc)
        self.sessions = Sessions(inner.sessions)
        self.pty = Ptys(inner.pty)
        self.watch = Watches(inner.watch)
        self.git = Git(inner.git)
        self.network = Network(inner.network)
        self.snapshots = Snapshots(inner.snapshots)

    @classmethod
    def connect(
        cls,
        sandbox_id: str = "default",
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
        connect_timeout: float = 5.0,
        nats_creds: str | None = None,
        tenant: str | None = None,
        inbox_prefix: str | None = None,
    ) -> Sandbox:
        """Connect to sandbox ``sandbox_id`` (see :meth:`AsyncSandbox.connect`)."""
        return cls(
            run(
                AsyncSandbox.connect(
                    sandbox_id,
                    nats_url=nats_url,
                    prefix=prefix,
                    connect_timeout=connect_timeout,
                    nats_creds=nats_creds,
                    tenant=tenant,
                    inbox_prefix=inbox_prefix,
                )
            )
        )

    @property
    def id(self) -> str:
        return self._inner.id

    @classmethod
    def create(
        cls,
        template: str | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        permanent: bool = False,
        idle_timeout: int | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        network: Mapping[str, Any] | None = None,
        snapshot: str | None = None,
        idle_policy: str | None = None,
        volumes: Sequence[VolumeMount | str] = (),
        wait: float = 60.0,
        nats_url: str | None = None,
        prefix: str | None = None,
    ) -> Sandbox:
        """Create a sandbox and return it once Ready (see :meth:`AsyncSandbox.create`)."""
        return cls(
            run(
                AsyncSandbox.create(
                    template,
                    name=name,
                    timeout=timeout,
                    permanent=permanent,
                    idle_timeout=idle_timeout,
                    labels=labels,
                    env=env,
                    network=network,
                    snapshot=snapshot,
                    idle_policy=idle_policy,
                    volumes=volumes,
                    wait=wait,
                    nats_url=nats_url,
                    prefix=prefix,
                )
            )
        )

    @classmethod
    def claim(
        cls,
        pool: str | None = None,
        *,
        template: str | None = None,
        timeout: float | None = None,
        idle_timeout: int | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        wait: float = 60.0,
        nats_url: str | None = None,
        prefix: str | None = None,
    ) -> Sandbox:
        """Claim a ready sandbox from a warm pool (see :meth:`AsyncSandbox.claim`)."""
        return cls(
            run(
                AsyncSandbox.claim(
                    pool,
                    template=template,
                    timeout=timeout,
                    idle_timeout=idle_timeout,
                    labels=labels,
                    env=env,
                    name=name,
                    wait=wait,
                    nats_url=nats_url,
                    prefix=prefix,
                )
            )
        )

    @property
    def claim_info(self) -> ClaimInfo | None:
        """The claim this sandbox came from (None: not claimed)."""
        return self._inner.claim_info

    def release(self, wait: float = 30.0) -> None:
        """End this sandbox's claim and delete the sandbox."""
        run(self._inner.release(wait))

    @classmethod
    def list(
        cls,
        labels: str | Mapping[str, str] | None = None,
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
    ) -> list[SandboxInfo]:
        """Sandboxes known to the lifecycle service, filtered by a label selector."""
        return run(AsyncSandbox.list(labels, nats_url=nats_url, prefix=prefix))

    def describe(self) -> SandboxInfo:
        return run(self._inner.describe())

    def kill(self, wait: float = 30.0) -> None:
        run(self._inner.kill(wait))

    def renew(self, seconds: float) -> SandboxInfo:
        return run(self._inner.renew(seconds))

    def pause(self, wait: float = 30.0) -> SandboxInfo:
        return run(self._inner.pause(wait))

    def resume(self, wait: float = 30.0) -> SandboxInfo:
        return run(self._inner.resume(wait))

    snapshot = twin(AsyncSandbox.snapshot)

    def fork(
        self,
        n: int = 1,
        *,
        snapshot: str | None = None,
        labels: Mapping[str, str] | None = None,
        wait: float = 60.0,
    ) -> builtins.list[Sandbox]:
        """``n`` sandboxes with this one's files now (see :meth:`AsyncSandbox.fork`)."""
        forks = run(self._inner.fork(n, snapshot=snapshot, labels=labels, wait=wait))
        return [Sandbox(f) for f in forks]

    expose = twin(AsyncSandbox.expose)
    url = twin(AsyncSandbox.url)
    unexpose = twin(AsyncSandbox.unexpose)

    def events(self) -> Iterator[SandboxEvent]:
        """Live lifecycle events (blocking iterator; break out of the loop to stop)."""
        return iterate(self._inner.events())

    def close(self) -> None:
        run(self._inner.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def ping(self, timeout: float = 5.0) -> float:
        return run(self._inner.ping(timeout))

    def info(self) -> SandboxInfo:
        return run(self._inner.info())

    def runtime_info(self, timeout: float = 5.0) -> Info:
        return run(self._inner.runtime_info(timeout))

    def metrics(self, timeout: float = 5.0) -> SandboxMetrics:
        """Resource use now (see :meth:`AsyncSandbox.metrics`)."""
        return run(self._inner.metrics(timeout))

    def activity(self, timeout: float = 5.0) -> Activity:
        """Last client activity (see :meth:`AsyncSandbox.activity`)."""
        return run(self._inner.activity(timeout))

    def exec(
        self,
        cwd_or_command: str | Command | None,
        command: Command | None = None,
        /,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_output: int | None = None,
        check: bool = False,
    ) -> ExecResult:
        """Run a command to completion (see :meth:`AsyncSandbox.exec`)."""
        return run(
            self._inner.exec(
                cwd_or_command,
                command,
                env=env,
                stdin=stdin,
                timeout=timeout,
                max_output=max_output,
                check=check,
            )
        )

    def exec_stream(
        self,
        cwd_or_command: str | Command | None,
        command: Command | None = None,
        /,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        stdin_open: bool = False,
        timeout: float | None = None,
        window: int | None = None,
        abandon_after: float | None = None,
    ) -> ExecStream:
        """Start a streaming exec (see :meth:`AsyncSandbox.exec_stream`)."""
        return ExecStream(
            self._inner.exec_stream(
                cwd_or_command,
                command,
                env=env,
                stdin=stdin,
                stdin_open=stdin_open,
                timeout=timeout,
                window=window,
                abandon_after=abandon_after,
            )
        )
