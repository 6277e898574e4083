"""``sandpod template build|get``: build a template from a YAML file or a Dockerfile.

``-f sandpod.yaml`` is a SandboxTemplate (``kind``, ``metadata.name``, ``spec`` with
``spec.build``) whose ``copy`` sources may be local paths, relative to the file's directory;
``--dockerfile`` reads the common Dockerfile subset (:mod:`sandpod.dockerfile`). Both upload
the files, apply the template and print the build's progress until it is Ready; a failed step
exits 125 with the step and the log's tail.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sandpod.cli._output import add_output, dump
from sandpod.cli.sandbox_cmd import pairs, run
from sandpod.dockerfile import parse_dockerfile
from sandpod.errors import BuildFailed, ResourceInvalid
from sandpod.templates import AsyncTemplates, Template, TemplateInfo

__all__ = ["add_parsers", "template_from_yaml"]


def add_parsers(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    common.add_argument("--prefix", help="subject prefix (default: sandpod)")
    common.add_argument("-n", "--namespace", default="default")
    tpl = sub.add_parser("template", help="templates: build, get")
    verbs = tpl.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser("build", parents=[common], help="build a template and wait until Ready")
    p.add_argument("-f", "--file", type=Path, help="a SandboxTemplate YAML (sandpod.yaml)")
    p.add_argument("--dockerfile", type=Path, help="a Dockerfile (the common subset)")
    p.add_argument("-t", "--tag", help="the template's name (default: the context's directory)")
    p.add_argument("--build-arg", action="append", default=[], metavar="K=V")
    p.add_argument("context", nargs="?", type=Path, help="Dockerfile build context (default .)")
    p.add_argument("-q", "--quiet", action="store_true", help="print no build log")
    p.set_defaults(run=lambda a: run(_build(a)))
    p = verbs.add_parser("get", parents=[common], help="show one template (the whole object)")
    p.add_argument("name")
    add_output(p, (), default="json")
    p.set_defaults(run=lambda a: run(_get(a)))


def template_from_yaml(path: Path) -> Template:
    """The SandboxTemplate in ``path`` as a :class:`Template` (local copy sources resolved
    against the file's directory). Raises ResourceInvalid."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or raw.get("kind", "SandboxTemplate") != "SandboxTemplate":
        raise ResourceInvalid(f"{path} is not a SandboxTemplate", field="kind")
    name = str((raw.get("metadata") or {}).get("name", ""))
    spec = dict(raw.get("spec") or {})
    build = spec.pop("build", None)
    if not name or not isinstance(build, dict):
        raise ResourceInvalid(f"{path} needs metadata.name and spec.build", field="spec.build")
    t = Template(name)
    t.spec_extra = spec
    base = build.get("from") or {}
    if "image" in base:
        t.from_image(str(base["image"]))
    elif "template" in base:
        t.from_template(str(base["template"]))
    for i, step in enumerate(build.get("steps") or []):
        _step(t, path.parent, i, step)
    return t


def _step(t: Template, root: Path, index: int, step: Any) -> None:
    if not isinstance(step, dict) or len(step) != 1:
        raise ResourceInvalid("a step is a map with one key", field=f"spec.build.steps[{index}]")
    kind, body = next(iter(step.items()))
    if kind == "copy" and isinstance(body, dict):
        t.copy(root / str(body.get("src", "")), str(body.get("dest", "")))
    elif kind == "env" and isinstance(body, dict):
        t.env({str(k): str(v) for k, v in body.items()})
    elif kind in ("run", "workdir", "user"):
        getattr(t, kind)(str(body))
    else:
        raise ResourceInvalid(f"unknown step {kind!r}", field=f"spec.build.steps[{index}]")


def _template(a: argparse.Namespace) -> Template:
    if (a.file is None) == (a.dockerfile is None):
        raise SystemExit("error: give -f sandpod.yaml or --dockerfile Dockerfile")
    if a.file is not None:
        return template_from_yaml(a.file)
    context = (a.context or Path(".")).resolve()
    parsed = parse_dockerfile(
        a.dockerfile.read_text(),
        a.tag or context.name.lower(),
        context,
        pairs(a.build_arg, "--build-arg"),
    )
    for warning in parsed.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return parsed.template


async def _build(a: argparse.Namespace) -> int:
    template = _template(a)
    async with await AsyncTemplates.connect(
        nats_url=a.nats_url, prefix=a.prefix, namespace=a.namespace
    ) as client:
        try:
            info = await client.build(template, on_log=None if a.quiet else print)
        except BuildFailed as exc:
            tail = str(exc.details.get("log_tail", ""))
            print(f"error: {exc}\n{tail}", file=sys.stderr)
            return 125
    _done(info)
    return 0


def _done(info: TemplateInfo) -> None:
    print(f"template {info.name} is {info.phase} (result {info.result_key[:12]})")


async def _get(a: argparse.Namespace) -> int:
    async with await AsyncTemplates.connect(
        nats_url=a.nats_url, prefix=a.prefix, namespace=a.namespace
    ) as client:
        info = await client.get(a.name)
    print(dump(dict(info.object), a.output))
    return 0
