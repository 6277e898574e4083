"""The common Dockerfile subset, read into a :class:`~sandpod.templates.Template`.

Data flow: the text is split into logical lines (comments and blank lines dropped, ``\\``
continuations joined, comment lines inside a continuation skipped as Docker does), each line
into an instruction and its arguments, and each supported instruction becomes template steps:

- ``FROM ref``: an image; ``FROM template:NAME`` a Sandpod template, ``FROM default`` the
  node's default base; ``FROM … AS`` (multi-stage) is refused;
- ``RUN`` (shell form, and exec form as a quoted command line); the ``ARG`` values in force
  are exported to it, as Docker passes them in the command's environment;
- ``COPY`` / ``ADD`` of local files and directories of the context (globs expanded; a source
  leaving the context is refused); relative destinations join the ``WORKDIR``;
- ``ENV`` (``K=V …`` and the legacy ``K V``), ``WORKDIR``, ``USER``, ``ARG`` with defaults,
  overridden by ``--build-arg``; ``$VAR``/``${VAR}``/``${VAR:-default}`` substitution in the
  instructions Docker substitutes in.

Harmless metadata (``EXPOSE``, ``LABEL``, ``MAINTAINER``, ``CMD``, ``ENTRYPOINT``, ``STOPSIGNAL``)
is ignored with a warning (a sandbox runs what its agent asks, not an image command). Anything
else (``HEALTHCHECK``, ``ONBUILD``, ``SHELL``, ``VOLUME``, ``COPY --from``, ``--chown``, ``ADD``
of a URL or an archive) is :class:`~sandpod.errors.BuildUnsupported` naming it and its line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from sandpod.errors import BuildUnsupported, ResourceInvalid
from sandpod.templates import Template

__all__ = ["Parsed", "parse_dockerfile"]

IGNORED = ("EXPOSE", "LABEL", "MAINTAINER", "CMD", "ENTRYPOINT", "STOPSIGNAL")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclasses.dataclass(frozen=True, slots=True)
class Parsed:
    template: Template
    warnings: tuple[str, ...]


@dataclasses.dataclass(slots=True)
class _State:
    template: Template
    context: Path
    build_args: Mapping[str, str]
    args: dict[str, str] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    workdir: str = "/"
    seen_from: bool = False
    warnings: list[str] = dataclasses.field(default_factory=list)


def parse_dockerfile(
    text: str, name: str, context: Path, build_args: Mapping[str, str] | None = None
) -> Parsed:
    """Read ``text`` into template ``name``; ``COPY`` sources are relative to ``context``.

    Raises:
        BuildUnsupported: an instruction (or form of one) outside the subset; details name
            it (``what``) and its ``line``.
        ResourceInvalid: a malformed instruction (``field`` is ``Dockerfile:<line>``).
    """
    state = _State(Template(name), context.resolve(), dict(build_args or {}))
    for line, instruction, rest in _logical_lines(text):
        _apply(state, line, instruction, rest)
    if not state.seen_from:
        raise ResourceInvalid("the Dockerfile has no FROM", field="Dockerfile")
    return Parsed(state.template, tuple(state.warnings))


def _logical_lines(text: str) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not parts):
            continue
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1])
            continue
        parts.append(stripped)
        joined = " ".join(p.strip() for p in parts if p.strip())
        parts = []
        instruction, _, rest = joined.partition(" ")
        out.append((start, instruction.upper(), rest.strip()))
    if parts:
        joined = " ".join(p.strip() for p in parts if p.strip())
        instruction, _, rest = joined.partition(" ")
        out.append((start, instruction.upper(), rest.strip()))
    return out


def _unsupported(what: str, line: int, why: str) -> BuildUnsupported:
    return BuildUnsupported(
        f"Dockerfile line {line}: {what} is not supported: {why}", what=what, line=line
    )


def _invalid(line: int, why: str) -> ResourceInvalid:
    return ResourceInvalid(f"Dockerfile line {line}: {why}", field=f"Dockerfile:{line}")


def _subst(state: _State, value: str) -> str:
    scope = {**state.args, **state.env}

    def one(m: re.Match[str]) -> str:
        key = m.group(1) or m.group(3)
        default = m.group(2)
        got = scope.get(key)
        return got if got else (default if default is not None else "")

    return _VAR.sub(one, value)


def _apply(state: _State, line: int, instruction: str, rest: str) -> None:
    if instruction == "ARG":
        return _arg(state, line, rest)
    if instruction == "FROM":
        return _from(state, line, rest)
    if not state.seen_from:
        raise _invalid(line, f"{instruction} before FROM")
    handler = _HANDLERS.get(instruction)
    if handler is not None:
        return handler(state, line, rest)
    if instruction in IGNORED:
        state.warnings.append(f"line {line}: {instruction} ignored (no meaning for a sandbox)")
        return None
    raise _unsupported(instruction, line, "outside the supported subset")


def _arg(state: _State, line: int, rest: str) -> None:
    key, eq, default = rest.partition("=")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise _invalid(line, f"ARG {rest!r} is not NAME or NAME=default")
    value = state.build_args.get(key, _unquote(default) if eq else "")
    state.args[key] = value


def _from(state: _State, line: int, rest: str) -> None:
    words = rest.split()
    if state.seen_from:
        raise _unsupported("multi-stage builds (a second FROM)", line, "use one FROM")
    if any(w.startswith("--") for w in words):
        raise _unsupported("FROM --platform", line, "the node's platform is used")
    if len(words) == 3 and words[1].upper() == "AS":
        raise _unsupported("FROM … AS (multi-stage builds)", line, "use one stage")
    if len(words) != 1:
        raise _invalid(line, "FROM takes one image reference")
    ref = _subst(state, words[0])
    if ref == "default":
        state.template.from_base()
    elif ref.startswith("template:"):
        state.template.from_template(ref.removeprefix("template:"))
    elif ref == "scratch":
        raise _unsupported("FROM scratch", line, "a sandbox needs a shell: use a base")
    else:
        state.template.from_image(ref)
    state.seen_from = True


def _run(state: _State, line: int, rest: str) -> None:
    if rest.startswith("--"):
        raise _unsupported(f"RUN {rest.split(maxsplit=1)[0]}", line, "RUN flags are not supported")
    command = _exec_form(line, rest)
    cmd = shlex.join(command) if command is not None else rest
    if not cmd.strip():
        raise _invalid(line, "RUN needs a command")
    if state.args:  # Docker passes ARGs to RUN in its environment; the key includes them
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(state.args.items()))
        cmd = f"export {exports}; {cmd}"
    state.template.run(cmd)


def _exec_form(line: int, rest: str) -> list[str] | None:
    if not rest.startswith("["):
        return None
    try:
        value = json.loads(rest)
    except json.JSONDecodeError as exc:
        raise _invalid(line, f"malformed JSON form: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _invalid(line, "the JSON form is a list of strings")
    return value


def _copy(state: _State, line: int, rest: str, instruction: str = "COPY") -> None:
    words = _exec_form(line, rest) or shlex.split(rest)
    flags = [w for w in words if w.startswith("--")]
    if flags:
        what = f"{instruction} {flags[0].split('=')[0]}"
        raise _unsupported(what, line, "no flags are supported (files are root's, as COPY's)")
    if len(words) < 2:
        raise _invalid(line, f"{instruction} needs a source and a destination")
    *sources, dest = (_subst(state, w) for w in words)
    if not dest.startswith("/"):
        dest = str(PurePosixPath(state.workdir) / dest) + ("/" if dest.endswith("/") else "")
    paths = [p for s in sources for p in _sources(state, line, instruction, s)]
    if len(paths) > 1 and not dest.endswith("/"):
        raise _invalid(line, f"{instruction} of several sources needs a destination ending in /")
    for path in paths:
        state.template.copy(path, dest)


def _sources(state: _State, line: int, instruction: str, source: str) -> list[Path]:
    if re.match(r"^[a-z]+://", source):
        raise _unsupported(f"{instruction} of a URL", line, "download it in a RUN step")
    matches = sorted(state.context.glob(source)) if any(c in source for c in "*?[") else []
    paths = matches or [state.context / source]
    for path in paths:
        real = path.resolve()
        if real != state.context and state.context not in real.parents:
            raise _invalid(line, f"{source} is outside the build context")
        if not real.exists():
            raise _invalid(line, f"{source} does not exist in the build context")
        if instruction == "ADD" and real.is_file() and tarfile.is_tarfile(real):
            raise _unsupported("ADD of an archive", line, "COPY it and unpack it in a RUN step")
    return paths


def _add(state: _State, line: int, rest: str) -> None:
    _copy(state, line, rest, "ADD")


def _env(state: _State, line: int, rest: str) -> None:
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise _invalid(line, f"ENV: {exc}") from exc
    if not words:
        raise _invalid(line, "ENV needs NAME=value")
    if "=" not in words[0]:  # legacy: ENV NAME the rest of the line
        pairs = {words[0]: _subst(state, rest.partition(" ")[2].strip())}
    else:
        pairs = {}
        for word in words:
            key, eq, value = word.partition("=")
            if not eq:
                raise _invalid(line, f"ENV {word!r} is not NAME=value")
            pairs[key] = _subst(state, value)
    state.env.update(pairs)
    state.template.env(pairs)


def _workdir(state: _State, line: int, rest: str) -> None:
    path = _subst(state, _unquote(rest))
    if not path:
        raise _invalid(line, "WORKDIR needs a path")
    state.workdir = str(PurePosixPath(state.workdir) / path)
    state.template.workdir(state.workdir)


def _user(state: _State, line: int, rest: str) -> None:
    user, _, group = _subst(state, rest.strip()).partition(":")
    if group:
        state.warnings.append(f"line {line}: USER's group {group!r} ignored")
    state.template.user(user)


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


_HANDLERS = {
    "RUN": _run,
    "COPY": _copy,
    "ADD": _add,
    "ENV": _env,
    "WORKDIR": _workdir,
    "USER": _user,
}
