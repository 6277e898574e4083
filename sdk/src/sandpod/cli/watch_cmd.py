"""``sandpod watch <sandbox> <path>``: print a sandbox's file events as they come; Ctrl-C stops.

One line per event (``HH:MM:SS.mmm  type  path``, directories end in ``/``, moves show
``old -> new``), or one JSON object per line with ``--json``. The watch is stopped in execd when
the command ends, however it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import Any, cast

from sandpod.aio import AsyncSandbox
from sandpod.cli._output import dump
from sandpod.errors import SandpodError
from sandpod.watch import AsyncWatch, EventType, WatchEvent

__all__ = ["add_parsers"]

EXIT_SANDPOD_ERROR = 125
EVENT_TYPES = ("create", "modify", "delete", "move", "attrib")


def add_parsers(sub: Any) -> None:
    """Register ``sandpod watch`` on the ``sandpod`` parser."""
    p = sub.add_parser(
        "watch",
        help="print file events in a sandbox as they happen",
        description="Watch a file or directory in a sandbox (recursively by default) and print "
        "each change as it happens; Ctrl-C stops.",
        epilog="examples:  sandpod watch default /workspace\n"
        "           sandpod watch default /workspace --include '**/*.py' --exclude .git\n"
        "           sandpod watch default src --json | jq .path",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    p.add_argument("--prefix", help="subject prefix (default: sandpod)")
    p.add_argument("sandbox", help="sandbox id")
    p.add_argument("path", nargs="?", default="/workspace", help="what to watch (default: all)")
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="report only matching paths (repeatable; ** spans dirs)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="never report (nor watch) matching paths (repeatable)",
    )
    p.add_argument("--events", help=f"comma-separated subset of {','.join(EVENT_TYPES)}")
    p.add_argument("--no-recursive", action="store_true", help="only the directory itself")
    p.add_argument(
        "--coalesce",
        type=float,
        metavar="SECONDS",
        help="merge a path's events within SECONDS (default 0.05; 0: off)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "yaml"),
        default="text",
        help="text lines, one JSON object per line, or one YAML document per event",
    )
    p.add_argument("--json", action="store_true", help="the same as -o json")
    p.set_defaults(run=_run_watch)


def _run_watch(args: argparse.Namespace) -> int:
    events = [e.strip() for e in (args.events or "").split(",") if e.strip()]
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        print(f"error: unknown event types {unknown}; choose from {EVENT_TYPES}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_watch(args, events))
    except SandpodError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.retryable:
            print("hint: this error is retryable; try again", file=sys.stderr)
        return EXIT_SANDPOD_ERROR
    except KeyboardInterrupt:  # Ctrl-C before the handler was installed
        return 130


async def _watch(args: argparse.Namespace, events: list[str]) -> int:
    sbx = await AsyncSandbox.connect(args.sandbox, nats_url=args.nats_url, prefix=args.prefix)
    async with sbx:
        watch = sbx.watch(
            args.path,
            recursive=not args.no_recursive,
            include=args.include,
            exclude=args.exclude,
            events=cast("list[EventType]", events),
            coalesce=args.coalesce,
        )
        async with watch:
            if watch.info is None:  # entering the block started it; -O must not drop the check
                raise SystemExit("sandpod watch: execd answered without the watch's details")
            print(
                f"watching {watch.info.path} ({watch.info.dirs} directories); Ctrl-C stops",
                file=sys.stderr,
                flush=True,
            )
            fmt = "json" if args.json else args.output
            follow = asyncio.create_task(_follow(watch, fmt))
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, follow.cancel)
            with contextlib.suppress(asyncio.CancelledError):
                await follow
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    return 0


async def _follow(watch: AsyncWatch, fmt: str) -> None:
    async for ev in watch:
        if fmt == "text":
            print(_line(ev), flush=True)
        elif fmt == "json":
            print(json.dumps(_data(ev)), flush=True)
        else:  # a YAML stream: one document per event, as they come
            print("---\n" + dump(_data(ev), "yaml"), flush=True)
    print("the watched path is gone; watch ended", file=sys.stderr)


def _line(ev: WatchEvent) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(ev.time)) + f".{int(ev.time % 1 * 1000):03d}"
    slash = "/" if ev.is_dir and ev.path != "/" else ""
    if ev.type == "overflow":
        lost = f"{ev.count} events" if ev.count else "events"
        return f"{stamp}  overflow  {ev.path}{slash}  ({lost} lost: {ev.reason}; rescan)"
    what = f"{ev.old_path}{slash} -> {ev.path}{slash}" if ev.old_path else f"{ev.path}{slash}"
    merged = f"  (x{ev.count})" if ev.count > 1 else ""
    return f"{stamp}  {ev.type:<8}  {what}{merged}"


def _data(ev: WatchEvent) -> dict[str, object]:
    return {
        "type": ev.type,
        "path": ev.path,
        "old_path": ev.old_path,
        "is_dir": ev.is_dir,
        "time": ev.time,
        "count": ev.count,
        "seq": ev.seq,
        "reason": ev.reason,
    }
