"""The builder Pod's entry point: ``python3 -m sandpod_lifecycle.builds.podmain``.

Kubernetes mode runs a template's build here, in a Pod the lifecycle made
(``sandpod_kube.buildpod``), with the local runtime's build code:

1. the base the lifecycle pinned (``BuildRequest.base_image``, by digest) is pulled into an
   image store on the Pod's scratch emptyDir and becomes the chain's first cache entry, under
   the key the lifecycle computed (:meth:`Builder._image_base`);
2. :class:`Builder` walks the steps exactly as for a local build -- the same cache keys, the
   same ``copy`` (the tar from the build-context object store, digest-checked), ``workdir``
   and config steps, the same progress lines -- except that a ``run`` step runs in
   :mod:`~sandpod_lifecycle.builds.podjail` (an overlay of the chain, chroot, an
   unprivileged uid) instead of a builder sandbox, and its writable layer goes through the
   same ``commit.commit_upper``;
3. the result is written as an OCI image layout (``export.export_oci``) and pushed with
   ``sandpod_image.pushlayout`` (blobs the registry has are skipped) to
   ``BuildRequest.target``;
4. the outcome (:class:`~sandpod_lifecycle.builds.podwire.BuildOutcome`) is written to
   ``SANDPOD_BUILD_RESULT`` (the container's ``terminationMessagePath``); exit status 0 when
   pushed, 1 otherwise.

Progress and the steps' output are published on the template's build subject
(``builds.events``), as a local build's are. Settings come from the environment once, here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

import structlog

from sandpod_bus import Bus, BusSettings, ObjectBucket
from sandpod_contract.builds import BuildPhase, TemplateBuild
from sandpod_contract.errors import BuildFailed, InternalError, SandpodError
from sandpod_contract.resources import SandboxTemplateSpec
from sandpod_contract.subjects import DEFAULT_PREFIX, Subjects
from sandpod_image.auth import AuthFile, load_auth_file
from sandpod_image.layers import UnpackOptions
from sandpod_image.pushlayout import PushProgress, push_layout
from sandpod_image.reference import parse_reference
from sandpod_image.store import ImageStore
from sandpod_lifecycle.builds import commit
from sandpod_lifecycle.builds.cache import BuildCache
from sandpod_lifecycle.builds.events import publish_build_event
from sandpod_lifecycle.builds.executor import RUN_TIMEOUT, Builder, StepJob, emit_line
from sandpod_lifecycle.builds.export import export_chain, export_oci
from sandpod_lifecycle.builds.podwire import BuildOutcome, BuildRequest, image_tag
from sandpod_lifecycle.builds.results import BuildResult, BuiltRef, Log
from sandpod_lifecycle.runtime.base import RuntimeFailure

__all__ = ["BUILD_UID", "PodBuildSettings", "PodStepBuilder", "main"]

log = structlog.get_logger("sandpod.lifecycle.podbuild")

BUILD_UID = 65532  # the uid run steps run as (no name in any image; the commit gives to root)


@dataclasses.dataclass(frozen=True, slots=True)
class PodBuildSettings:
    """The builder Pod's environment (``sandpod_kube.buildpod`` sets it)."""

    request: BuildRequest
    work: Path
    result: Path
    prefix: str
    nats_url: str
    nats_creds: str | None
    nats_inbox: str | None
    auth_file: Path | None
    insecure: frozenset[str]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodBuildSettings:
        """Raises ValueError naming what is missing or malformed."""
        if not env.get("SANDPOD_BUILD_REQUEST"):
            raise ValueError("SANDPOD_BUILD_REQUEST is not set: this runs in a builder Pod")
        auth = env.get("SANDPOD_BUILD_AUTH_FILE", "").strip()
        return cls(
            request=BuildRequest.from_json(env["SANDPOD_BUILD_REQUEST"]),
            work=Path(env.get("SANDPOD_BUILD_DIR", "/var/lib/sandpod-build")),
            result=Path(env.get("SANDPOD_BUILD_RESULT", "/dev/termination-log")),
            prefix=env.get("SANDPOD_PREFIX", DEFAULT_PREFIX),
            nats_url=env.get("SANDPOD_NATS_URL", "nats://127.0.0.1:4222"),
            nats_creds=env.get("SANDPOD_NATS_CREDS") or None,
            nats_inbox=env.get("SANDPOD_NATS_INBOX_PREFIX") or None,
            auth_file=Path(auth) if auth else None,
            insecure=frozenset(
                h.strip()
                for h in env.get("SANDPOD_INSECURE_REGISTRIES", "").split(",")
                if h.strip()
            ),
        )


