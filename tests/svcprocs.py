"""Control-plane services (lifecycle, pool) as real processes for tests, on a private prefix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import psutil

from conftest import NatsServer

__all__ = ["ServiceProc", "kill_instances"]


class ServiceProc:
    """One replica of ``python -m <module>`` with the test's NATS, prefix and state dir
    (``wrap``: an argv prefix, e.g. one that runs it as another user)."""

    def __init__(
        self,
        module: str,
        nats: NatsServer,
        state: Path,
        prefix: str,
        replica: str,
        *,
        wrap: tuple[str, ...] = (),
        **extra: str,
    ) -> None:
        self.module, self.replica, self.wrap = module, replica, wrap
        self.env = {
            **os.environ,
            "SANDPOD_NATS_URL": nats.url,
            "SANDPOD_PREFIX": prefix,
            "SANDPOD_STATE_DIR": str(state),
            "SANDPOD_REPLICA_ID": replica,
            "SANDPOD_LEASE_TTL": "2",
            "SANDPOD_LOG_LEVEL": "debug",
            **extra,
        }
        self.log = state / f"{module}-{replica}.log"
        self.proc: subprocess.Popen[bytes] = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.stopped = False  # set by stop() and kill(): an exit the test asked for
        with self.log.open("ab") as out:  # when it began: a slow start shows in the log
            out.write(f"# spawned at {datetime.now(UTC).isoformat()}\n".encode())
            out.flush()
            return subprocess.Popen(
                [*self.wrap, sys.executable, "-m", self.module],
                env=self.env,
                stdout=out,
                stderr=out,
            )

    def restart(self) -> None:
        self.stop()
        self.proc = self._spawn()

    def kill(self) -> None:
        """SIGKILL: no cleanup at all (what a crash looks like)."""
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(20)

    def stop(self) -> None:
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def exited(self) -> str | None:
        """Why this replica is not running when it should (its exit code and log tail)."""
        code = self.proc.poll()
        return (
            None
            if code is None or self.stopped
            else f"{self.module} exited with {code}:\n{self.tail()}"
        )

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def kill_instances(state: Path) -> None:
    """SIGKILL every process-runtime execd recorded under ``state`` (instances outlive the
    lifecycle service on purpose; tests clean them up)."""
    pids = []
    for record in (state / "instances").glob("*.json"):
        pid = json.loads(record.read_text())["pid"]
        if psutil.pid_exists(pid):
            pids.append(pid)
            os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10)
