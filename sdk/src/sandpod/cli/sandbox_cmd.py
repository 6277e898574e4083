"""``sandpod create|ls|get|rm|renew|pause|resume``: Sandbox resources through the lifecycle API.

Tables use the CRD's printer columns (NAME, PHASE, READY, TEMPLATE, NETWORK, EXPIRES, AGE), so
the CLI and ``kubectl get sandboxes`` show the same thing; NETWORK is the mode of the egress
policy the runtime applied (``status.network``; ``sandpod network <sbx>`` shows all of it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.cli._output import add_output, dump
from sandpod.control import SandboxInfo
from sandpod.errors import SandpodError
from sandpod_contract.times import from_rfc3339

__all__ = ["add_parsers", "age", "pairs", "render", "run", "table"]

EXIT_ERROR = 125


def age(stamp: str | None, *, future: bool = False) -> str:
    if not stamp:
        return "-"
    try:
        t = from_rfc3339(stamp)
    except ValueError:
        return stamp
    seconds = int((t - time.time()) if future else (time.time() - t))
    if seconds < 0:
        return "expired" if future else "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _expires(info: SandboxInfo) -> str:
    if info.object.get("spec", {}).get("permanent"):
        return "never"
    return age(info.shutdown_time, future=True)


def table(items: list[SandboxInfo]) -> str:
    """The printer-column table of ``items``."""
    rows = [("NAME", "PHASE", "READY", "TEMPLATE", "NETWORK", "EXPIRES", "AGE")]
    for i in items:
        ready = i.condition("Ready")
        network = (i.object.get("status") or {}).get("network") or {}
        rows.append(
            (
                i.name,
                i.phase or "-",
                ready["status"] if ready else "-",
                i.template or "-",
                str((network.get("policy") or {}).get("mode") or "-"),
                _expires(i),
                age(i.created),
            )
        )
    return render(rows)


def render(rows: Sequence[Sequence[str]]) -> str:
    """Rows (the first one: headers) as aligned columns, like kubectl."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def add_parsers(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    common.add_argument("--prefix", help="subject prefix (default: sandpod)")

    p = sub.add_parser("create", parents=[common], help="create a sandbox and wait until Ready")
    p.add_argument("--template", help="SandboxTemplate name (default: the built-in template)")
    p.add_argument("--name", help="sandbox id (default: generated)")
    p.add_argument("--snapshot", help="start from this snapshot's files (sandpod snapshot ls)")
    p.add_argument("--timeout", type=float, help="lifetime in seconds (default: the template's)")
    p.add_argument("--idle-timeout", type=int, help="expire after N idle seconds (0: never)")
    p.add_argument("--permanent", action="store_true", help="no lifetime at all (explicit)")
    p.add_argument("-l", "--label", action="append", default=[], metavar="K=V")
    p.add_argument("-e", "--env", action="append", default=[], metavar="K=V")
    p.add_argument(
        "-v",
        "--volume",
        action="append",
        default=[],
        metavar="NAME:/PATH[:ro]",
        help="mount a SandboxVolume (sandpod volume create); :ro read-only",
    )
    add_output(p)
    p.set_defaults(run=lambda a: run(_create(a)))

    p = sub.add_parser("ls", parents=[common], help="list sandboxes")
    p.add_argument("-l", "--selector", help="label selector, e.g. team=a,env in (dev,ci)")
    add_output(p)
    p.set_defaults(run=lambda a: run(_ls(a)))

    p = sub.add_parser("get", parents=[common], help="show one sandbox (the whole object)")
    p.add_argument("name")
    add_output(p, (), default="json")
    p.set_defaults(run=lambda a: run(_one(a, lambda s: s.describe())))

    p = sub.add_parser("rm", parents=[common], help="delete sandboxes (and their instances)")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=lambda a: run(_rm(a)))

    p = sub.add_parser("renew", parents=[common], help="extend a sandbox's lifetime")
    p.add_argument("name")
    p.add_argument("--for", dest="seconds", type=float, required=True, help="seconds from now")
    add_output(p)
    p.set_defaults(run=lambda a: run(_one(a, lambda s: s.renew(a.seconds))))

    for verb in ("pause", "resume"):
        p = sub.add_parser(verb, parents=[common], help=f"{verb} a sandbox")
        p.add_argument("name")
        add_output(p)
        p.set_defaults(run=lambda a, v=verb: run(_one(a, lambda s: getattr(s, v)())))


def pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: {what} {item!r} is not K=V")
        out[key] = value
    return out


def run(coro: Awaitable[int]) -> int:
    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except SandpodError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


async def _create(a: argparse.Namespace) -> int:
    sbx = await AsyncSandbox.create(
        a.template,
        name=a.name,
        timeout=a.timeout,
        permanent=a.permanent,
        idle_timeout=a.idle_timeout,
        labels=pairs(a.label, "--label"),
        env=pairs(a.env, "--env"),
        snapshot=a.snapshot,
        volumes=_mounts(a.volume),
        nats_url=a.nats_url,
        prefix=a.prefix,
    )
    async with sbx:
        _print(a.output, [await sbx.describe()])
    return 0


def _mounts(texts: list[str]) -> list[str]:
    """``--volume`` values, checked for shape here (the service validates the rest)."""
    if texts:
        from sandpod.volumes import parse_mount  # lazy: only when a volume is named

        for text in texts:
            try:
                parse_mount(text)
            except ValueError as exc:
                raise SystemExit(f"error: {exc}") from None
    return texts


def _print(fmt: str, items: list[SandboxInfo], *, one: bool = True) -> None:
    """``items`` as the printer-column table, or their whole objects as json/yaml (a single
    object, not a list, when ``one`` and there is exactly one)."""
    if fmt == "table":
        print(table(items))
        return
    objects = [dict(i.object) for i in items]
    print(dump(objects[0] if one and len(objects) == 1 else objects, fmt))


async def _ls(a: argparse.Namespace) -> int:
    items = await AsyncSandbox.list(a.selector, nats_url=a.nats_url, prefix=a.prefix)
    _print(a.output, items, one=False)
    return 0


async def _one(
    a: argparse.Namespace, call: Callable[[AsyncSandbox], Awaitable[SandboxInfo]]
) -> int:
    async with await AsyncSandbox.connect(a.name, nats_url=a.nats_url, prefix=a.prefix) as sbx:
        info = await call(sbx)
    _print(a.output, [info])
    return 0


async def _rm(a: argparse.Namespace) -> int:
    for name in a.names:
        async with await AsyncSandbox.connect(name, nats_url=a.nats_url, prefix=a.prefix) as sbx:
            await sbx.kill()
        print(f"deleted {name}")
    return 0
