"""Guards on the control plane's source (AST scans, no imports of it):

- condition types and reasons come from the contract's enums (``ConditionType``,
  ``ConditionReason``, ``PoolReason``, ``ClaimReason`` ...), never string literals: a literal
  drifts from the enum (and the CRD's documented list) without anyone noticing;
- phases are compared as the contract's ``Phase``/``ClaimPhase``, never as strings;
- the loops' rule modules read time only through their injected Clock (no ``time.time()``,
  ``time.monotonic()``, ``asyncio.sleep``, ``loop.call_later``, ``datetime.now``), so their
  unit tests on a fake clock cover them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sandpod_contract import pooling, resources

ROOT = Path(__file__).resolve().parents[2]
# Raw Kubernetes objects are read in the Kubernetes adapter; their reasons are Kubernetes'.
SOURCES = sorted(
    p
    for pattern in ("services/*/src/**/*.py", "libs/*/src/**/*.py")
    for p in ROOT.glob(pattern)
    if "/libs/kube/" not in str(p)
)
CONDITION_FIELDS = {"type": 0, "reason": 2}  # Condition(type, status, reason, message)
REASON_CALLS = {"Condition", "InstanceUnhealthy", "PodProblem", "set_condition"}
STATE_ATTRS = {"reason", "phase"}
STATE_KEYS = {"reason", "phase"}
# The values a status comparison must spell as an enum member (other strings compared with a
# ``phase`` -- a jail file's lowercase ones -- are not the contract's).
ENUM_VALUES = {
    str(m)
    for enum in (
        resources.Phase,
        resources.ConditionType,
        resources.ConditionReason,
        pooling.ClaimPhase,
        pooling.ClaimConditionType,
        pooling.ClaimReason,
        pooling.PoolConditionType,
        pooling.PoolReason,
    )
    for m in enum
}
RULE_MODULES = [
    "services/lifecycle/src/sandpod_lifecycle/reconciler.py",
    "services/lifecycle/src/sandpod_lifecycle/steps.py",
    "services/lifecycle/src/sandpod_lifecycle/lifetime.py",
    "services/lifecycle/src/sandpod_lifecycle/api.py",
    "services/pool/src/sandpod_pool/pools.py",
    "services/pool/src/sandpod_pool/claims.py",
    "services/pool/src/sandpod_pool/claim_objects.py",
    "services/pool/src/sandpod_pool/claim_recovery.py",
    "services/pool/src/sandpod_pool/members.py",
    "libs/service/src/sandpod_service/leases.py",
    "libs/service/src/sandpod_service/workqueue.py",
]
REAL_TIME = {
    ("time", "time"),
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("asyncio", "sleep"),
    ("loop", "call_later"),
    ("loop", "time"),
    ("datetime", "now"),
}


def _literal(node: ast.AST | None, values: set[str] | None = None) -> bool:
    """A string literal (one of ``values``, if given), or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        text = node.value
        return isinstance(text, str) and text != "" and (values is None or text in values)
    if isinstance(node, ast.JoinedStr):
        return values is None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_literal(e, values) for e in node.elts)
    return False


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _reason_literals(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in REASON_CALLS:
            if _name(node.func) == "Condition":
                for field, pos in CONDITION_FIELDS.items():
                    if len(node.args) > pos and _literal(node.args[pos]):
                        found.append((node.lineno, f"Condition {field} literal"))
            found += [
                (node.lineno, f"{_name(node.func)}({kw.arg}=literal)")
                for kw in node.keywords
                if kw.arg in {"type", "reason", "type_"} and _literal(kw.value)
            ]
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_literal(s, ENUM_VALUES) for s in sides) and any(_state(s) for s in sides):
                found.append((node.lineno, "a phase/reason compared with a string literal"))
    return found


def _state(node: ast.AST) -> bool:
    """``x.phase`` / ``x.reason``, or ``x.get("phase")`` on a raw status map."""
    if isinstance(node, ast.Attribute):
        return node.attr in STATE_ATTRS
    if isinstance(node, ast.Call) and _name(node.func) == "get" and node.args:
        key = node.args[0]
        return isinstance(key, ast.Constant) and key.value in STATE_KEYS
    return False


def _real_time(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in REAL_TIME
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        if isinstance(node, ast.Attribute) and node.attr == "now":
            inner = node.value
            if isinstance(inner, ast.Attribute) and inner.attr == "datetime":
                found.append((node.lineno, "datetime.datetime.now"))
        if isinstance(node, ast.Call) and _name(node.func) == "get_running_loop":
            found.append((node.lineno, "asyncio.get_running_loop (its timers are real time)"))
    return found


def test_the_scan_sees_the_control_plane() -> None:
    """The globs find the services and libraries (an empty scan would pass vacuously)."""
    names = {p.name for p in SOURCES}
    assert {"steps.py", "claims.py", "pools.py", "leases.py"} <= names


def test_the_scans_catch_what_they_forbid() -> None:
    """Each scan flags its own counterexample (so a passing scan means something)."""
    bad = ast.parse(
        "Condition('Ready', 'True', 'ExecdReady')\n"
        "InstanceUnhealthy('m', reason='PodFailed', terminal=True)\n"
        "ok = view.status.phase == 'Running'\n"
        "bad = obj.status.get('phase') in ('Failed', 'Terminated')\n"
        "t = time.time() + time.monotonic()\n"
        "await asyncio.sleep(1)\n"
        "n = datetime.datetime.now(datetime.UTC)\n"
    )
    assert len(_reason_literals(bad)) == 5
    assert len(_real_time(bad)) == 4


def test_condition_reasons_and_phases_are_the_contracts_enums() -> None:
    """No condition type or reason written, and no phase or reason compared, as a literal."""
    found = {
        str(path.relative_to(ROOT)): hits
        for path in SOURCES
        if (hits := _reason_literals(ast.parse(path.read_text(), str(path))))
    }
    assert not found, f"use the contract's enums: {found}"


def test_the_loops_rules_read_time_only_from_their_clock() -> None:
    """The reconciler, the pool, claims, leases and the work queue ask their Clock."""
    found = {
        rel: hits
        for rel in RULE_MODULES
        if (hits := _real_time(ast.parse((ROOT / rel).read_text())))
    }
    assert not found, f"pass the time through sandpod_service.clock.Clock: {found}"
