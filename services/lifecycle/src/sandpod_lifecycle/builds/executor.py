"""Run one template's build, step by step, through the cache.

Data flow: the base becomes the chain's first key (:func:`cache.base_key`); for each step the
key ``sha256(parent, step)`` is looked up, and only a miss does work:

- ``env`` / ``user``: a layer-less entry with the new config;
- ``workdir``: a tiny layer holding the directory (so later ``run`` steps can write there);
- ``copy``: the client's tar, fetched by its digest from the build-context object store and
  checked against it, is unpacked into a new layer at ``dest`` (``commit.unpack_tar``);
- ``run``: a *builder sandbox* -- an instance made by the same runtime driver as every
  sandbox, from the template's own resources and security, its root the chain so far --
  runs the command (``sh -c``, in the step's workdir, with its env) as the sandbox's user,
  streaming its output over the bus (``sandpod_client.ExecStream``, the protocol every client
  uses: the builder is entered exactly as any sandbox is, no side door); the builder is then
  paused (its processes frozen, so the layer is consistent) and its writable layer committed
  (``commit.commit_upper``); the builder is destroyed whatever happened.

Progress goes to ``log`` (the loop publishes it on the template's build subject):
``step 3/7 run pip install … (cached)``. Only one build runs at a time on a node (builds are
heavy, and it keeps the builder's identity unshared).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import shutil
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from sandpod_bus import Bus, ObjectBucket
from sandpod_client import Channel, ExecStream
from sandpod_contract.builds import BuildStep, TemplateBuild
from sandpod_contract.errors import (
    BuildFailed,
    BuildUnsupported,
    ImageAuthFailed,
    ImageError,
    ResourceNotFound,
)
from sandpod_contract.messages.exec import ExecExit
from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_contract.subjects import Subjects
from sandpod_image.store import ImageStore
from sandpod_lifecycle.builds import commit
from sandpod_lifecycle.builds.cache import BuildCache, ImageConfig, LayerMeta, base_key, step_key
from sandpod_lifecycle.builds.results import BuildOwner, BuildResult, BuiltRef, Log
from sandpod_lifecycle.runtime.base import RuntimeFailure
from sandpod_lifecycle.runtime.local_driver import LocalDriver

__all__ = ["Builder", "StepJob", "emit_line"]

log = structlog.get_logger("sandpod.lifecycle.builds")

TAIL_LINES = 20
RUN_TIMEOUT = 3600.0  # seconds a run step may take
START_RETRY = 0.2  # seconds between attempts to create a builder after a passing failure


class Builder:
    """Builds templates on this node (see the module's docstring)."""

    # Steps of the template before the ``build.steps`` given, already built (a builder Pod
    # resuming from a cached prefix): step numbers in logs and failures stay the template's.
    steps_before = 0

    def __init__(
        self,
        *,
        cache: BuildCache,
        driver: LocalDriver | None,
        bus: Bus,
        subjects: Subjects,
        contexts: Callable[[], Awaitable[ObjectBucket]],
        ready: Callable[[str, float], Awaitable[bool]] | None = None,
        default_rootfs: Path | None = None,
        ready_timeout: float = 30.0,
        images: ImageStore | None = None,
    ) -> None:
        self.cache = cache
        self._driver = driver
        self._bus = bus
        self._subjects = subjects
        self._contexts = contexts
        self._ready = ready
        self._default_rootfs = default_rootfs
        self._images = images  # the node's image store: ``from: {image}`` bases
        self._ready_timeout = ready_timeout
        self._one = asyncio.Lock()
        self.builders: set[str] = set()  # live builder ids (the reconciler leaves them alone)
        self.builders_made = 0  # builder sandboxes created (tests count them)

    def live(self) -> set[str]:
        """Ids of the builder sandboxes running now (no Sandbox object: not orphans)."""
        return set(self.builders)

    async def build(
        self,
        name: str,
        template: SandboxTemplateSpec,
        template_result: Callable[[str], Awaitable[BuiltRef]],
        emit: Log,
        owner: BuildOwner | None = None,  # Kubernetes mode's (builds.kube); unused here
    ) -> BuildResult:
        """Build ``template`` (its ``build`` set); ``template_result(name)`` is another
        template's result (for ``from: {template}``).

        Raises:
            BuildFailed: a step failed (details name it; the log tail says why).
            BuildUnsupported: the base cannot be built here (an image, without an image store).
            SandpodError: the store, the bus or the runtime failed (retry later).
        """
        build = template.build
        if build is None:
            raise BuildUnsupported("the template has no build", what="build")
        async with self._one:
            parent = await self._base(name, template, build, template_result)
            config = self._config(parent)
            keys, ran = [parent], 0
            total = len(build.steps) + self.steps_before
            for i, step in enumerate(build.steps, 1 + self.steps_before):
                key = step_key(parent, step)
                head = f"step {i}/{total} {step.describe()}"
                if self.cache.get(key) is not None:
                    await emit(f"{head} (cached)")
                else:
                    await emit(f"{head} (running)")
                    started = time.monotonic()
                    await self._step(StepJob(name, template, i, step, parent, key, config, emit))
                    ran += 1
                    await emit(f"{head} (done in {time.monotonic() - started:.1f} s)")
                config = config.apply(step)
                parent = key
                keys.append(key)
            return BuildResult(key=parent, layers=tuple(keys), ran=ran)

    def _config(self, key: str) -> ImageConfig:
        meta = self.cache.get(key)
        return meta.config if meta is not None else ImageConfig()

    async def _base(
        self,
        name: str,
        template: SandboxTemplateSpec,
        build: TemplateBuild,
        template_result: Callable[[str], Awaitable[BuiltRef]],
    ) -> str:
        if build.base.template is not None:
            key = (await template_result(build.base.template)).key
            self.cache.chain(key)  # its entries must all be here (ResourceNotFound)
            return key
        if build.base.image is not None:
            return await self._image_base(name, build.base.image)
        return self._default_base(template)

    async def forget(self, name: str) -> None:
        """Template ``name`` is gone: release its hold on its base image (idempotent)."""
        if self._images is not None:
            await asyncio.to_thread(self._images.release, f"template-{name}")

    async def _image_base(self, name: str, ref: str, key: str | None = None) -> str:
        """The key of image ``ref`` as a base: its manifest digest (a re-pushed tag is a new
        base, so everything above rebuilds). Pulled every build (only the manifest is fetched
        when the layers are here); the template holds the image in the store (one use record
        per template, overwritten by a rebuild), so GC keeps the layers its chain stacks."""
        if self._images is None:
            raise BuildUnsupported(
                f"building from an image ({ref}) needs the node's image store",
                what="from.image",
            )
        try:
            image = await self._images.pull(ref)
        except ImageAuthFailed as exc:  # stays typed: the credentials are what to fix
            raise ImageAuthFailed(
                f"cannot pull the base image {ref}: {exc.message}",
                **{**exc.details, "template": name, "step": 0},
            ) from exc
        except ImageError as exc:
            raise BuildFailed(
                f"cannot pull the base image {ref}: {exc}",
                template=name,
                step=0,  # the base, before the first step
                instruction=f"from image {ref}",
            ) from exc
        await asyncio.to_thread(self._images.use, f"template-{name}", image)
        key = key or base_key({"image": image.digest})
        if self.cache.get(key) is None:
            conf = image.config
            self.cache.put(
                LayerMeta(
                    key=key,
                    parent="",
                    kind="image",
                    description=f"image {image.reference}@{image.digest}",
                    has_fs=False,
                    config=ImageConfig(
                        env=tuple(sorted(dict(conf.env).items())),
                        workdir=conf.workdir or "",
                        user=conf.user or "",
                    ),
                    image_layers=tuple(str(p) for p in image.layers),
                    image=f"{image.reference}@{image.digest}",
                )
            )
        return key

    def _default_base(self, template: SandboxTemplateSpec) -> str:
        """The key of the template's ``rootfs`` (else the node's default base) as a base."""
        rootfs = template.rootfs or (str(self._default_rootfs) if self._default_rootfs else "/")
        if Path(rootfs).resolve() == Path("/"):
            # overlayfs refuses a lower layer below another (every layer is below /): and a
            # host-root image would be the host's files, the thing a built template avoids.
            raise BuildUnsupported(
                "a build cannot stack layers on the host root: give the template a base "
                "(spec.rootfs, a built template, or the node's default base "
                "SANDPOD_DEFAULT_ROOTFS)",
                what="from",
            )
        key = base_key({"rootfs": rootfs})
        if self.cache.get(key) is None:
            self.cache.put(
                LayerMeta(
                    key=key,
                    parent="",
                    kind="base",
                    description=f"base {rootfs}",
                    has_fs=False,
                    config=ImageConfig(),
                    rootfs=rootfs,
                )
            )
        return key

    async def _step(self, job: StepJob) -> None:
        scratch = self.cache.scratch(job.key)
        fs: Path | None = scratch / "fs"
        try:
            if job.step.kind == "run":
                await self._run(job, scratch / "fs")
            elif job.step.kind == "copy":
                await self._copy(job, scratch, self._lowers(job.parent))
            elif job.step.kind == "workdir":
                commit.workdir_layer(scratch / "fs", job.step.value, self._lowers(job.parent))
            else:
                fs = None
            self.cache.put(
                LayerMeta(
                    key=job.key,
                    parent=job.parent,
                    kind=job.step.kind,
                    description=job.step.describe(),
                    has_fs=fs is not None,
                    config=job.config.apply(job.step),
                ),
                fs,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _lowers(self, parent: str) -> list[Path]:
        """The directories below a new layer on ``parent``, top first (the base last)."""
        chain = self.cache.chain(parent)
        return [*reversed(chain.layers), *([chain.rootfs] if chain.rootfs else [])]

    async def _copy(self, job: StepJob, scratch: Path, lowers: list[Path]) -> None:
        src, tar = job.step.src, scratch / "context.tar"
        try:
            await (await self._contexts()).get_file(src, tar)
        except ResourceNotFound as exc:
            raise job.failed(f"the files {src} were not uploaded") from exc
        digest = await asyncio.to_thread(_sha256, tar)
        if digest != src:
            raise job.failed(f"the uploaded files hash to {digest}, not {src}")
        try:
            await asyncio.to_thread(commit.unpack_tar, tar, scratch / "fs", job.step.dest, lowers)
        except (tarfile.TarError, OSError) as exc:
            raise job.failed(f"the uploaded tar was refused: {exc}") from exc

    async def _run(self, job: StepJob, fs: Path) -> None:
        driver, ready = self._driver, self._ready
        if driver is None or ready is None:
            raise BuildUnsupported("run steps need a runtime driver here", what="run")
        sid = f"build-{job.parent[:8]}-{job.key[:8]}"
        builder = _builder_template(job.template, job.parent)
        self.builders.add(sid)
        try:
            await self._start_builder(driver, job, sid, builder)
            self.builders_made += 1
            if not await ready(sid, self._ready_timeout):
                raise job.failed("the builder sandbox did not become ready")
            tail = await self._exec(job, sid)
            await driver.pause(sid)  # frozen: nothing writes while the layer is copied
            upper, uid, gid = await driver.writable_layer(sid)
            await commit.commit_upper(upper, fs, uid=uid, gid=gid, hostname=sid)
            log.info("build_step_committed", template=job.name, step=job.index, lines=len(tail))
        finally:
            with contextlib.suppress(Exception):
                await driver.destroy(sid)
            self.builders.discard(sid)

    async def _start_builder(
        self, driver: LocalDriver, job: StepJob, sid: str, builder: SandboxTemplateSpec
    ) -> None:
        """Create the builder as the reconciler creates a sandbox: a passing failure (the node
        execd still starting) is tried again for a while; any other is the build's failure
        (a base it cannot run on)."""
        deadline = time.monotonic() + self._ready_timeout
        while True:
            try:
                await driver.ensure(sid, SandboxSpec(), builder)
                return
            except RuntimeFailure as exc:
                if not exc.retryable or time.monotonic() > deadline:
                    raise job.failed(f"no builder sandbox: {exc.message}") from exc
                log.info("builder_create_retry", sandbox=sid, error=exc.message)
            await asyncio.sleep(START_RETRY)

    async def _exec(self, job: StepJob, sid: str) -> list[str]:
        stream = ExecStream(
            Channel(self._bus, self._subjects, sid),
            shell=job.step.value,
            cwd=job.config.workdir or "/",
            env=dict(job.config.env),
            timeout=RUN_TIMEOUT,
        )
        tail: list[str] = []
        pending = b""
        try:
            async for frame in stream.frames():
                if isinstance(frame, ExecExit):
                    break
                pending += frame.data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    await emit_line(line, tail, job.emit)
        finally:
            await stream.close()
        if pending:
            await emit_line(pending, tail, job.emit)
        end = stream.exit
        if end is None or end.exit_code != 0:
            code = None if end is None else end.exit_code
            why = f"exited with {code}" if code is not None else "was killed"
            raise job.failed(f"the command {why}", tail=tail, exit_code=code)
        return tail


@dataclasses.dataclass(frozen=True, slots=True)
class StepJob:
    """One uncached step of one build: what it runs on and where its progress goes."""

    name: str
    template: SandboxTemplateSpec
    index: int
    step: BuildStep
    parent: str
    key: str
    config: ImageConfig
    emit: Log

    def failed(
        self, why: str, *, tail: list[str] | None = None, exit_code: int | None = None
    ) -> BuildFailed:
        details: dict[str, object] = {
            "template": self.name,
            "step": self.index,
            "instruction": self.step.describe(),
            "log_tail": "\n".join(tail or []),
        }
        if exit_code is not None:
            details["exit_code"] = exit_code
        return BuildFailed(f"step {self.index} ({self.step.describe()}) failed: {why}", **details)


async def emit_line(raw: bytes, tail: list[str], emit: Log) -> None:
    text = raw.decode(errors="replace").rstrip("\r")
    tail.append(text)
    del tail[:-TAIL_LINES]
    await emit(f"  | {text}")


def _builder_template(template: SandboxTemplateSpec, parent: str) -> SandboxTemplateSpec:
    """The builder's template: the template's own isolation and limits, its root the chain
    ``parent``, no env of its own (the step's config env is passed per command)."""
    base = template.build or TemplateBuild()
    return dataclasses.replace(
        template, env=(), build=dataclasses.replace(base, result=parent), rootfs=None
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"
