"""``pip install sandpod[up]`` brings every service ``sandpod up`` starts, directly or not."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUPERVISOR = REPO / "sdk" / "src" / "sandpod" / "supervisor.py"


def _modules_run_by(path: Path) -> set[str]:
    """Modules a source file starts as ``python -m <module>``: ``"-m", "<module>"`` pairs in a
    list literal (an argv) or in a call's positional arguments (``create_subprocess_exec``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List):
            elements = node.elts
        elif isinstance(node, ast.Call):
            elements = node.args
        else:
            continue
        items = [e.value if isinstance(e, ast.Constant) else None for e in elements]
        found |= {str(b) for a, b in itertools.pairwise(items) if a == "-m" and b}
    return found


def _spawned_transitively() -> set[str]:
    """What the supervisor starts, and what those services start in turn (lifecycle: execd)."""
    todo, seen = _modules_run_by(SUPERVISOR), set[str]()
    while todo:
        module = todo.pop()
        seen.add(module)
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"{module} is not installed"
        # A package: its directory; a module of one (``pkg.tool``): the package it is in.
        roots = spec.submodule_search_locations or [str(Path(spec.origin).parent)]
        for root in roots:
            for source in Path(root).rglob("*.py"):
                todo |= {m for m in _modules_run_by(source) if m.startswith("sandpod")} - seen
    return seen


def _distribution_of(module: str) -> str:
    """The workspace distribution whose ``src/`` holds ``module`` (editable installs carry no
    ``top_level.txt``, so ``importlib.metadata`` cannot tell)."""
    top = module.split(".", maxsplit=1)[0]
    for project in REPO.glob("*/*/pyproject.toml"):
        if (project.parent / "src" / top).is_dir():
            return str(tomllib.loads(project.read_text())["project"]["name"]).lower()
    raise AssertionError(f"no workspace member provides {top}")


def _up_extra() -> set[str]:
    data = tomllib.loads((REPO / "sdk" / "pyproject.toml").read_text())
    extra = data["project"]["optional-dependencies"]["up"]
    return {re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower() for req in extra}


def test_up_extra_covers_every_service_sandpod_up_starts() -> None:
    """Each module the supervisor (or a service it starts) runs belongs to a distribution in the
    ``up`` extra, so a fresh ``pip install 'sandpod[up]'`` can run ``sandpod up``."""
    spawned = _spawned_transitively()
    assert {"sandpod_lifecycle", "sandpod_pool", "sandpod_gateway", "sandpod_execd"} <= spawned
    extra = _up_extra()
    missing = {m: _distribution_of(m) for m in spawned if _distribution_of(m) not in extra}
    assert not missing, f"spawned by `sandpod up` but not in sdk's [up] extra: {missing}"