class PodStepBuilder(Builder):
    """:class:`Builder` with the lifecycle's pinned base and ``run`` steps in ``podjail``."""

    def __init__(
        self,
        *,
        base_key: str,
        base_image: str,
        cache: BuildCache,
        bus: Bus,
        subjects: Subjects,
        contexts: Callable[[], Awaitable[ObjectBucket]],
        images: ImageStore,
    ) -> None:
        super().__init__(
            cache=cache, driver=None, bus=bus, subjects=subjects, contexts=contexts, images=images
        )
        self._base_key = base_key
        self._base_image = base_image

    async def _base(
        self,
        name: str,
        template: SandboxTemplateSpec,
        build: TemplateBuild,
        template_result: Callable[[str], Awaitable[BuiltRef]],
    ) -> str:
        return await self._image_base(name, self._base_image, key=self._base_key)

    async def _run(self, job: StepJob, fs: Path) -> None:
        scratch = fs.parent
        root, upper, work = (scratch / d for d in ("root", "upper", "work"))
        for d in (root, upper, work):
            d.mkdir(mode=0o755)
        spec = {
            "root": str(root),
            "upper": str(upper),
            "work": str(work),
            "lowers": [str(p) for p in self._lowers(job.parent)],
            "command": job.step.value,
            "cwd": job.config.workdir or "/",
            "env": dict(job.config.env),
            "uid": BUILD_UID,
        }
        proc = await asyncio.create_subprocess_exec(
            *("unshare", "--mount", "--propagation", "private", "--pid", "--fork"),
            *("--kill-child", "--", sys.executable, "-m", "sandpod_lifecycle.builds.podjail"),
            json.dumps(spec),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        tail: list[str] = []
        try:
            async with asyncio.timeout(RUN_TIMEOUT):
                async for line in _lines(proc):
                    await emit_line(line.rstrip(b"\n"), tail, job.emit)
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise job.failed(f"the command ran over {RUN_TIMEOUT:.0f} s", tail=tail) from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if code != 0:
            raise job.failed(f"the command exited with {code}", tail=tail, exit_code=code)
        await commit.commit_upper(upper, fs, uid=BUILD_UID, gid=BUILD_UID, hostname="")


async def _lines(proc: asyncio.subprocess.Process) -> AsyncIterator[bytes]:
    """The step's output, line by line (stdout was asked for as a pipe)."""
    if proc.stdout is None:
        return
    async for line in proc.stdout:
        yield line


def _auth(path: Path | None) -> AuthFile | None:
    return load_auth_file(path) if path is not None else None


async def build_and_push(settings: PodBuildSettings, bus: Bus, emit: Log) -> BuildOutcome:
    """Build the request's template and push it (see the module docstring).

    Raises:
        SandpodError: the build or the push failed (typed; the caller writes the outcome).
    """
    req = settings.request
    build = TemplateBuild.from_dict(req.build)
    if build is None:
        raise InternalError("the build request has no build")
    subjects = Subjects(settings.prefix)
    auth = _auth(settings.auth_file)
    images = ImageStore(
        settings.work / "images",
        auth_file=auth,
        insecure=settings.insecure,
        unpack=UnpackOptions(rootless=os.geteuid() != 0),
    )
    bucket = subjects.storage("build-contexts")
    builder = PodStepBuilder(
        base_key=req.base_key,
        base_image=req.base_image,
        cache=BuildCache(settings.work / "images" / "build"),
        bus=bus,
        subjects=subjects,
        contexts=lambda: bus.objects(bucket),
        images=images,
    )
    builder.steps_before = req.steps_before

    async def never(name: str) -> BuiltRef:  # the base is pinned: no template is asked for
        raise InternalError(f"the builder Pod cannot resolve template {name}")

    result: BuildResult = await builder.build(
        req.template, SandboxTemplateSpec(build=build), never, emit
    )
    if result.key != req.key:
        raise InternalError(
            f"the builder computed result {result.key[:12]}, the lifecycle {req.key[:12]}: "
            "the builder image and the lifecycle run different Sandpod versions"
        )
    repo = parse_reference(req.target).name
    await emit(f"exporting the image ({len(result.layers)} entries)")
    layout = settings.work / "oci"
    keys = await asyncio.to_thread(export_chain, builder.cache, result.key, layout, image_tag)
    if not keys:  # no steps: the image is the base itself
        await asyncio.to_thread(
            export_oci, builder.cache, result.key, layout, ref=image_tag(result.key)
        )
        keys = [result.key]
    lines: list[str] = []

    def progress(p: PushProgress) -> None:
        what = "already there" if p.skipped else "pushed"
        lines.append(f"push {p.kind} {p.digest[:19]}… {p.size / 1e6:.1f} MB {what}")

    uploaded, pushed = 0, None
    for key in keys:  # each step's result: a later build resumes from the longest prefix
        pushed = await push_layout(
            layout,
            image_tag(key),
            f"{repo}:{image_tag(key)}",
            auth_file=auth,
            insecure=settings.insecure,
            progress=progress if key == result.key else None,
        )
        uploaded += pushed.uploaded
    for line in lines:
        await emit(line)
    if pushed is None:  # pragma: no cover - keys is never empty
        raise InternalError("nothing was pushed")
    await emit(f"pushed {pushed.reference} (and {len(keys) - 1} intermediate results)")
    return BuildOutcome(
        ok=True, key=result.key, image=pushed.reference, ran=result.ran, uploaded=uploaded
    )


async def run(settings: PodBuildSettings) -> BuildOutcome:
    """Connect, build, push; the outcome whatever happened (never raises a SandpodError)."""
    name = settings.request.template
    try:
        bus = await Bus.connect(
            BusSettings(
                url=settings.nats_url,
                creds=settings.nats_creds,
                inbox_prefix=settings.nats_inbox,
                name="builder",
            )
        )
    except SandpodError as exc:
        return BuildOutcome.failed(exc)
    subjects = Subjects(settings.prefix)

    async def emit(line: str) -> None:
        await publish_build_event(bus, subjects, name, "build", BuildPhase.BUILDING, "", line)

    try:
        return await build_and_push(settings, bus, emit)
    except SandpodError as exc:
        return BuildOutcome.failed(exc)
    except (RuntimeFailure, OSError) as exc:  # a commit or a disk failure: say it, typed
        return BuildOutcome.failed(BuildFailed(f"the builder failed: {exc}", template=name, step=0))
    finally:
        with contextlib.suppress(SandpodError):
            await bus.flush(2.0)
        await bus.close()


def main() -> int:
    try:
        settings = PodBuildSettings.from_env(os.environ)
    except ValueError as exc:
        print(f"sandpod builder: {exc}", file=sys.stderr)
        return 2
    outcome = asyncio.run(run(settings))
    settings.result.write_text(outcome.to_json())
    print(outcome.to_json(), flush=True)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
