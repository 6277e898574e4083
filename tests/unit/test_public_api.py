"""Each package's ``__all__`` is honest: every name exists, and the public surface is listed."""

from __future__ import annotations

import importlib

import pytest

# Every SDK family is a package of one shape: its public names, the async client, the values it
# returns and the blocking twin.
FAMILIES = ("exec", "fs", "proc", "pty", "session", "watch", "git")
FAMILY_SHAPE = ("__init__", "api", "types", "sync")

MODULES = [
    "sandpod",
    "sandpod.aio",
    "sandpod.sync",
    "sandpod.channel",
    "sandpod.errors",
    *(
        f"sandpod.{family}{part}"
        for family in FAMILIES
        for part in ("", *(f".{m}" for m in FAMILY_SHAPE[1:]))
    ),
    "sandpod.exec.args",
    "sandpod.exec.oneshot",
    "sandpod.exec.stream",
    "sandpod.fs.stream",
    "sandpod.proc.handle",
    "sandpod_contract",
    "sandpod_contract.errors",
    "sandpod_contract.codec",
    "sandpod_contract.subjects",
    "sandpod_bus",
    "sandpod_service",
    "sandpod_kube",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    """Every name in ``__all__`` can be imported from the module."""
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists missing names {missing}"


def test_every_wire_error_is_exported_by_the_sdk() -> None:
    """Every contract error class is importable from ``sandpod.errors`` for users to catch."""
    import sandpod.errors as sdk
    from sandpod_contract import errors as contract

    classes = {n for n in contract.__all__ if isinstance(getattr(contract, n), type)}
    assert classes <= set(sdk.__all__), sorted(classes - set(sdk.__all__))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_the_same_layout(family: str) -> None:
    """``sandpod.<family>`` is a package with ``api``, ``types`` and ``sync``, and its
    ``__init__`` re-exports every public name of those three."""
    package = importlib.import_module(f"sandpod.{family}")
    assert hasattr(package, "__path__"), f"sandpod.{family} is a module, not a package"
    for part in FAMILY_SHAPE[1:]:
        module = importlib.import_module(f"sandpod.{family}.{part}")
        if part == "api":
            continue  # the async client exports its class; helpers such as run_exec too
        missing = sorted(set(module.__all__) - set(package.__all__))
        assert not missing, f"sandpod.{family} does not re-export {part}'s {missing}"
