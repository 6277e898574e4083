"""``sandpod ps`` and ``sandpod logs``: look at a sandbox's background processes.

``ps`` prints a table of the kept records; ``logs`` prints what execd kept of one process's
output (stdout to stdout, stderr to stderr) and with ``-f`` follows it until the process exited
and everything was read. Ctrl-C only stops following: the process keeps running.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.cli._output import add_output, dump
from sandpod.errors import SandpodError
from sandpod.proc import ProcessInfo

__all__ = ["add_parsers"]

EXIT_SANDPOD_ERROR = 125


def add_parsers(sub: Any) -> None:
    """Register ``ps`` and ``logs`` on the ``sandpod`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    common.add_argument("--prefix", help="subject prefix (default: sandpod)")

    p = sub.add_parser(
        "ps",
        parents=[common],
        help="list a sandbox's background processes",
        description="List the background processes a sandbox's execd keeps (oldest first).",
        epilog="examples:  sandpod ps default\n"
        "           sandpod ps default -t role=server -s running",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sandbox", nargs="?", default="default", help="sandbox id")
    p.add_argument("-t", "--tag", action="append", default=[], metavar="K=V", help="filter by tag")
    p.add_argument("-s", "--state", choices=("running", "exited"), help="filter by state")
    add_output(p)
    p.set_defaults(run=_run_ps)

    p = sub.add_parser(
        "logs",
        parents=[common],
        help="print (or follow) a background process's output",
        description="Print the output execd kept of a background process; -f follows it until "
        "the process exited. Ctrl-C stops following only; the process keeps running.",
        epilog="examples:  sandpod logs default web\n           sandpod logs -f default web",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sandbox", help="sandbox id")
    p.add_argument("proc_id", help="background process id (see `sandpod ps`)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    p.add_argument("--stream", choices=("stdout", "stderr"), help="only this stream")
    p.add_argument("--tail", type=int, metavar="BYTES", help="start this many bytes from the end")
    p.set_defaults(run=_run_logs)


def _fail(exc: SandpodError) -> int:
    print(f"error: {exc}", file=sys.stderr)
    if exc.retryable:
        print("hint: this error is retryable; try again", file=sys.stderr)
    return EXIT_SANDPOD_ERROR


def _run(coro: Any) -> int:
    try:
        code: int = asyncio.run(coro)
    except SandpodError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return 130
    return code


# -- ps ----------------------------------------------------------------------------------------


def _run_ps(args: argparse.Namespace) -> int:
    tags: dict[str, str] = {}
    for item in args.tag:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --tag {item!r} is not K=V", file=sys.stderr)
            return 2
        tags[key] = value
    return _run(_ps(args, tags))


async def _ps(args: argparse.Namespace, tags: dict[str, str]) -> int:
    async with await AsyncSandbox.connect(
        args.sandbox, nats_url=args.nats_url, prefix=args.prefix
    ) as sbx:
        infos = await sbx.proc.list(tags=tags or None, state=args.state)
    if args.output != "table":
        print(dump(infos, args.output))
        return 0
    rows = [("ID", "PID", "STATE", "EXIT", "AGE", "TAGS", "COMMAND")]
    rows += [_row(i) for i in infos]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    return 0


def _row(info: ProcessInfo) -> tuple[str, str, str, str, str, str, str]:
    if info.running:
        status = "-"
    elif info.signal is not None:
        status = f"sig {info.signal}" + (" (timeout)" if info.timed_out else "")
    else:
        status = str(info.exit_code)
    age = (info.ended_at or time.time()) - info.started_at
    tags = ",".join(f"{k}={v}" for k, v in sorted(info.tags.items())) or "-"
    command = info.command.replace("\n", " ").strip()
    return (info.proc_id, str(info.pid), info.state, status, _duration(age), tags, command[:80])


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# -- logs --------------------------------------------------------------------------------------


def _run_logs(args: argparse.Namespace) -> int:
    return _run(_logs(args))


async def _logs(args: argparse.Namespace) -> int:
    async with await AsyncSandbox.connect(
        args.sandbox, nats_url=args.nats_url, prefix=args.prefix
    ) as sbx:
        info = await sbx.proc.status(args.proc_id)
        cursor = 0  # from the beginning: a read from there reports what the bound dropped
        if args.tail is not None:
            cursor = max(info.log_end - args.tail, info.log_start)
        if args.follow:
            async for chunk in sbx.proc.follow(args.proc_id, cursor, stream=args.stream):
                _write(chunk.stream, chunk.data, chunk.skipped)
            return 0
        while cursor < info.log_end:
            read = await sbx.proc.logs(args.proc_id, cursor, stream=args.stream)
            for chunk in read.chunks:
                _write(chunk.stream, chunk.data, chunk.skipped)
            if read.next_cursor <= cursor:
                break
            cursor = read.next_cursor
    return 0


def _write(stream: str, data: bytes, skipped: int) -> None:
    if skipped:
        print(f"[sandpod: {skipped} bytes of older output were dropped]", file=sys.stderr)
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.buffer.write(data)
    out.buffer.flush()
