"""Detect what this host allows the local runtime to do, once, from /proc and the mount table.

The local runtime needs the mount/pid/ipc/uts/net/cgroup namespaces, overlayfs and the
util-linux and iproute2 tools, and either root or (*rootless*) unprivileged user namespaces;
without any of them it refuses to run (``problems``) rather than run sandboxes unisolated.
cgroup controllers are optional: a missing one degrades that protection on every instance
(``notes``), and ``InstanceStatus.protections`` says so. Rootless, only cgroups delegated to
this user count (see ``cgroups.CgroupPlan.choose``); supplementary groups the user cannot drop
in a user namespace are a note too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sandpod_lifecycle.runtime.base import HostCapabilities

__all__ = ["TOOLS", "detect", "parse_cgroup_mounts"]

NAMESPACES = ("mnt", "pid", "ipc", "uts", "net", "cgroup")
# Run on the host while the jail is built (sleep runs from the base, see holder.py).
TOOLS = ("sh", "unshare", "nsenter", "mount", "umount", "pivot_root", "ip", "grep")
ROOTLESS_TOOLS = ("hostname",)  # /proc/sys/kernel/hostname is not ours to write in a userns
CONTROLLERS = ("memory", "cpu", "pids")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def parse_cgroup_mounts(mountinfo: str) -> tuple[dict[str, Path], Path | None]:
    """(v1 controller -> mount point, v2 mount point) from ``/proc/self/mountinfo`` text.

    Only mounts of a hierarchy's root (``/`` as the mount's root) count: a bind mount of some
    sub-cgroup (as in a container) cannot hold our cgroups.
    """
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        mount_point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2" and v2 is None:
            v2 = mount_point
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in ("memory", "cpu", "pids", "freezer", "cpuacct") and option not in v1:
                    v1[option] = mount_point
    return v1, v2


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _nsenter_has_wdns(nsenter: str | None) -> bool:
    """Whether nsenter can change directory inside the namespace (-W, util-linux 2.38)."""
    if nsenter is None:
        return False
    try:
        usage = subprocess.run(
            [nsenter, "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--wdns" in usage


def detect() -> HostCapabilities:
    """Probe the host (cheap: a few /proc reads, PATH lookups and ``nsenter --help``)."""
    root = os.geteuid() == 0
    namespaces = frozenset(n for n in (*NAMESPACES, "user") if os.path.exists(f"/proc/self/ns/{n}"))
    userns = _read("/proc/sys/user/max_user_namespaces").strip() not in ("", "0") and _read(
        "/proc/sys/kernel/unprivileged_userns_clone"
    ).strip() in ("", "1")
    overlay = any(line.split()[-1] == "overlay" for line in _read("/proc/filesystems").splitlines())
    v1, v2 = parse_cgroup_mounts(_read("/proc/self/mountinfo"))
    v2_controllers = frozenset(_read(f"{v2}/cgroup.controllers").split()) if v2 else frozenset()
    needed = TOOLS if root else (*TOOLS, *ROOTLESS_TOOLS)
    tools = {name: shutil.which(name, path=PATH) for name in needed}

    problems: list[str] = []
    notes: list[str] = []
    if not root and not ("user" in namespaces and userns):
        problems.append(
            "the local runtime needs root or unprivileged user namespaces "
            "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1)"
        )
    extra_groups = sorted(set(os.getgroups()) - {os.getegid()})
    if not root and extra_groups:
        notes.append(
            f"rootless: sandboxes keep this user's supplementary groups {extra_groups} "
            "(a user namespace cannot drop them): run sandpod as a user without any"
        )
    missing_ns = [n for n in NAMESPACES if n not in namespaces]
    if missing_ns:
        problems.append(f"kernel lacks namespaces: {', '.join(missing_ns)}")
    if not overlay:
        problems.append("overlayfs is not available (modprobe overlay)")
    missing_tools = sorted(name for name, path in tools.items() if path is None)
    if missing_tools:
        problems.append(f"missing tools: {', '.join(missing_tools)} (util-linux, iproute2)")
    elif not _nsenter_has_wdns(tools["nsenter"]):
        problems.append("nsenter has no --wdns: execd needs util-linux >= 2.38")

    freezer = "v1" if "freezer" in v1 else "v2" if v2 is not None else None
    if freezer is None and root:
        problems.append("no cgroup freezer: neither a v1 freezer hierarchy nor cgroup v2")
    notes += [
        f"no {c} cgroup controller: {c} is not limited"
        for c in CONTROLLERS
        if c not in v1 and c not in v2_controllers
    ]
    return HostCapabilities(
        root=root,
        namespaces=namespaces,
        unprivileged_user_namespaces=userns,
        overlayfs=overlay,
        cgroup_v1=v1,
        cgroup_v2=v2,
        cgroup_v2_controllers=v2_controllers,
        freezer=freezer,
        tools=tools,
        problems=tuple(problems),
        notes=tuple(notes),
    )
