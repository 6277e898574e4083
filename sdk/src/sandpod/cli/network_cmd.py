"""``sandpod network <sbx> [changes]``: show or change a sandbox's egress policy at runtime.

    sandpod network demo                                  # the effective policy, applied?
    sandpod network demo --mode allowlist --allow api.example.com:443 --allow 10.0.0.0/8
    sandpod network demo --deny evil.example.com          # adds a deny rule
    sandpod network demo --clear-allow --allow api.example.com:443
    sandpod network demo --reset                          # back to the template's policy
    sandpod network demo --events                         # follow refusals and updates

``--allow``/``--deny`` add rules to the current lists (``--clear-allow``/``--clear-deny``
empty them first, ``--remove-allow``/``--remove-deny`` take one out); the result is checked
before it is sent, so a bad rule fails with the field it is in and changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.cli._output import add_output, dump
from sandpod.cli.sandbox_cmd import EXIT_ERROR, render
from sandpod.errors import BadRequest, ResourceInvalid, ResourceNotFound, SandpodError
from sandpod.network import NetworkView
from sandpod_contract.messages.sandboxes import NetworkEvent

__all__ = ["add_parsers", "describe"]

_HINTS: tuple[tuple[type[SandpodError], str], ...] = (
    (
        ResourceInvalid,
        "rules are DNS names (example.com, *.example.com) or addresses/CIDRs (10.0.0.0/8), "
        "each with an optional :port or :low-high; modes: public, allowlist, deny-all",
    ),
    (ResourceNotFound, "list your sandboxes with `sandpod ls`"),
    (BadRequest, "`sandpod network <sbx> --reset` alone, then the changes"),
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("network", help="show or change a sandbox's egress policy")
    p.add_argument("name", help="the sandbox")
    p.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    p.add_argument("--prefix", help="subject prefix (default: sandpod)")
    p.add_argument("--mode", choices=("public", "allowlist", "deny-all"))
    for what in ("allow", "deny"):
        p.add_argument(
            f"--{what}", action="append", default=[], metavar="RULE", help=f"add a {what} rule"
        )
        p.add_argument(
            f"--remove-{what}", action="append", default=[], metavar="RULE", help="remove a rule"
        )
        p.add_argument(f"--clear-{what}", action="store_true", help=f"empty the {what} list first")
    p.add_argument("--max-connections", type=int, metavar="N")
    p.add_argument("--bandwidth", type=int, metavar="BYTES_PER_SECOND")
    p.add_argument("--reset", action="store_true", help="drop the sandbox's own policy")
    p.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the apply")
    p.add_argument(
        "--events",
        action="store_true",
        help="then follow the sandbox's network events (refusals, updates) until Ctrl-C",
    )
    add_output(p)
    p.set_defaults(run=_run)


def _changes(a: argparse.Namespace, view: NetworkView) -> dict[str, Any]:
    """The ``update`` arguments the options ask for (empty: only show)."""
    out: dict[str, Any] = {}
    if a.mode:
        out["mode"] = a.mode
    for what, current in (("allow", view.allow), ("deny", view.deny)):
        added, removed = getattr(a, what), getattr(a, f"remove_{what}")
        if added or removed or getattr(a, f"clear_{what}"):
            base = [] if getattr(a, f"clear_{what}") else list(current)
            rules = [r for r in base if r not in removed]
            out[what] = [*rules, *(r for r in added if r not in rules)]
    if a.max_connections is not None or a.bandwidth is not None:
        limits = dict(view.limits)
        if a.max_connections is not None:
            limits["maxConnections"] = a.max_connections
        if a.bandwidth is not None:
            limits["bandwidthBytesPerSecond"] = a.bandwidth
        out["limits"] = limits
    return out


def _run(a: argparse.Namespace) -> int:
    try:
        return asyncio.run(_network(a))
    except KeyboardInterrupt:
        return 130
    except SandpodError as exc:
        print(f"error: [{exc.code}] {exc.message}", file=sys.stderr)
        hint = next((h for cls, h in _HINTS if isinstance(exc, cls)), None)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return EXIT_ERROR


async def _network(a: argparse.Namespace) -> int:
    async with await AsyncSandbox.connect(a.name, nats_url=a.nats_url, prefix=a.prefix) as sbx:
        events = sbx.network.events() if a.events else None
        if a.reset:
            view = await sbx.network.get()
            if _changes(a, view):
                raise BadRequest("--reset takes no other change", field="--reset")
            view = await sbx.network.reset(wait=a.wait)
        else:
            view = await sbx.network.get()
            changes = _changes(a, view)
            if changes:
                view = await sbx.network.update(**changes, wait=a.wait)
        if a.output == "table":
            print(describe(view), flush=True)
        else:
            print(dump(view.to_dict(), a.output), flush=True)
        if events is not None:
            async for event in events:
                print(_event_line(event), flush=True)
    return 0


def _event_line(event: NetworkEvent) -> str:
    """One network event as a line: time, type, and what it says."""
    when = time.strftime("%H:%M:%S", time.localtime(event.time))
    if event.type == "denied":
        times = f" x{event.count}" if event.count > 1 else ""
        return f"{when} denied   {event.kind} {event.destination} (rule {event.rule}){times}"
    state = "enforced" if event.enforced else f"NOT enforced: {event.reason}"
    mode = (event.policy or {}).get("mode", "")
    return f"{when} {event.type}  mode {mode}, {state}"


def describe(view: NetworkView) -> str:
    """The policy as a short readable block (what ``sandpod network`` prints)."""
    state = "enforced" if view.enforced else f"NOT enforced: {view.reason}"
    rows = [
        ("SANDBOX", view.sandbox),
        ("MODE", f"{view.mode} (from the {view.source})"),
        ("ALLOW", ", ".join(view.allow) or "-"),
        ("DENY", ", ".join(view.deny) or "-"),
        ("LIMITS", ", ".join(f"{k}={v}" for k, v in view.limits.items()) or "-"),
        ("APPLIED", f"generation {view.generation}, {state}" if view.applied else state),
    ]
    return render([(f"{k}:", v) for k, v in rows])
