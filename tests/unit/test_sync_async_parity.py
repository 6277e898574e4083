"""The blocking SDK has the async SDK's surface: every ``AsyncX`` has an ``X`` with the same
public methods, attributes and parameters (names, kinds, defaults), so code ports by dropping
``await``. Found by name over every module of the ``sandpod`` package and its family
subpackages, so a new pair is checked without being listed here."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from typing import Any

import pytest

import sandpod

# Async-only plumbing: the shared connection a caller may pass in (``bus=``), the subjects
# built on it and the channel the families are given on it; the blocking SDK owns its
# connection on its private loop.
ASYNC_ONLY = {"bus", "subjects", "channel"}
# Same operation, the language's spelling: async resources close with ``aclose``.
RENAMED = {"aclose": "close"}
# Context-manager and iteration protocols differ by design (``async with`` vs ``with``).
PROTOCOL = {
    "__aenter__",
    "__aexit__",
    "__enter__",
    "__exit__",
    "__aiter__",
    "__anext__",
    "__iter__",
    "__next__",
}
NOT_SDK = {"__main__", "cli", "mcp_server", "supervisor"}


def _pairs() -> list[tuple[type, type]]:
    classes: dict[str, type] = {}
    for info in pkgutil.walk_packages(sandpod.__path__, "sandpod."):
        if info.name.split(".")[1] in NOT_SDK:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                classes[name] = obj
    names = sorted(n for n in classes if n.startswith("Async") and n[5:] in classes)
    return [(classes[n], classes[n[5:]]) for n in names]


def _instance_attributes(cls: type) -> set[str]:
    """Public ``self.x = ...`` assignments in the class body (plain attributes, not in dir())."""
    found: set[str] = set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else ([node.target] if isinstance(node, ast.AnnAssign) else [])
        )
        for target in targets:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            for t in elements:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and not t.attr.startswith("_")
                ):
                    found.add(t.attr)
    return found


def _surface(cls: type, *, is_async: bool) -> set[str]:
    names = {n for n in dir(cls) if not n.startswith("_")} | _instance_attributes(cls)
    if is_async:
        names = {RENAMED.get(n, n) for n in names} - ASYNC_ONLY
    return names


def _parameters(fn: Any, *, is_async: bool) -> list[tuple[str, Any, Any]]:
    params = inspect.signature(fn).parameters.values()
    return [(p.name, p.kind, p.default) for p in params if not (is_async and p.name == "bus")]


def _kind(cls: type, name: str) -> str:
    """How a member is bound: plain attributes and properties count alike (a blocking property
    mirrors an async attribute)."""
    member = inspect.getattr_static(cls, name, None)
    if isinstance(member, classmethod | staticmethod):
        return type(member).__name__
    return "method" if inspect.isfunction(member) else "attribute"


PAIRS = _pairs()


def test_the_known_pairs_are_found() -> None:
    """The discovery sees the sandbox, exec stream and family classes (not an empty check)."""
    names = {a.__name__ for a, _ in PAIRS}
    expected = {
        "AsyncSandbox",
        "AsyncExecStream",
        "AsyncFiles",
        "AsyncProcesses",
        "AsyncSessions",
        "AsyncPtys",
        "AsyncWatches",
        "AsyncGit",
        "AsyncPools",
    }
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=[a.__name__ for a, _ in PAIRS])
def test_sync_class_has_the_async_surface(async_cls: type, sync_cls: type) -> None:
    """Same public names; each shared method takes the same parameters; same binding kind."""
    async_names = _surface(async_cls, is_async=True)
    sync_names = _surface(sync_cls, is_async=False)
    assert async_names == sync_names, (
        f"only in {async_cls.__name__}: {sorted(async_names - sync_names)}; "
        f"only in {sync_cls.__name__}: {sorted(sync_names - async_names)}"
    )
    reverse = {v: k for k, v in RENAMED.items()}
    for name in sorted(sync_names):
        async_name = reverse.get(name, name) if not hasattr(async_cls, name) else name
        a_kind, s_kind = _kind(async_cls, async_name), _kind(sync_cls, name)
        assert a_kind == s_kind, f"{name}: {a_kind} in async, {s_kind} in sync"
        if a_kind == "attribute":
            continue
        a_params = _parameters(getattr(async_cls, async_name), is_async=True)
        s_params = _parameters(getattr(sync_cls, name), is_async=False)
        assert a_params == s_params, f"{sync_cls.__name__}.{name}: {a_params} != {s_params}"
    iterable = {"__aiter__" in dir(async_cls), "__iter__" in dir(sync_cls)}
    assert len(iterable) == 1, "one is iterable and the other is not"
    managed = {"__aenter__" in dir(async_cls), "__enter__" in dir(sync_cls)}
    assert len(managed) == 1, "one is a context manager and the other is not"
