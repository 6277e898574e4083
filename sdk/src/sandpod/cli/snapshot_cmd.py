"""``sandpod snapshot create|ls|get|rm`` and ``sandpod fork``: snapshots through the lifecycle API.

The table uses the CRD's printer columns (NAME, PHASE, SOURCE, SIZE, AGE; ``-o wide`` adds
PARENT, TOTAL and LAYERS), so the CLI and ``kubectl get sandboxsnapshots`` agree. ``fork``
snapshots a sandbox (or uses ``--snapshot``) and starts N sandboxes from it, printing their
names; ``sandpod create --snapshot NAME`` restores one.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.cli._output import add_output, dump
from sandpod.cli.sandbox_cmd import age, pairs, render, run
from sandpod.snapshots import SnapshotInfo

__all__ = ["add_parsers", "table"]


def _size(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"


def table(items: list[SnapshotInfo], *, wide: bool = False) -> str:
    """The printer-column table of ``items``."""
    head = ["NAME", "PHASE", "SOURCE", "SIZE", "AGE"]
    rows = [head + (["PARENT", "TOTAL", "LAYERS", "REASON"] if wide else [])]
    for s in items:
        created = str(s.raw.get("metadata", {}).get("creationTimestamp") or "")
        row = [s.name, s.phase, s.source, _size(s.size_bytes), age(created)]
        if wide:
            row += [s.parent or "-", _size(s.total_bytes), str(s.layers), s.reason or "-"]
        rows.append(row)
    return render(rows)


def add_parsers(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    common.add_argument("--prefix", help="subject prefix (default: sandpod)")
    snap = sub.add_parser("snapshot", help="snapshots of sandboxes: create, ls, get, rm")
    verbs = snap.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("create", parents=[common], help="snapshot a running sandbox")
    p.add_argument("sandbox")
    p.add_argument("--name", help="the snapshot's name (default: generated)")
    p.add_argument("--ttl", type=int, help="delete it this many seconds after it is Ready")
    p.add_argument("--retain", type=int, help="keep only the newest N snapshots of the sandbox")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the capture")
    add_output(p, ("table", "wide"))
    p.set_defaults(run=lambda a: run(_create(a)))
    p = verbs.add_parser("ls", parents=[common], help="list snapshots")
    p.add_argument("--source", help="only the snapshots of this sandbox")
    add_output(p, ("table", "wide"))
    p.set_defaults(run=lambda a: run(_ls(a)))
    p = verbs.add_parser("get", parents=[common], help="show one snapshot (the whole object)")
    p.add_argument("name")
    add_output(p, (), default="json")
    p.set_defaults(run=lambda a: run(_get(a)))
    p = verbs.add_parser("rm", parents=[common], help="delete snapshots (refused while in use)")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=lambda a: run(_rm(a)))

    p = sub.add_parser(
        "fork", parents=[common], help="start sandboxes with a sandbox's files (a snapshot)"
    )
    p.add_argument("sandbox")
    p.add_argument("-n", type=int, default=1, help="how many (default 1)")
    p.add_argument("--snapshot", help="use this snapshot instead of taking one now")
    p.add_argument("-l", "--label", action="append", default=[], metavar="K=V")
    p.set_defaults(run=lambda a: run(_fork(a)))


def _print(fmt: str, items: list[SnapshotInfo], *, one: bool = True) -> None:
    if fmt in ("table", "wide"):
        print(table(items, wide=fmt == "wide"))
        return
    objects = [dict(i.raw) for i in items]
    print(dump(objects[0] if one and len(objects) == 1 else objects, fmt))


async def _handle(a: argparse.Namespace) -> AsyncSandbox:
    return await AsyncSandbox.connect(
        getattr(a, "sandbox", None) or "default", nats_url=a.nats_url, prefix=a.prefix
    )


async def _create(a: argparse.Namespace) -> int:
    async with await _handle(a) as sbx:
        info = await sbx.snapshot(a.name, ttl=a.ttl, retain=a.retain, wait=a.wait)
    _print(a.output, [info])
    return 0


async def _ls(a: argparse.Namespace) -> int:
    async with await _handle(a) as sbx:
        items = await sbx.snapshots.list(a.source)
    _print(a.output, items, one=False)
    return 0


async def _get(a: argparse.Namespace) -> int:
    async with await _handle(a) as sbx:
        info = await sbx.snapshots.get(a.name)
    _print(a.output, [info])
    return 0


async def _rm(a: argparse.Namespace) -> int:
    async with await _handle(a) as sbx:
        for name in a.names:
            await sbx.snapshots.delete(name)
            print(f"deleted {name}")
    return 0


async def _fork(a: argparse.Namespace) -> int:
    if a.n < 1:
        print("error: -n must be at least 1", file=sys.stderr)
        return 2
    async with await _handle(a) as sbx:
        forks = await sbx.fork(a.n, snapshot=a.snapshot, labels=pairs(a.label, "--label"))
        for f in forks:
            print(f.id)
    return 0
