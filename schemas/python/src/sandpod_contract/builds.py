"""``SandboxTemplate.spec.build`` and its ``status``: how a template is built, and how it went.

A build is a base (``from``: an image reference, another template, or ``{}`` for the node's
default base) plus ordered steps. Each step is a one-key map: ``run`` (a shell command),
``copy`` (``{src: sha256:<digest of an uploaded tar>, dest: /abs}``), ``env`` (a map),
``workdir`` (an absolute path) or ``user`` (a name). ``canonical()`` gives each step's stable
JSON, the input of the build cache's keys (the lifecycle's ``builds.cache``), so two clients
writing the same step in different key orders share a layer.

The status mirrors the build: ``phase`` (Building / Ready / Failed), ``resultKey`` (the cache
key of the last step: a changed build has a new one, so warm pools of the template roll),
``layers`` (the keys of the chain, bottom first), ``image`` (Kubernetes mode: the pushed OCI
image, ``registry/repo@sha256:...``, which the template's sandbox Pods run) and the ``Built``
condition.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid

__all__ = [
    "BUILT",
    "BuildBase",
    "BuildPhase",
    "BuildStatus",
    "BuildStep",
    "TemplateBuild",
]

BUILT = "Built"  # the condition type of a template's build
STEP_KINDS = ("run", "copy", "env", "workdir", "user")
MAX_STEPS = 128
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}|[0-9]{1,10}")
_TEMPLATE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class BuildPhase(enum.StrEnum):
    BUILDING = "Building"
    READY = "Ready"
    FAILED = "Failed"


def _fail(field: str, why: str) -> ResourceInvalid:
    return ResourceInvalid(f"{field}: {why}", field=field)


def _path(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise _fail(field, "must be an absolute path")
    if any(part == ".." for part in value.split("/")):
        raise _fail(field, "must not contain '..'")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class BuildBase:
    """``from``: exactly one of ``image`` and ``template``, or neither (the default base)."""

    image: str | None = None
    template: str | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> BuildBase:
        field = "spec.build.from"
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping) or set(raw) - {"image", "template"}:
            raise _fail(field, "must be {image: ref}, {template: name} or {}")
        if "image" in raw and "template" in raw:
            raise _fail(field, "names an image or a template, not both")
        image, template = raw.get("image"), raw.get("template")
        if image is not None and (not isinstance(image, str) or not image.strip()):
            raise _fail(f"{field}.image", "must be an image reference")
        if template is not None and (
            not isinstance(template, str) or not _TEMPLATE.fullmatch(template)
        ):
            raise _fail(f"{field}.template", "must be a template name (a DNS label)")
        return cls(image=image, template=template)

    def to_dict(self) -> dict[str, str]:
        if self.image is not None:
            return {"image": self.image}
        return {"template": self.template} if self.template is not None else {}


@dataclasses.dataclass(frozen=True, slots=True)
class BuildStep:
    """One step: ``kind`` in :data:`STEP_KINDS`; ``value`` the command, path or user; ``src``
    and ``dest`` for copy; ``env`` for env."""

    kind: str
    value: str = ""
    src: str = ""
    dest: str = ""
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_dict(cls, field: str, raw: Any) -> BuildStep:
        if not isinstance(raw, Mapping) or len(raw) != 1 or next(iter(raw)) not in STEP_KINDS:
            raise _fail(field, f"must be a map with one key of {', '.join(STEP_KINDS)}")
        kind, body = next(iter(raw.items()))
        if kind == "run":
            if not isinstance(body, str) or not body.strip():
                raise _fail(f"{field}.run", "must be a non-empty command")
            return cls("run", value=body)
        if kind == "copy":
            if not isinstance(body, Mapping) or set(body) != {"src", "dest"}:
                raise _fail(f"{field}.copy", "must be {src: sha256:<digest>, dest: /path}")
            if not isinstance(body["src"], str) or not _DIGEST.fullmatch(body["src"]):
                raise _fail(f"{field}.copy.src", "must be the sha256 digest of an uploaded tar")
            return cls("copy", src=body["src"], dest=_path(f"{field}.copy.dest", body["dest"]))
        if kind == "env":
            return cls("env", env=_env(f"{field}.env", body))
        if kind == "workdir":
            return cls("workdir", value=_path(f"{field}.workdir", body))
        if not isinstance(body, str) or not _USER.fullmatch(body):
            raise _fail(f"{field}.user", "must be a user name or a numeric uid")
        return cls("user", value=body)

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "copy":
            return {"copy": {"src": self.src, "dest": self.dest}}
        if self.kind == "env":
            return {"env": dict(self.env)}
        return {self.kind: self.value}

    def canonical(self) -> str:
        """The step's stable JSON (sorted keys, no spaces): what its cache key hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def changes_files(self) -> bool:
        """run and copy make a layer; env, workdir and user only change the config."""
        return self.kind in ("run", "copy")

    def describe(self) -> str:
        """One line for build logs: ``run pip install …``."""
        if self.kind == "copy":
            return f"copy {self.src[:19]}… {self.dest}"
        if self.kind == "env":
            return "env " + " ".join(f"{k}={v}" for k, v in self.env)
        text = self.value if len(self.value) <= 60 else self.value[:59] + "…"
        return f"{self.kind} {text}"


