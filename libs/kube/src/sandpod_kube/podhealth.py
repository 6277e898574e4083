"""Why a sandbox Pod is not Ready: what the Pod's status says, as one stable reason.

The Pod runtime used to see only "Ready or not"; a Pod stuck on a full cluster, a wrong image or
a dying container then looked like a slow start until a generic timeout. :func:`diagnose` reads
the raw Pod status (the same JSON :class:`~sandpod_kube.pods.PodState` is made from) and returns
the first problem found, most final first:

    phase Failed, reason Evicted              -> Evicted            terminal
    sandbox container terminated, OOMKilled   -> OOMKilled          terminal
    sandbox container terminated (exit code)  -> ExecdExited        terminal (with the last line
                                                                  of its message: execd's log)
    phase Failed, anything else               -> PodFailed          terminal
    waiting: CrashLoopBackOff                 -> CrashLoop          terminal (OOMKilled when
                                                                  the last exit was one)
    waiting: InvalidImageName                 -> InvalidImage       terminal
    waiting: ErrImagePull / ImagePullBackOff  -> ImagePullFailed    transient (registry, secret)
    waiting: CreateContainerConfigError       -> ContainerConfigError  transient (missing Secret)
    PodScheduled=False, reason Unschedulable  -> Unschedulable      transient (autoscaler)

Terminal: a new Pod of the same template would end the same way, or the sandbox's processes and
files are already gone -- the Sandbox is Failed. Transient: the cluster may still fix it; the
Sandbox stays ``Ready=False`` with the reason until the start deadline. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sandpod_contract.resources import TERMINAL_REASONS, ConditionReason

__all__ = ["SANDBOX_CONTAINER", "PodProblem", "diagnose"]

SANDBOX_CONTAINER = "sandbox"  # the container running execd (podspec)

_WAITING = {
    "CrashLoopBackOff": ConditionReason.CRASH_LOOP,
    "InvalidImageName": ConditionReason.INVALID_IMAGE,
    "ErrImagePull": ConditionReason.IMAGE_PULL_FAILED,
    "ImagePullBackOff": ConditionReason.IMAGE_PULL_FAILED,
    "ErrImageNeverPull": ConditionReason.IMAGE_PULL_FAILED,
    "CreateContainerConfigError": ConditionReason.CONTAINER_CONFIG_ERROR,
    "CreateContainerError": ConditionReason.CONTAINER_CONFIG_ERROR,
}
_IMAGE = (ConditionReason.IMAGE_PULL_FAILED, ConditionReason.INVALID_IMAGE)
MESSAGE_CHARS = 1000  # of a terminated container's last message line


@dataclasses.dataclass(frozen=True, slots=True)
class PodProblem:
    """One reason the Pod is not (or no longer) serving, with the Pod's own words."""

    reason: ConditionReason
    message: str

    @property
    def terminal(self) -> bool:
        """Give up (Sandbox Failed) rather than keep waiting."""
        return self.reason in TERMINAL_REASONS


def _statuses(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Container statuses, init containers first (an init container that cannot pull its image
    blocks the Pod as surely as the main one)."""
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _terminated(cs: Mapping[str, Any]) -> PodProblem | None:
    ended = (cs.get("state") or {}).get("terminated")
    if not ended or cs.get("name") != SANDBOX_CONTAINER:
        return None
    code, why = ended.get("exitCode"), str(ended.get("reason") or "")
    detail = f"container {SANDBOX_CONTAINER} terminated: exit code {code}"
    detail += f" ({why})" if why else ""
    if said := _last_line(str(ended.get("message") or "")):
        detail += f": {said}"
    if why == "OOMKilled":
        return PodProblem(ConditionReason.OOM_KILLED, detail)
    return PodProblem(ConditionReason.EXECD_EXITED, detail)


def _last_line(message: str) -> str:
    """What the container said last: with ``terminationMessagePolicy: FallbackToLogsOnError``
    the kubelet puts up to 80 lines of its log in the message; the last is the error."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1][:MESSAGE_CHARS] if lines else ""


def _waiting(cs: Mapping[str, Any]) -> PodProblem | None:
    waiting = (cs.get("state") or {}).get("waiting") or {}
    reason = _WAITING.get(str(waiting.get("reason") or ""))
    if reason is None:
        return None
    message = f"container {cs.get('name')}: {waiting['reason']}"
    if reason in _IMAGE:
        message += f" (image {cs.get('image', '?')})"
    last = (cs.get("lastState") or {}).get("terminated") or {}
    if reason is ConditionReason.CRASH_LOOP and last:
        message += f" (last exit code {last.get('exitCode')}, {last.get('reason') or 'no reason'})"
        if last.get("reason") == "OOMKilled":  # restarted after each OOM kill: say that
            reason = ConditionReason.OOM_KILLED
    if waiting.get("message"):
        message += f": {waiting['message']}"
    return PodProblem(reason, message)


def diagnose(raw: Mapping[str, Any]) -> PodProblem | None:
    """The problem the Pod reports, or None (running, or still starting normally)."""
    status = raw.get("status") or {}
    phase, pod_reason = status.get("phase"), str(status.get("reason") or "")
    pod_message = str(status.get("message") or "")
    if phase == "Failed" and pod_reason == "Evicted":
        return PodProblem(ConditionReason.EVICTED, pod_message or "the node evicted the Pod")
    statuses = _statuses(status)
    for cs in statuses:
        if ended := _terminated(cs):
            return ended
    if phase == "Failed":
        text = f"Pod failed: {pod_reason or 'no reason given'}"
        return PodProblem(
            ConditionReason.POD_FAILED, f"{text}: {pod_message}" if pod_message else text
        )
    waiting = [p for p in map(_waiting, statuses) if p is not None]
    if waiting:
        return min(waiting, key=lambda p: not p.terminal)  # a terminal one wins
    for cond in status.get("conditions") or []:
        if (cond.get("type"), cond.get("status")) == ("PodScheduled", "False") and cond.get(
            "reason"
        ) == "Unschedulable":
            return PodProblem(
                ConditionReason.UNSCHEDULABLE, str(cond.get("message") or "no node fits the Pod")
            )
    return None
