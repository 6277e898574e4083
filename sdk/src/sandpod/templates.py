"""Templates in the SDK: a fluent builder, and applying templates with their builds followed.

    from sandpod.templates import Template
    Template("data").from_template("base").run("pip install pandas") \\
        .copy("./app", "/app").env(MODE="prod").workdir("/app").build(on_log=print)
    sbx = Sandbox.create(template="data")

Data flow of a build: each ``copy`` source is packed into a reproducible tar (sorted names,
owners and times zeroed: the same files give the same digest, hence a cache hit) and uploaded
to the installation's build-context object store under its ``sha256:`` digest, unless already
there; the SandboxTemplate, whose copy steps name those digests, is applied; the lifecycle
builds it and publishes each log line on ``<prefix>.events.template.<name>.build``, which
:meth:`AsyncTemplates.build` subscribed to before applying, and finally a ``built`` or
``build_failed`` event. A failed build raises :class:`~sandpod.errors.BuildFailed` naming the
step, with the log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Self

from sandpod._loop import run
from sandpod._twins import twin
from sandpod.config import (
    resolve_inbox_prefix,
    resolve_nats_creds,
    resolve_nats_url,
    resolve_prefix,
    resolve_tenant,
)
from sandpod.control import api_call
from sandpod.errors import BuildFailed, ResourceInvalid
from sandpod_bus import Bus, BusSettings, Inbound
from sandpod_contract.builds import BuildStatus
from sandpod_contract.codec import decode
from sandpod_contract.messages.sandboxes import ObjectReply, ObjectRequest, Ref, SandboxEvent
from sandpod_contract.resources import API_VERSION
from sandpod_contract.subjects import Subjects

__all__ = ["AsyncTemplates", "Template", "TemplateInfo", "Templates", "pack_context"]

OnLog = Callable[[str], object]
TAIL = 20
POLL = 2.0  # seconds between status reads while following (a lost last event never hangs)


@dataclasses.dataclass(frozen=True, slots=True)
class TemplateInfo:
    name: str
    phase: str | None  # Building / Ready / Failed, None for a template without a build
    result_key: str
    layers: tuple[str, ...]
    object: Mapping[str, Any]
    image: str = ""  # Kubernetes mode: the pushed image of the build, by digest

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> TemplateInfo:
        status = BuildStatus.from_dict(obj.get("status") or {})
        return cls(
            name=str(obj.get("metadata", {}).get("name", "")),
            phase=None if status.phase is None else str(status.phase),
            result_key=status.result_key,
            layers=status.layers,
            object=obj,
            image=status.image,
        )


def pack_context(src: Path, dest: str, into: Path) -> tuple[str, str]:
    """Pack ``src`` (a directory's contents, or one file) into the tar ``into``.

    Returns:
        (the tar's ``sha256:`` digest, the directory the tar unpacks at): a file copied to a
        ``dest`` not ending in ``/`` is named ``dest``; otherwise it keeps its name in ``dest``.
    """
    at, single = dest, None
    if src.is_file() and not dest.endswith("/"):
        at, single = str(PurePosixPath(dest).parent), PurePosixPath(dest).name
    with tarfile.open(into, "w", format=tarfile.PAX_FORMAT) as tar:
        if src.is_dir():
            for path in sorted(src.rglob("*")):
                tar.add(
                    path, arcname=path.relative_to(src).as_posix(), recursive=False, filter=_zero
                )
        else:
            tar.add(src, arcname=single or src.name, recursive=False, filter=_zero)
    h = hashlib.sha256()
    with into.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}", at.rstrip("/") or "/"


def _zero(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.pax_headers = {}
    return info


class Template:
    """A template described step by step; :meth:`build` (or :meth:`abuild`) makes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._from: dict[str, str] = {}
        self._steps: list[dict[str, Any]] = []
        self._copies: list[tuple[int, Path, str]] = []  # step index, local source, dest
        self.spec_extra: dict[str, Any] = {}  # other spec fields (resources, security...)

    def from_image(self, ref: str) -> Self:
        self._from = {"image": ref}
        return self

    def from_template(self, name: str) -> Self:
        self._from = {"template": name}
        return self

    def from_base(self) -> Self:
        """The node's default base (what a template naming nothing runs on)."""
        self._from = {}
        return self

    def run(self, command: str) -> Self:
        self._steps.append({"run": command})
        return self

    def copy(self, src: str | os.PathLike[str], dest: str) -> Self:
        """Copy a local file or directory's contents to ``dest`` (uploaded at build time)."""
        path = Path(src)
        if not path.exists():
            raise ResourceInvalid(f"copy source {path} does not exist", field="copy.src")
        self._copies.append((len(self._steps), path, dest))
        self._steps.append({"copy": {"src": "", "dest": dest}})
        return self

    def env(self, values: Mapping[str, str] | None = None, **more: str) -> Self:
        self._steps.append({"env": {**(values or {}), **more}})
        return self

    def workdir(self, path: str) -> Self:
        self._steps.append({"workdir": path})
        return self

    def user(self, name: str) -> Self:
        self._steps.append({"user": name})
        return self

    def object(self, digests: Mapping[int, tuple[str, str]]) -> dict[str, Any]:
        """The SandboxTemplate, each copy step's source replaced by ``digests[step]``
        (its digest and unpack directory, from :func:`pack_context`)."""
        steps = [dict(s) for s in self._steps]
        for index, (digest, at) in digests.items():
            steps[index] = {"copy": {"src": digest, "dest": at}}
        return {
            "apiVersion": API_VERSION,
            "kind": "SandboxTemplate",
            "metadata": {"name": self.name},
            "spec": {**self.spec_extra, "build": {"from": dict(self._from), "steps": steps}},
        }

    async def abuild(
        self,
        client: AsyncTemplates | None = None,
        *,
        on_log: OnLog | None = None,
        timeout: float = 3600.0,
        nats_url: str | None = None,
        prefix: str | None = None,
    ) -> TemplateInfo:
        """Upload, apply and follow the build until Ready. Raises BuildFailed."""
        if client is not None:
            return await client.build(self, on_log=on_log, timeout=timeout)
        async with await AsyncTemplates.connect(nats_url=nats_url, prefix=prefix) as own:
            return await own.build(self, on_log=on_log, timeout=timeout)

    def build(
        self,
        client: Templates | None = None,
        *,
        on_log: OnLog | None = None,
        timeout: float = 3600.0,
        nats_url: str | None = None,
        prefix: str | None = None,
    ) -> TemplateInfo:
        """Blocking :meth:`abuild`."""
        inner = client._inner if client is not None else None
        return run(
            self.abuild(inner, on_log=on_log, timeout=timeout, nats_url=nats_url, prefix=prefix)
        )


class AsyncTemplates:
    """Template administration over the lifecycle's API, and builds."""

    def __init__(self, bus: Bus, subjects: Subjects, *, owns_bus: bool, namespace: str) -> None:
        self.bus = bus
        self.subjects = subjects
        self.namespace = namespace
        self._owns_bus = owns_bus

    @classmethod
    async def connect(
        cls,
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
        namespace: str = "default",
        bus: Bus | None = None,
    ) -> AsyncTemplates:
        subjects = Subjects(resolve_prefix(prefix), tenant=resolve_tenant())
        if bus is not None:
            return cls(bus, subjects, owns_bus=False, namespace=namespace)
        settings = BusSettings(
            url=resolve_nats_url(nats_url),
            name="sandpod-sdk:templates",
            creds=resolve_nats_creds(),
            inbox_prefix=resolve_inbox_prefix(),
        )
        return cls(await Bus.connect(settings), subjects, owns_bus=True, namespace=namespace)

    async def apply(self, obj: Mapping[str, Any]) -> TemplateInfo:
        obj = {**obj, "metadata": {"namespace": self.namespace, **obj.get("metadata", {})}}
        reply = await api_call(
            self.bus, self.subjects, "templates", "apply", ObjectRequest(object=obj), ObjectReply
        )
        return TemplateInfo.of(reply.object)

    async def get(self, name: str) -> TemplateInfo:
        reply = await api_call(
            self.bus,
            self.subjects,
            "templates",
            "get",
            Ref(name=name, namespace=self.namespace),
            ObjectReply,
        )
        return TemplateInfo.of(reply.object)

    async def upload(self, template: Template) -> dict[int, tuple[str, str]]:
        """Pack and upload every copy source of ``template``; step index -> (digest, dest)."""
        bucket = await self.bus.objects(self.subjects.storage("build-contexts"))
        out: dict[int, tuple[str, str]] = {}
        with tempfile.TemporaryDirectory(prefix="sandpod-context-") as tmp:
            for index, src, dest in template._copies:
                tar = Path(tmp) / f"{index}.tar"
                digest, at = await asyncio.to_thread(pack_context, src, dest, tar)
                if not await bucket.exists(digest):
                    await bucket.put_file(digest, tar)
                out[index] = (digest, at)
        return out

    async def build(
        self, template: Template, *, on_log: OnLog | None = None, timeout: float = 3600.0
    ) -> TemplateInfo:
        """Upload ``template``'s files, apply it and follow its build to the end.

        Raises:
            BuildFailed: a step failed (``details``: template, step, log_tail).
            ResourceInvalid: the template is malformed (the field is named).
        """
        digests = await self.upload(template)
        return await self.apply_and_follow(template.object(digests), on_log=on_log, timeout=timeout)

    async def apply_and_follow(
        self, obj: Mapping[str, Any], *, on_log: OnLog | None = None, timeout: float = 3600.0
    ) -> TemplateInfo:
        """Apply the template ``obj`` (its copy sources already uploaded) and follow its build."""
        name = str(obj["metadata"]["name"])
        done = asyncio.Event()
        tail: list[str] = []

        async def on_event(msg: Inbound) -> None:
            with contextlib.suppress(Exception):  # a foreign message is no reason to stop
                event = decode(SandboxEvent, msg.data)
                if event.type == "build":
                    tail.append(event.message)
                    del tail[:-TAIL]
                    if on_log is not None:
                        on_log(event.message)
                elif event.type in ("built", "build_failed"):
                    done.set()

        sub = await self.bus.subscribe(self.subjects.events_of("template", name), on_event)
        try:
            info = await self.apply(obj)
            async with asyncio.timeout(timeout):
                while not _settled(info):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), POLL)
                    info = await self.get(name)
        finally:
            await sub.stop()
        if info.phase == "Failed":
            raise _failure(info, tail)
        return info

    async def close(self) -> None:
        if self._owns_bus:
            await self.bus.drain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def _settled(info: TemplateInfo) -> bool:
    status = BuildStatus.from_dict(info.object.get("status") or {})
    generation = int(info.object.get("metadata", {}).get("generation", 0))
    if info.object.get("spec", {}).get("build") is None:
        return True
    return status.observed_generation == generation and info.phase in ("Ready", "Failed")


