"""The Dockerfile subset: what each instruction becomes; what is refused, named with its line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandpod.dockerfile import parse_dockerfile
from sandpod.errors import BuildUnsupported, ResourceInvalid


def steps(text: str, context: Path, **args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    parsed = parse_dockerfile(text, "t", context, args)
    digests = {i: (f"sha256:{'0' * 64}", dest) for i, _, dest in parsed.template._copies}
    spec = parsed.template.object(digests)["spec"]["build"]
    return spec["from"], spec["steps"]


def test_run_env_workdir_user_and_continuations(tmp_path: Path) -> None:
    """Shell and exec RUN, both ENV forms, relative WORKDIR, USER; comments and \\ lines."""
    base, got = steps(
        "# syntax comment\n"
        "FROM python:3.12-slim\n"
        "RUN apt-get update && \\\n"
        "    # a comment inside the continuation\n"
        "    apt-get install -y git\n"
        'RUN ["pip", "install", "pandas numpy"]\n'
        "ENV A=1 B='two words'\n"
        "ENV LEGACY the rest of the line\n"
        "WORKDIR /srv\n"
        "WORKDIR app\n"
        "USER sandbox:staff\n",
        tmp_path,
    )
    assert base == {"image": "python:3.12-slim"}
    assert got == [
        {"run": "apt-get update && apt-get install -y git"},
        {"run": "pip install 'pandas numpy'"},
        {"env": {"A": "1", "B": "two words"}},
        {"env": {"LEGACY": "the rest of the line"}},
        {"workdir": "/srv"},
        {"workdir": "/srv/app"},
        {"user": "sandbox"},
    ]


def test_args_default_override_substitute_and_reach_run(tmp_path: Path) -> None:
    """ARG defaults, --build-arg overrides, $VAR / ${VAR:-d} substitution; RUN gets ARGs."""
    base, got = steps(
        "ARG TAG=3.12\nFROM python:${TAG}-slim\nARG MODE=dev\nARG UNSET\n"
        "ENV HOME_DIR=/opt/$MODE LOG=${UNSET:-info}\nRUN echo $MODE\n",
        tmp_path,
        MODE="prod",
    )
    assert base == {"image": "python:3.12-slim"}
    assert got[0] == {"env": {"HOME_DIR": "/opt/prod", "LOG": "info"}}
    assert got[1] == {"run": "export MODE=prod TAG=3.12 UNSET=''; echo $MODE"}


def test_copy_and_add_of_local_files(tmp_path: Path) -> None:
    """Files, directories and globs of the context; a relative destination joins WORKDIR."""
    (tmp_path / "src").mkdir()
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    (tmp_path / "req.txt").write_text("")
    base, got = steps(
        "FROM template:base\nWORKDIR /app\nCOPY src/ ./\nCOPY *.py lib/\nADD req.txt /r.txt\n",
        tmp_path,
    )
    assert base == {"template": "base"}
    parsed = parse_dockerfile(
        "FROM default\nWORKDIR /app\nCOPY src/ ./\nCOPY *.py lib/\nADD req.txt /r.txt\n",
        "t",
        tmp_path,
    )
    copies = [(src.name, dest) for _, src, dest in parsed.template._copies]
    assert copies == [
        ("src", "/app/"),
        ("a.py", "/app/lib/"),
        ("b.py", "/app/lib/"),
        ("req.txt", "/r.txt"),
    ]
    assert len(got) == 5  # WORKDIR, then one copy step per source


@pytest.mark.parametrize(
    ("text", "what", "line"),
    [
        ("FROM a\nHEALTHCHECK CMD true\n", "HEALTHCHECK", 2),
        ("FROM a\nONBUILD RUN x\n", "ONBUILD", 2),
        ('FROM a\nSHELL ["bash"]\n', "SHELL", 2),
        ("FROM a AS build\n", "FROM … AS (multi-stage builds)", 1),
        ("FROM a\nFROM b\n", "multi-stage builds (a second FROM)", 2),
        ("FROM a\nCOPY --from=build /x /y\n", "COPY --from", 2),
        ("FROM a\nCOPY --chown=1:1 f /y\n", "COPY --chown", 2),
        ("FROM a\nADD https://example.invalid/x /y\n", "ADD of a URL", 2),
        ("FROM scratch\n", "FROM scratch", 1),
        ("FROM a\nRUN --mount=type=cache x\n", "RUN --mount=type=cache", 2),
    ],
)
def test_unsupported_instructions_are_named_with_their_line(
    tmp_path: Path, text: str, what: str, line: int
) -> None:
    """Anything outside the subset: BuildUnsupported with the instruction and its line."""
    (tmp_path / "f").write_text("")
    with pytest.raises(BuildUnsupported) as info:
        parse_dockerfile(text, "t", tmp_path)
    assert info.value.details == {"what": what, "line": line}


def test_an_archive_is_not_auto_extracted(tmp_path: Path) -> None:
    """ADD of a local tar would be unpacked by Docker: refused rather than copied as is."""
    import tarfile

    with tarfile.open(tmp_path / "x.tar", "w"):
        pass
    with pytest.raises(BuildUnsupported, match="ADD of an archive"):
        parse_dockerfile("FROM a\nADD x.tar /\n", "t", tmp_path)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("RUN true\n", 1),  # before FROM
        ("FROM a\nCOPY ../outside /x\n", 2),
        ("FROM a\nCOPY missing /x\n", 2),
        ("FROM a\nCOPY f g /x\n", 2),  # several sources, a destination without /
        ('FROM a\nRUN ["unterminated"\n', 2),
    ],
)
def test_malformed_instructions_name_their_line(tmp_path: Path, text: str, line: int) -> None:
    """A malformed line, or a source leaving the context: ResourceInvalid, field the line."""
    (tmp_path / "f").write_text("")
    (tmp_path / "g").write_text("")
    with pytest.raises(ResourceInvalid) as info:
        parse_dockerfile(text, "t", tmp_path)
    assert info.value.details["field"] == f"Dockerfile:{line}"


def test_metadata_instructions_are_ignored_with_a_warning(tmp_path: Path) -> None:
    """EXPOSE, LABEL, CMD, ENTRYPOINT: no step, a warning each."""
    parsed = parse_dockerfile(
        'FROM default\nEXPOSE 80\nLABEL a=b\nCMD ["x"]\nENTRYPOINT y\n', "t", tmp_path
    )
    assert parsed.template.object({})["spec"]["build"] == {"from": {}, "steps": []}
    assert len(parsed.warnings) == 4 and "EXPOSE ignored" in parsed.warnings[0]


def test_packed_contexts_are_reproducible(tmp_path: Path) -> None:
    """The same files give the same digest (times and owners do not count); a file copied to
    a path is named by it; a change of content is a new digest."""
    import os

    from sandpod.templates import pack_context

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("1")
    first = pack_context(tmp_path / "d", "/app", tmp_path / "1.tar")
    os.utime(tmp_path / "d" / "x", (1, 1))
    assert pack_context(tmp_path / "d", "/app", tmp_path / "2.tar") == first
    (tmp_path / "d" / "x").write_text("2")
    assert pack_context(tmp_path / "d", "/app", tmp_path / "3.tar")[0] != first[0]
    assert pack_context(tmp_path / "d" / "x", "/etc/conf", tmp_path / "4.tar")[1] == "/etc"
    assert pack_context(tmp_path / "d" / "x", "/etc/", tmp_path / "5.tar")[1] == "/etc"
