"""sandpod_kube.podhealth: a Pod's status as one stable reason, terminal or transient."""

from __future__ import annotations

from typing import Any

import pytest

from sandpod_kube.podhealth import diagnose


def _pod(phase: str = "Pending", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {"phase": phase, **status}}


def _cs(state: dict[str, Any], name: str = "sandbox", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "python:3.12", "state": state, **extra}


@pytest.mark.parametrize(
    ("pod", "reason", "terminal", "says"),
    [
        (
            _pod(
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes",
                    }
                ]
            ),
            "Unschedulable",
            False,
            "0/3 nodes",
        ),
        (
            _pod(containerStatuses=[_cs({"waiting": {"reason": "ErrImagePull"}})]),
            "ImagePullFailed",
            False,
            "image python:3.12",
        ),
        (
            _pod(
                initContainerStatuses=[
                    _cs({"waiting": {"reason": "ImagePullBackOff"}}, name="execd-install")
                ]
            ),
            "ImagePullFailed",
            False,
            "execd-install",
        ),
        (
            _pod(containerStatuses=[_cs({"waiting": {"reason": "InvalidImageName"}})]),
            "InvalidImage",
            True,
            "python:3.12",
        ),
        (
            _pod(
                containerStatuses=[
                    _cs(
                        {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": "secret not found",
                            }
                        }
                    )
                ]
            ),
            "ContainerConfigError",
            False,
            "secret not found",
        ),
        (
            _pod(
                "Running",
                containerStatuses=[
                    _cs(
                        {"waiting": {"reason": "CrashLoopBackOff"}},
                        lastState={"terminated": {"exitCode": 2, "reason": "Error"}},
                    )
                ],
            ),
            "CrashLoop",
            True,
            "last exit code 2",
        ),
        (
            _pod(
                "Running",
                containerStatuses=[
                    _cs(
                        {"waiting": {"reason": "CrashLoopBackOff"}},
                        lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                    )
                ],
            ),
            "OOMKilled",
            True,
            "137",
        ),
        (
            _pod(
                "Failed",
                containerStatuses=[_cs({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})],
            ),
            "OOMKilled",
            True,
            "exit code 137",
        ),
        (
            _pod("Failed", containerStatuses=[_cs({"terminated": {"exitCode": 1}})]),
            "ExecdExited",
            True,
            "exit code 1",
        ),
        (
            _pod(
                "Running",  # a real kubelet: the container ended before the phase says so
                containerStatuses=[
                    _cs(
                        {
                            "terminated": {
                                "exitCode": 2,
                                "reason": "Error",
                                "message": '{"event": "starting"}\n{"event": "nats_unreachable"}\n',
                            }
                        }
                    )
                ],
            ),
            "ExecdExited",
            True,
            'exit code 2 (Error): {"event": "nats_unreachable"}',
        ),
        (_pod("Failed", reason="Evicted", message="low on memory"), "Evicted", True, "low on"),
        (_pod("Failed", reason="DeadlineExceeded"), "PodFailed", True, "DeadlineExceeded"),
    ],
)
def test_diagnose_maps_what_the_pod_reports_to_a_stable_reason(
    pod: dict[str, Any], reason: str, terminal: bool, says: str
) -> None:
    """Each kubelet/scheduler report becomes its ConditionReason, terminal or transient, and the
    message keeps the Pod's own words (image, exit code, scheduler message)."""
    problem = diagnose(pod)
    assert problem is not None
    assert (problem.reason, problem.terminal) == (reason, terminal)
    assert says in problem.message


def test_a_starting_or_running_pod_has_no_problem() -> None:
    """Pending without any report, ContainerCreating, and Running-and-Ready are not problems."""
    assert diagnose(_pod()) is None
    assert (
        diagnose(_pod(containerStatuses=[_cs({"waiting": {"reason": "ContainerCreating"}})]))
        is None
    )
    assert diagnose(_pod("Running", containerStatuses=[_cs({"running": {}})])) is None
