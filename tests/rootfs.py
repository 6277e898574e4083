"""The default sandbox root filesystem for the suite, built at most once per machine.

Every lifecycle (local runtime) and every ``sandpod up`` a test starts must run templates
without ``rootfs`` on the Debian base, as a user's would: the session fixture in conftest
builds it with the real ``mmdebstrap`` into ``~/.cache/sandpod/rootfs`` (about a minute, cold;
reused by every later run and CI job on this machine) and exports ``SANDPOD_DEFAULT_ROOTFS``,
which every child process inherits. A host that cannot build it (no mmdebstrap, no apt sources)
exports nothing: the tests that need a base then fail with lifecycle's message saying how to
prepare one, never silently on the host root.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sandpod_image import debian

__all__ = ["CACHE", "ENV", "prepare_for_session"]

CACHE = Path("~/.cache/sandpod/rootfs").expanduser()
ENV = "SANDPOD_DEFAULT_ROOTFS"


def _say(line: str) -> None:
    stream = sys.__stderr__  # past pytest's capture: a cold build takes a minute, say why
    if stream is not None:
        stream.write(f"sandpod rootfs: {line}\n")
        stream.flush()


def prepare_for_session() -> Path | None:
    """The base's path, built if missing, and exported as ``SANDPOD_DEFAULT_ROOTFS`` (None:
    this host cannot build one; the reason is printed)."""
    given = os.environ.get(ENV)
    if given:  # the runner's own prepared base
        return Path(given)
    t0 = time.monotonic()
    try:
        ready = debian.prepare(CACHE, progress=_say)
    except debian.RootfsError as exc:
        _say(f"cannot prepare the default root filesystem: [{exc.code}] {exc.message}")
        return None
    if ready.built:
        _say(f"built {ready.fs} in {time.monotonic() - t0:.0f} s")
    os.environ[ENV] = str(ready.fs)
    return ready.fs