def _failure(info: TemplateInfo, tail: list[str]) -> BuildFailed:
    status = BuildStatus.from_dict(info.object.get("status") or {})
    cond: Mapping[str, Any] = next(
        (c for c in info.object.get("status", {}).get("conditions") or () if c["type"] == "Built"),
        {},
    )
    return BuildFailed(
        str(cond.get("message") or f"the build of {info.name} failed"),
        template=info.name,
        step=status.failed_step or 0,
        log_tail="\n".join(tail),
    )


class Templates:
    """Blocking twin of :class:`AsyncTemplates`."""

    def __init__(self, inner: AsyncTemplates) -> None:
        self._inner = inner

    @classmethod
    def connect(
        cls, *, nats_url: str | None = None, prefix: str | None = None, namespace: str = "default"
    ) -> Templates:
        return cls(
            run(AsyncTemplates.connect(nats_url=nats_url, prefix=prefix, namespace=namespace))
        )

    @property
    def namespace(self) -> str:
        return self._inner.namespace

    apply = twin(AsyncTemplates.apply)
    get = twin(AsyncTemplates.get)
    upload = twin(AsyncTemplates.upload)
    build = twin(AsyncTemplates.build)
    apply_and_follow = twin(AsyncTemplates.apply_and_follow)
    close = twin(AsyncTemplates.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
