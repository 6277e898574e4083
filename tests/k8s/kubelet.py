"""A fake kubelet for the kubelet-less control plane: Pods on the real API server come alive here.

This machine has no nodes. :class:`FakeKubelet` watches the Pods of one namespace on the real
kube-apiserver and does, for each sandbox Pod, what a kubelet would:

    Pod ADDED/MODIFIED, not yet Running -> resolve the container's env (``secretKeyRef`` read from
        the Secret, as the kubelet does), write each Secret volume the container mounts (its
        items, with the volume's ``defaultMode``) into a directory of the Pod's and point env
        values under the mount path there, start that Pod's execd as a local process against
        the test NATS, then PUT ``pods/status``: Running, Ready, a containerStatus. A Secret
        missing at start fails the kubelet (a real one would keep the Pod ContainerCreating).
    Pod DELETED -> stop that execd (SIGTERM, then SIGKILL).

Unscheduled Pods (no ``nodeName``) are deleted at once by the API server, so a DELETED event
follows every delete without grace handling here. ``hold()`` keeps new Pods un-Ready until
``release()``, so a test can see a Sandbox Pending while its Pod exists; ``sync_secret_volumes``
re-reads a Pod's Secrets into its files (a real kubelet's periodic sync); ``run_execd = False``
marks Pods Ready without starting execd (a container that runs but whose execd never answers).

Failures, as a real kubelet/scheduler writes them into ``pods/status``: ``fault`` (one of
:data:`FAULTS`) is applied to every new Pod instead of starting it -- ``unschedulable`` (what
the scheduler writes: PodScheduled=False, Unschedulable, "0/3 nodes are available..."),
``image_pull`` (ImagePullBackOff with the image), ``crash_loop`` (CrashLoopBackOff, last
exit code 1), ``exit`` (the container terminated with exit code 3: phase Failed, as with
``restartPolicy: Never``). :meth:`oom_kill` kills a running Pod's execd and reports it
OOMKilled (exit code 137, phase Failed). ``uids`` records every Pod uid seen per name, so a
test can tell one long-waited Pod from a create/delete storm.
The Pod's ``/workspace`` and ``/tmp`` emptyDirs become directories under the kubelet's state
dir, made afresh for each new Pod (an earlier Pod's of the same name are removed), and so does a
small image filesystem (:data:`IMAGE_FILES`, execd's ``SANDPOD_ROOTFS``): the root filesystem
whose changes a snapshot captures. Commands still run on the host (their ``/`` is the host's).

Builder Pods (label ``sandpod.dev/build``) run what their container spec says: its
``command`` + ``args`` as a host process, ``python3`` being this checkout's interpreter (the
image's interpreter with Sandpod installed, as execd's bundle python is above); its env resolved
as above; every emptyDir and Secret volume it mounts a local directory, and the
``terminationMessagePath`` a local file, env values naming them pointed there. When the process
exits the Pod's status says so as a kubelet writes it: phase Succeeded (exit 0) or Failed, the
container ``terminated`` with its exit code and the termination message file's content. What is
NOT emulated: the image's root filesystem and the container's securityContext (capabilities,
read-only root) -- the process runs as this test's root on the host.

The network guard (a native sidecar ``netguard``: an init container with ``restartPolicy:
Always``): when ``guard_runner`` is set, it is called with the Pod and the guard container's
resolved env before anything else of the Pod starts, and must return once the guard is ready
(its startup probe). The runner gives the guard a network namespace of the Pod's own
(``guard_harness.PodGuards``); execd still runs on the host (no per-Pod netns for it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import os
import shutil
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandpod_contract.errors import ResourceExpired, ResourceNotFound
from sandpod_kube import KubeSettings, PodApi
from sandpod_kube.buildpod import BUILD_LABEL

__all__ = ["FAULTS", "FakeKubelet"]

FAULTS = ("unschedulable", "image_pull", "crash_loop", "exit")
SCHEDULER_MESSAGE = (
    "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are "
    "available: 3 No preemption victims found for incoming pod."
)


# The root filesystem every sandbox Pod's container starts with here: (path, content or None
# for a directory), made before its execd starts (so before any change of the sandbox's).
IMAGE_FILES: tuple[tuple[str, str | None], ...] = (
    ("app", None),
    ("app/readme", "from the image\n"),
    ("app/old", "an image file\n"),
    ("app/lib", None),
    ("app/lib/mod.py", "VALUE = 1\n"),
    ("etc", None),
    ("etc/motd", "welcome\n"),
)
IMAGE_MTIME = 1_700_000_000


def _fresh_pod_files(root: Path) -> None:
    """A new Pod's emptyDirs and image filesystem under ``root``: what an earlier Pod of the
    same name left is gone, as a real kubelet's new Pod starts from nothing."""
    for part in ("workspace", "tmp", "rootfs"):
        shutil.rmtree(root / part, ignore_errors=True)
    (root / "workspace").mkdir(parents=True)
    (root / "tmp").mkdir()
    image = root / "rootfs"
    image.mkdir()
    for rel, content in IMAGE_FILES:
        path = image / rel
        if content is None:
            path.mkdir(0o755)
        else:
            path.write_text(content)
            path.chmod(0o644)
    for rel, _ in reversed(IMAGE_FILES):
        os.utime(image / rel, (IMAGE_MTIME, IMAGE_MTIME), follow_symlinks=False)


