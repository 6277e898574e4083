"""Time as a dependency of every loop that waits, expires or backs off.

The control loops (the lifecycle reconciler, the pool's reconcilers and claims, the leases) read
the time and wait only through a :class:`Clock` handed to them by the service's wiring, never
``time.time()``, ``time.monotonic()`` or ``asyncio.sleep`` directly. Production passes
:data:`REAL`; a unit test passes a :class:`FakeClock` and moves time with
:meth:`FakeClock.advance`, so a 2-second lifetime, a 900-second idle timeout or a 60-second backoff
is checked in microseconds and no outcome depends on how fast the machine is (kopf's
``looptime``: a test can assert that the fake time moved while no real time was waited for).

Two readings: ``now()`` is wall time (epoch seconds: compared with the RFC 3339 times objects
carry, :mod:`sandpod_contract.times`), ``monotonic()`` measures intervals (backoff, rate limits).
Timers (``call_later``) and ``sleep``/``wait`` run on the monotonic reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["REAL", "Clock", "FakeClock", "RealClock", "Timer"]


class Timer(Protocol):
    """A pending ``call_later``: cancellable, and when (monotonic reading) it fires."""

    def cancel(self) -> None: ...

    def when(self) -> float: ...


class Clock(Protocol):
    """What a control loop may know about time."""

    def now(self) -> float:
        """Wall time, epoch seconds."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines, timers)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait until ``event`` is set (True) or ``timeout`` seconds pass (False)."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback`` (on the loop) after ``delay`` seconds."""
        ...


class RealClock:
    """The machine's clocks and the running loop's timers."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        return event.is_set()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(delay, 0.0), callback)


REAL: Clock = RealClock()


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _FakeTimer:
    def __init__(self, clock: FakeClock, deadline: float, callback: Callable[[], None]) -> None:
        self._clock = clock
        self._deadline = deadline
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None

    def when(self) -> float:
        return self._deadline


class FakeClock:
    """A clock that moves only when a test says so (:meth:`advance`).

    Timers, sleeps and waits registered on it fire in deadline order as :meth:`advance` passes
    their deadlines; nothing here ever waits for real time. ``waited`` counts the fake seconds
    the code under test asked to wait, so a test can state "this took 60 s of its time".
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._wall0 = start
        self._mono = 0.0
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._watchers: list[tuple[float, asyncio.Future[None]]] = []
        self.waited = 0.0

    def now(self) -> float:
        return self._wall0 + self._mono

    def monotonic(self) -> float:
        return self._mono

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = _FakeTimer(self, self._mono + max(delay, 0.0), callback)
        heapq.heappush(self._timers, (timer.when(), next(self._seq), timer))
        for at, fut in self._watchers:
            if at == timer.when():
                _settle(fut)
        return timer

    async def scheduled(self, at: float) -> None:
        """Wait, without moving time, until a timer is set to fire at monotonic reading
        ``at``: how a test knows the loop under test has reached the wait it expects."""
        if at in self.pending():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (at, fut)
        self._watchers.append(entry)
        try:
            await fut
        finally:
            self._watchers.remove(entry)

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, lambda: _settle(fut))
        self.waited += max(seconds, 0.0)
        try:
            await fut
        finally:
            timer.cancel()

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(timeout, lambda: _settle(fut))
        waiter = asyncio.ensure_future(event.wait())  # owned here: cancelled below
        waiter.add_done_callback(lambda _: _settle(fut))
        try:
            await fut
        finally:
            timer.cancel()
            waiter.cancel()
        return event.is_set()

    def pending(self) -> list[float]:
        """Deadlines (monotonic reading) of the timers still to fire, earliest first."""
        return sorted(t.when() for _, _, t in self._timers if t.callback is not None)

    def advance(self, seconds: float) -> int:
        """Move time forward ``seconds``, firing every timer that falls due on the way (in
        order, time set to each one's deadline as it fires). Returns how many fired."""
        end = self._mono + max(seconds, 0.0)
        fired = 0
        while self._timers and self._timers[0][0] <= end:
            deadline, _, timer = heapq.heappop(self._timers)
            callback, timer.callback = timer.callback, None
            if callback is None:
                continue
            self._mono = max(self._mono, deadline)
            callback()
            fired += 1
        self._mono = end
        return fired

    def set_wall(self, now: float) -> None:
        """Set wall time (epoch seconds) without moving the monotonic reading: a wall clock
        that jumps (NTP) is something the rules must survive too."""
        self._wall0 = now - self._mono
