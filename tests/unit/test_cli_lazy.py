"""The CLI and the SDK start lazily: `import sandpod` and `sandpod --help` load nothing heavy,
`--help` still lists every subcommand, and the light command table agrees with the modules."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import sandpod
from sandpod.cli import COMMANDS, build_parser

SANDPOD = str(Path(sysconfig.get_path("scripts")) / "sandpod")
HEAVY = ["aiohttp", "nats", "asyncio", "sandpod_bus", "sandpod_contract", "sandpod.aio"]


def loaded_after(code: str, watched: list[str] = HEAVY) -> set[str]:
    """The modules of ``watched`` a fresh interpreter has imported after running ``code``."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(run.stdout.splitlines()[-1]))


def subcommands(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    """name -> help of ``parser``'s subcommands, in the order ``--help`` lists them."""
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in action._choices_actions}


def test_import_sandpod_loads_no_sdk_module() -> None:
    """`import sandpod` loads neither nats, aiohttp, asyncio nor the contract: names load on use."""
    assert loaded_after("import sandpod") == set()


def test_a_public_name_still_imports_on_first_use() -> None:
    """`from sandpod import Sandbox` works and brings the SDK in, still without aiohttp."""
    got = loaded_after("from sandpod import Sandbox, errors; assert Sandbox.connect, errors.Busy")
    assert {"nats", "sandpod.aio"} <= got
    assert "aiohttp" not in got


def test_the_lazy_table_is_the_public_surface() -> None:
    """Every name in `sandpod.__all__` is a lazy name (or the version) and dir() shows them."""
    lazy = set(sandpod._LAZY)
    assert set(sandpod.__all__) == lazy | {"__version__"}
    assert lazy <= set(dir(sandpod))


def test_help_lists_every_subcommand_without_importing_them() -> None:
    """`sandpod --help` names each subcommand with its help, and loads no SDK module doing so."""
    run = subprocess.run([SANDPOD, "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for name, (_, help_) in COMMANDS.items():
        assert any(line.split(None, 1) == [name, help_] for line in run.stdout.splitlines()), name
    assert loaded_after("from sandpod.cli import build_parser; build_parser('')") == set()


def test_the_command_table_matches_the_modules_parsers() -> None:
    """COMMANDS has each subcommand the modules register, in order, with the same help line."""
    real = subcommands(build_parser())
    assert real == {name: help_ for name, (_, help_) in COMMANDS.items()}


def test_a_run_builds_only_its_own_modules_parsers() -> None:
    """`sandpod ping` builds exec_cmd's parsers (exec, ping, info) and no other module's."""
    assert list(subcommands(build_parser("ping"))) == ["exec", "ping", "info"]
    probe = "from sandpod.cli import build_parser; build_parser('ping')"
    others = [f"sandpod.cli.{m}" for m, _ in COMMANDS.values()]
    assert loaded_after(probe, others) == {"sandpod.cli.exec_cmd"}


def test_an_unknown_command_is_refused_with_the_list() -> None:
    """A typo exits 2 with argparse's message naming the choices."""
    run = subprocess.run([SANDPOD, "exce"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "invalid choice: 'exce'" in run.stderr and "'exec'" in run.stderr
