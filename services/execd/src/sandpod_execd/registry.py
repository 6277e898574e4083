"""What execd remembers about execs of one sandbox, all of it bounded.

- running one-shot execs (id -> Process, ``None`` while spawning) and streaming execs
  (id -> StreamingExec), so status probes and control verbs find them;
- output of finished one-shot execs that did not fit in one reply, until every stream that did
  not fit was fetched to the end or ``result_ttl`` passed, within a total byte budget;
- ids of recently finished execs with their raw return codes (a bounded LRU), so a status probe
  that races the reply learns "exited" (and how) rather than "unknown".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time

from sandpod_execd.process import Process
from sandpod_execd.streaming import StreamingExec

__all__ = ["ExecRegistry", "StoredOutput"]

RECENT_LIMIT = 4096


@dataclasses.dataclass(slots=True)
class StoredOutput:
    stdout: bytes
    stderr: bytes
    expires: float
    unfetched: set[str]  # streams the client still has to read to the end


class ExecRegistry:
    def __init__(self, result_ttl: float, stored_budget: int) -> None:
        self.result_ttl = result_ttl
        self.stored_budget = stored_budget
        self.oneshots: dict[str, Process | None] = {}
        self.streams: dict[str, StreamingExec] = {}
        self.stored: dict[str, StoredOutput] = {}
        # exec id -> raw return code (negative: killed by that signal); None: never exited
        # (spawn failed) or not known.
        self._recent: collections.OrderedDict[str, int | None] = collections.OrderedDict()
        self._none_running = asyncio.Event()  # set whenever no one-shot exec runs
        self._none_running.set()

    def __contains__(self, exec_id: str) -> bool:
        return exec_id in self.oneshots or exec_id in self.streams or exec_id in self._recent

    @property
    def active(self) -> int:
        return len(self.oneshots) + len(self.streams)

    def finished(self, exec_id: str, returncode: int | None = None) -> None:
        """Forget a running exec, remembering that it finished and ``returncode`` (a repeated
        call without one, e.g. the route's release after the handler, keeps what is known)."""
        self.oneshots.pop(exec_id, None)
        self.streams.pop(exec_id, None)
        if not self.oneshots:
            self._none_running.set()
        if returncode is None:
            returncode = self._recent.get(exec_id)
        self._recent[exec_id] = returncode
        self._recent.move_to_end(exec_id)
        while len(self._recent) > RECENT_LIMIT:
            self._recent.popitem(last=False)

    def started(self, exec_id: str) -> None:
        """A one-shot exec is starting (its process not spawned yet)."""
        self.oneshots[exec_id] = None
        self._none_running.clear()

    async def drained(self, timeout: float) -> bool:
        """Wait until no one-shot exec runs, ``timeout`` seconds at most; whether none does."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_running.wait(), timeout)
        return not self.oneshots

    def was_recent(self, exec_id: str) -> bool:
        return exec_id in self._recent

    def recent_returncode(self, exec_id: str) -> int | None:
        """The raw return code a recently finished exec exited with, if remembered."""
        return self._recent.get(exec_id)

    def store_output(self, exec_id: str, stdout: bytes, stderr: bytes, unfetched: set[str]) -> bool:
        """Keep output for ``exec.fetch``; False if the byte budget is exhausted."""
        self.expire()
        used = sum(len(s.stdout) + len(s.stderr) for s in self.stored.values())
        if used + len(stdout) + len(stderr) > self.stored_budget:
            return False
        expires = time.monotonic() + self.result_ttl
        self.stored[exec_id] = StoredOutput(stdout, stderr, expires, unfetched)
        return True

    def fetched_to_end(self, exec_id: str, stream: str) -> None:
        """The client read ``stream`` to its end: release the output once all streams are."""
        stored = self.stored.get(exec_id)
        if stored is not None:
            stored.unfetched.discard(stream)
            if not stored.unfetched:
                del self.stored[exec_id]

    def expire(self) -> None:
        now = time.monotonic()
        for exec_id in [k for k, v in self.stored.items() if v.expires <= now]:
            del self.stored[exec_id]