def _env(field: str, raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping) or not raw:
        raise _fail(field, "must be a non-empty map of NAME: value")
    for key, value in raw.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise _fail(f"{field}.{key}", "must be an environment variable name")
        if not isinstance(value, str) or "\0" in value:
            raise _fail(f"{field}.{key}", "must be a string")
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


@dataclasses.dataclass(frozen=True, slots=True)
class TemplateBuild:
    base: BuildBase = dataclasses.field(default_factory=BuildBase)  # wire: from
    steps: tuple[BuildStep, ...] = ()
    # Never on the wire: the lifecycle fills it from the template's status (the built result
    # a sandbox's runtime stacks); "" while the template is not built.
    result: str = dataclasses.field(default="", compare=False)
    # Never on the wire either: Kubernetes mode's pushed image of that result (by digest).
    image: str = dataclasses.field(default="", compare=False)

    @classmethod
    def from_dict(cls, raw: Any) -> TemplateBuild | None:
        """Validate ``spec.build`` (None when absent). Raises ResourceInvalid naming the field."""
        if raw is None:
            return None
        if not isinstance(raw, Mapping) or set(raw) - {"from", "steps"}:
            raise _fail("spec.build", "must be {from: ..., steps: [...]}")
        steps = raw.get("steps") or []
        if not isinstance(steps, list):
            raise _fail("spec.build.steps", "must be a list")
        if len(steps) > MAX_STEPS:
            raise _fail("spec.build.steps", f"at most {MAX_STEPS} steps")
        return cls(
            base=BuildBase.from_dict(raw.get("from")),
            steps=tuple(
                BuildStep.from_dict(f"spec.build.steps[{i}]", s) for i, s in enumerate(steps)
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.base.to_dict(), "steps": [s.to_dict() for s in self.steps]}


@dataclasses.dataclass(frozen=True, slots=True)
class BuildStatus:
    """The build part of a template's ``status`` (the conditions are the status's own)."""

    phase: BuildPhase | None = None
    result_key: str = ""
    layers: tuple[str, ...] = ()
    observed_generation: int = 0
    failed_step: int | None = None  # 1-based, when phase is Failed
    image: str = ""  # Kubernetes mode: the pushed image of the result, by digest

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BuildStatus:
        phase = raw.get("phase")
        failed = raw.get("failedStep")
        return cls(
            phase=BuildPhase(phase) if phase in set(BuildPhase) else None,
            result_key=str(raw.get("resultKey", "")),
            layers=tuple(str(x) for x in raw.get("layers") or ()),
            observed_generation=int(raw.get("observedGeneration", 0)),
            failed_step=None if failed is None else int(failed),
            image=str(raw.get("image", "")),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "resultKey": self.result_key,
            "layers": list(self.layers),
            "observedGeneration": self.observed_generation,
        }
        if self.phase is not None:
            out["phase"] = str(self.phase)
        if self.failed_step is not None:
            out["failedStep"] = self.failed_step
        if self.image:
            out["image"] = self.image
        return out
