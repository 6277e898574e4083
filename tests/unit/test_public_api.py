"""Each package's ``__all__`` is honest: every name exists, and the public surface is listed."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "sandpod",
    "sandpod.aio",
    "sandpod.sync",
    "sandpod.exec_args",
    "sandpod.exec_oneshot",
    "sandpod.exec_stream",
    "sandpod.errors",
    "sandpod.results",
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
