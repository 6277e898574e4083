"""The local runtime's seccomp filter: which mode a sandbox gets, and whether it is in force.

Every process of a jail runs under a seccomp filter loaded by ``sandpod-jail-exec`` (built by
``make install`` from ``services/execd/native``, the filters compiled there with libseccomp; the
policy is described in ``seccomp_gen.c``): the holder (pid 1) loads it as its last step, and
execd's entry loads it before every command (exec, streams, sessions, background processes,
terminals, git). Modes:

- ``default``: at least as strict as the common container default profile (no nested
  namespaces, mounts, keyrings, io_uring, bpf, perf events, kexec, modules, vsock, ...);
- ``nested``: the template's ``security.allowNestedUserNamespaces``: the default plus creating
  and entering namespaces and mounting inside them;
- ``unconfined``: the template's ``security.seccomp: Unconfined``: no filter.

The driver does not trust the build: once the holder is ready it reads the holder's
``Seccomp:`` line, and the ``seccomp`` protection says ``active`` only if the filter is there;
anything looser than ``default`` (or a filter that is missing) is reported, so the Sandbox's
``Isolated`` condition says Degraded with the reason.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from sandpod_lifecycle.runtime.base import ACTIVE, SeccompMode

__all__ = ["HELPER", "helper", "mode_for", "protection"]

HELPER = "sandpod-jail-exec"
NO_HELPER = (
    "not applied: sandpod-jail-exec is not built (make install needs a C compiler and "
    "libseccomp-dev), so commands enter through sh + nsenter without a filter"
)
NO_FILTER = (
    "not applied: sandpod-jail-exec was built without libseccomp "
    "(apt-get install libseccomp-dev, then make install)"
)
UNCONFINED = "disabled by the template (security.seccomp: Unconfined)"
NESTED = (
    "active, loosened by the template (security.allowNestedUserNamespaces): the sandbox may "
    "create user namespaces and mount inside them"
)


def helper() -> str | None:
    """``sandpod-jail-exec`` next to the interpreter (the venv) or on PATH, as execd finds it;
    None if it is not built."""
    beside = Path(sys.executable).parent / HELPER
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(HELPER)


def mode_for(seccomp: str, allow_nested_user_namespaces: bool) -> SeccompMode:
    """The filter mode of a template's ``security`` (validated by the contract)."""
    if seccomp == "Unconfined":
        return "unconfined"
    return "nested" if allow_nested_user_namespaces else "default"


def protection(holder_pid: int, mode: SeccompMode, helper_path: str | None) -> str:
    """The ``seccomp`` protection of a ready holder: ``active`` or why it is not."""
    if mode == "unconfined":
        return UNCONFINED
    if helper_path is None:
        return NO_HELPER
    if _seccomp_state(holder_pid) != 2:
        return NO_FILTER
    return NESTED if mode == "nested" else ACTIVE


def _seccomp_state(pid: int) -> int | None:
    """The ``Seccomp:`` field of /proc/<pid>/status (0 none, 1 strict, 2 filter)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Seccomp:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isdigit() else None
    return None