def _remap(value: str, mounts: Mapping[str, Path]) -> str:
    """An env value naming a file under a mounted volume, pointed at its local copy."""
    for mount_path, local in mounts.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(local) + value[len(mount_path) :]
    return value


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubelet:
    """Runs the sandbox Pods of ``namespace``; use as ``async with FakeKubelet(...) as k``."""

    def __init__(self, settings: KubeSettings, namespace: str, state: Path) -> None:
        self.settings, self.namespace, self.state = settings, namespace, state
        self.api = PodApi(settings)
        self.execds: dict[str, asyncio.subprocess.Process] = {}  # pod name -> its execd
        self.started: list[str] = []  # pod names, in the order their execd started
        self.stopped: list[str] = []
        self.seen: dict[str, dict[str, Any]] = {}  # pod name -> the Pod as last seen
        self.run_execd = True
        self.fault: str | None = None  # one of FAULTS: what happens to new Pods
        self.execd_env: dict[str, str] = {}  # extra env of every execd started from now on
        self.uids: dict[str, list[str]] = {}  # pod name -> every uid seen, in order
        self.error: Exception | None = None
        self._released = asyncio.Event()
        self._released.set()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.builds: list[dict[str, Any]] = []  # builder Pods started, as they were seen
        self._waiters: dict[str, asyncio.Task[None]] = {}  # builder Pod -> its exit watcher
        # (raw Pod, the guard container's env) -> once the guard is ready; None: not run
        self.guard_runner: Callable[[dict[str, Any], dict[str, str]], Awaitable[None]] | None = None

    def hold(self) -> None:
        """New Pods stay un-Ready (no execd) until :meth:`release`."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def __aenter__(self) -> FakeKubelet:
        self._task = asyncio.create_task(self._run(), name="fake-kubelet")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for name in list(self.execds):
            await self._stop(name)
        for waiter in list(self._waiters.values()):
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        await self.api.close()

    async def until(self, what: str, done: Callable[[], bool], timeout: float = 30) -> None:
        """Wait (on the kubelet's own events) until ``done()``; fail the test after ``timeout``
        seconds, or at once if the kubelet itself failed."""
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: done() or self.error is not None)
        except TimeoutError:
            pytest.fail(f"fake kubelet: no {what} after {timeout}s (pods: {sorted(self.seen)})")
        if self.error is not None:
            pytest.fail(f"fake kubelet failed: {self.error!r}")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _run(self) -> None:
        try:
            await self._serve()
        except Exception as exc:  # surfaced to the test by until()
            self.error = exc
            await self._notify()
            raise

    async def _serve(self) -> None:
        while True:
            try:
                await self._follow()
            except ResourceExpired:  # the API server restarted: re-watch from the current state
                continue  # (as an informer re-lists); Pods already running keep their execd

    async def _follow(self) -> None:
        events = self.api.watch(self.namespace)
        async with contextlib.aclosing(events):
            async for etype, raw in events:
                name = raw["metadata"]["name"]
                if etype == "DELETED":
                    self.seen.pop(name, None)
                    await self._stop(name)
                    await self._notify()
                    continue
                self.seen[name] = raw
                uids = self.uids.setdefault(name, [])
                if raw["metadata"]["uid"] not in uids:
                    uids.append(raw["metadata"]["uid"])
                await self._notify()
                status = raw.get("status") or {}
                if (
                    self.fault is not None
                    and not status.get("containerStatuses")
                    and (status.get("phase", "Pending") == "Pending")
                    and not status.get("conditions")
                ):
                    await self._fail(raw, self.fault)
                    continue
                if (
                    name not in self.execds
                    and status.get("phase", "Pending") == "Pending"
                    and (not status.get("conditions"))
                ):
                    # (a re-created Pod of the same name is Pending again: started afresh)
                    await self._released.wait()
                    await self._start(raw)
                    await self._notify()

    async def _env(self, container: Mapping[str, Any]) -> dict[str, str]:
        """The container's env as the kubelet resolves it (Secrets read from the API server)."""
        out: dict[str, str] = {}
        for var in container.get("env") or []:
            if "valueFrom" not in var:  # the API server drops an empty value
                out[var["name"]] = var.get("value", "")
                continue
            ref = var["valueFrom"]["secretKeyRef"]
            secret = await asyncio.to_thread(self._read_secret, ref["name"])
            out[var["name"]] = base64.b64decode(secret[ref["key"]]).decode()
        return out

    async def _secret_volumes(
        self, raw: Mapping[str, Any], container: Mapping[str, Any], root: Path
    ) -> dict[str, Path]:
        """Write the container's Secret volumes under ``root``; mountPath -> local directory."""
        volumes = {
            v["name"]: v["secret"] for v in raw["spec"].get("volumes") or [] if "secret" in v
        }
        out: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            source = volumes.get(mount["name"])
            if source is None:
                continue
            data = await asyncio.to_thread(self._read_secret, source["secretName"])
            where = root / "volumes" / mount["name"]
            where.mkdir(parents=True, exist_ok=True)
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:  # replaced atomically, as the kubelet swaps its ..data symlink
                path, tmp = where / item["path"], where / f".{item['path']}.new"
                tmp.write_bytes(base64.b64decode(data[item["key"]]))
                tmp.chmod(item.get("mode", source.get("defaultMode", 0o644)))
                tmp.replace(path)
            out[mount["mountPath"]] = where
        return out

    async def sync_secret_volumes(self, name: str) -> None:
        """Rewrite Pod ``name``'s Secret volumes from the API server: what a real kubelet does
        periodically, so a renewed Secret reaches the running container's files."""
        raw = self.seen[name]
        await self._secret_volumes(raw, raw["spec"]["containers"][0], self.state / "pods" / name)

    def _read_secret(self, name: str) -> dict[str, str]:
        with self.settings.api_client() as api_client:
            secret = client.CoreV1Api(api_client).read_namespaced_secret(name, self.namespace)
            # the client types data as bytes | str; the API sends base64 text
            return {
                k: v if isinstance(v, str) else v.decode() for k, v in (secret.data or {}).items()
            }

    async def _start(self, raw: dict[str, Any]) -> None:
        name = raw["metadata"]["name"]
        if BUILD_LABEL in (raw["metadata"].get("labels") or {}):
            await self._start_build(raw)
            return
        guards = [
            c for c in raw["spec"].get("initContainers") or [] if c.get("restartPolicy") == "Always"
        ]
        if guards and self.guard_runner is not None:  # a sidecar starts (and is ready) first
            await self.guard_runner(raw, await self._env(guards[0]))
        if not self.run_execd:
            await self._mark_running(raw)
            return
        container = raw["spec"]["containers"][0]
        root = self.state / "pods" / name
        await asyncio.to_thread(_fresh_pod_files, root)
        mounts = await self._secret_volumes(raw, container, root)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDPOD_")},
            **{k: _remap(v, mounts) for k, v in (await self._env(container)).items()},
            "SANDPOD_WORKSPACE": str(root / "workspace"),  # the Pod's emptyDirs, here
            "SANDPOD_STATE_DIR": str(root / "tmp"),
            "SANDPOD_ROOTFS": str(root / "rootfs"),  # the image's files, here
            **self.execd_env,
        }
        with (root / "execd.log").open("ab") as log:
            # The bundle runs `python3 -m sandpod_execd`: here, the same module from this checkout.
            self.execds[name] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sandpod_execd",
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        self.started.append(name)
        await self._mark_running(raw)

    async def _start_build(self, raw: dict[str, Any]) -> None:
        """Run a builder Pod's container command (see the module docstring)."""
        name = raw["metadata"]["name"]
        container = raw["spec"]["containers"][0]
        root = self.state / "pods" / name
        empty = {v["name"] for v in raw["spec"].get("volumes") or [] if "emptyDir" in v}
        mounts = await self._secret_volumes(raw, container, root)
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in empty:
                local = root / "volumes" / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
                mounts[mount["mountPath"]] = local
        message = root / "termination-log"
        message.touch()
        mounts[container.get("terminationMessagePath", "/dev/termination-log")] = message
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDPOD_")},
            **{k: _remap(v, mounts) for k, v in (await self._env(container)).items()},
        }
        argv = [*container.get("command", []), *container.get("args", [])]
        # The image's python3 is Sandpod's: here, this checkout's interpreter.
        argv = [sys.executable if argv[0] == "python3" else argv[0], *argv[1:]]
        with (root / "build.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )
        self.execds[name] = proc
        self.started.append(name)
        self.builds.append(raw)
        await self._mark_running(raw)
        self._waiters[name] = asyncio.create_task(
            self._finish_build(raw, proc, message), name=f"fake-kubelet-build-{name}"
        )

    async def _finish_build(
        self, raw: dict[str, Any], proc: asyncio.subprocess.Process, message: Path
    ) -> None:
        """When the builder's process exits: the status a kubelet writes for it."""
        code = await proc.wait()
        name = raw["metadata"]["name"]
        self._waiters.pop(name, None)
        if self.execds.get(name) is proc:
            del self.execds[name]
        now = _now()
        container = raw["spec"]["containers"][0]
        try:
            current = await asyncio.to_thread(self._read_pod, name)
        except client.exceptions.ApiException:  # deleted meanwhile: nothing to report
            return
        if current["metadata"]["uid"] != raw["metadata"]["uid"]:
            return
        reason = "Completed" if code == 0 else "Error"
        current["status"].update(
            _terminated(container, code, reason, now, message.read_text()[:4096])
        )
        with contextlib.suppress(ResourceNotFound):
            await self.api.replace_status(self.namespace, name, current)
        await self._notify()

    async def _mark_running(self, raw: dict[str, Any]) -> None:
        now = _now()
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        container = raw["spec"]["containers"][0]
        raw["status"] = {
            "phase": "Running",
            "conditions": conditions,
            "startTime": now,
            "podIP": "10.244.0.10",
            "hostIP": "127.0.0.1",
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
        await self.api.replace_status(self.namespace, raw["metadata"]["name"], raw)

    async def _fail(self, raw: dict[str, Any], fault: str) -> None:
        """Write what a scheduler/kubelet writes when the Pod cannot start."""
        now = _now()
        container = raw["spec"]["containers"][0]
        cs: dict[str, Any] = {
            "name": container["name"],
            "image": container["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
        }
        status: dict[str, Any] = {"phase": "Pending", "startTime": now, "hostIP": "127.0.0.1"}
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
        if fault == "unschedulable":
            status = {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": SCHEDULER_MESSAGE,
                        "lastTransitionTime": now,
                    }
                ],
            }
        elif fault == "image_pull":
            cs["state"] = {
                "waiting": {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{container["image"]}"',
                }
            }
            status.update(conditions=[scheduled], containerStatuses=[cs])
        elif fault == "crash_loop":
            cs.update(
                restartCount=5,
                state={
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off 2m40s restarting failed container",
                    }
                },
                lastState={
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            )
            status.update(conditions=[scheduled], containerStatuses=[cs])
        elif fault == "exit":
            cs["state"] = {
                "terminated": {
                    "exitCode": 3,
                    "reason": "Error",
                    "startedAt": now,
                    "finishedAt": now,
                }
            }
            status.update(phase="Failed", conditions=[scheduled], containerStatuses=[cs])
        else:
            raise ValueError(f"unknown fault {fault!r}: one of {FAULTS}")
        raw["status"] = status
        await self.api.replace_status(self.namespace, raw["metadata"]["name"], raw)

    async def oom_kill(self, name: str) -> None:
        """The kernel OOM-kills the running Pod's container: execd dies, the Pod fails."""
        proc = self.execds.get(name)
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        now = _now()
        raw = await asyncio.to_thread(self._read_pod, name)
        container = raw["spec"]["containers"][0]
        raw["status"].update(_terminated(container, 137, "OOMKilled", now))
        await self.api.replace_status(self.namespace, name, raw)

    def _read_pod(self, name: str) -> dict[str, Any]:
        with self.settings.api_client() as api_client:
            pod = client.CoreV1Api(api_client).read_namespaced_pod(name, self.namespace)
            result: dict[str, Any] = api_client.sanitize_for_serialization(pod)
            return result

    async def _stop(self, name: str) -> None:
        proc = self.execds.pop(name, None)
        if proc is None:
            return
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.stopped.append(name)


def _terminated(
    container: dict[str, Any], code: int, reason: str, now: str, message: str | None = None
) -> dict[str, Any]:
    """The status fields of a Pod whose only container ended with ``code`` (``reason``, as the
    kubelet says it): phase, conditions (not Ready) and the container's terminated state."""
    state: dict[str, Any] = {
        "exitCode": code,
        "reason": reason,
        "startedAt": now,
        "finishedAt": now,
    }
    if message is not None:
        state["message"] = message
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": [
            {
                "type": t,
                "status": "False" if t in ("Ready", "ContainersReady") else "True",
                "lastTransitionTime": now,
            }
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"terminated": state},
            }
        ],
    }
