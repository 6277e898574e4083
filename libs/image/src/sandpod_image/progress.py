"""Pull progress: the events a pull reports, for progress bars and logs.

A pull calls its ``progress`` callback (synchronously, from the event loop; it must not block)
with a :class:`PullProgress` at each step: the image ``resolving``, then per layer ``waiting``
(another pull holds it), ``downloading`` (repeatedly, with bytes so far), ``unpacking``, and
``done`` or ``cached`` (the layer was in the store already), and finally ``complete``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Phase", "PullProgress"]


class Phase(StrEnum):
    RESOLVING = "resolving"
    WAITING = "waiting"
    DOWNLOADING = "downloading"
    UNPACKING = "unpacking"
    DONE = "done"
    CACHED = "cached"
    COMPLETE = "complete"


@dataclass(frozen=True, slots=True)
class PullProgress:
    """One step of a pull.

    Attributes:
        reference: the reference being pulled, as given.
        phase: what happens now.
        layer: the layer's blob digest (None for image-level phases).
        index: the layer's position, bottom first (0 for image-level phases).
        layers: how many layers the image has (0 until resolved).
        done: bytes downloaded so far (``downloading``), or the layer's size when finished.
        total: the layer blob's size.
    """

    reference: str
    phase: Phase
    layer: str | None = None
    index: int = 0
    layers: int = 0
    done: int = 0
    total: int = 0
