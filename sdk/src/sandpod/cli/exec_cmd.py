"""``sandpod exec|ping|info``: talk to one sandbox's execd through the SDK."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.cli._output import add_output, dump, human_bytes, human_list, human_time
from sandpod.errors import SandpodError

__all__ = ["add_parsers"]

EXIT_SANDPOD_ERROR = 125
EXIT_TIMEOUT = 124
STDIN_READ = 65536


def add_parsers(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    common.add_argument("--prefix", help="subject prefix (default: sandpod)")

    p = sub.add_parser(
        "exec",
        parents=[common],
        help="run a command in a sandbox",
        description="Run a command in a sandbox, streaming its output; exits with its code.",
        epilog="examples:  sandpod exec default -- ls -la\n"
        "           sandpod exec default -c 'echo $HOME | wc -c'\n"
        "           cat data.csv | sandpod exec -i default -- wc -l",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _exec_options(p)
    p.add_argument("sandbox", help="sandbox id")
    # REMAINDER: options may also come after SANDBOX (before --); _run_exec sorts them out.
    p.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="program and arguments (after --)",
    )
    p.set_defaults(run=_run_exec)

    p = sub.add_parser("ping", parents=[common], help="round-trip time to a sandbox's execd")
    p.add_argument("sandbox", nargs="?", default="default")
    add_output(p, ("text",))
    p.set_defaults(run=_run_ping)

    p = sub.add_parser("info", parents=[common], help="what a sandbox's execd is and its limits")
    p.add_argument("sandbox", nargs="?", default="default")
    add_output(p, ("text",))
    p.set_defaults(run=_run_info)


# sys.info fields shown in human units by `sandpod info` (-o json|yaml keeps the raw values).
_SIZES = frozenset(
    {
        "max_request_bytes",
        "max_payload",
        "default_window",
        "max_window",
        "default_max_output",
        "max_output_limit",
    }
)


def _exec_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--shell", help="a shell command line instead of argv")
    p.add_argument("-w", "--cwd", help="working directory (default: the workspace)")
    p.add_argument("-e", "--env", action="append", default=[], metavar="K=V", help="add env")
    p.add_argument("-i", "--interactive", action="store_true", help="forward local stdin")
    p.add_argument("-t", "--timeout", type=float, help="kill the command after SECONDS")


_LATE = argparse.ArgumentParser(prog="sandpod exec", add_help=False)
_exec_options(_LATE)


def _split_rest(args: argparse.Namespace) -> None:
    """Options between SANDBOX and ``--`` count like the ones before SANDBOX."""
    rest = list(args.rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    if "--" not in rest:  # no separator: options first, the first non-option starts argv
        cut = 0
        while cut < len(rest) and rest[cut].startswith("-"):
            cut += 1 if rest[cut] in ("-i", "--interactive") else 2
    late = _LATE.parse_args(rest[:cut])
    for key in ("shell", "cwd", "interactive", "timeout"):
        if getattr(late, key):
            setattr(args, key, getattr(late, key))
    args.env = [*args.env, *late.env]
    args.argv = rest[cut + 1 :] if cut < len(rest) and rest[cut] == "--" else rest[cut:]


def _fail(exc: SandpodError) -> int:
    print(f"error: {exc}", file=sys.stderr)
    if exc.retryable:
        print("hint: this error is retryable; try again", file=sys.stderr)
    return EXIT_SANDPOD_ERROR


def _run_exec(args: argparse.Namespace) -> int:
    _split_rest(args)
    if bool(args.argv) == bool(args.shell):
        print("error: give either a command after -- or -c 'command line'", file=sys.stderr)
        return 2
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --env {item!r} is not K=V", file=sys.stderr)
            return 2
        env[key] = value
    try:
        return asyncio.run(_exec(args, env))
    except SandpodError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return 130


async def _exec(args: argparse.Namespace, env: dict[str, str]) -> int:
    sbx = await AsyncSandbox.connect(args.sandbox, nats_url=args.nats_url, prefix=args.prefix)
    async with sbx:
        stream = sbx.exec_stream(
            args.cwd,
            args.shell if args.shell else args.argv,
            env=env or None,
            timeout=args.timeout,
            stdin_open=args.interactive,
        )
        async with stream:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, _forward, stream, sig)
            feeder = asyncio.create_task(_feed_stdin(stream)) if args.interactive else None
            try:
                async for chunk in stream:
                    out = sys.stdout if chunk.stream == "stdout" else sys.stderr
                    out.buffer.write(chunk.data)
                    out.buffer.flush()
                status = await stream.wait()
            finally:
                if feeder is not None:
                    feeder.cancel()
                    await asyncio.gather(feeder, return_exceptions=True)
    if status.timed_out:
        print(f"sandpod: command timed out after {args.timeout:g}s", file=sys.stderr)
        return EXIT_TIMEOUT
    if status.signal is not None:
        return 128 + status.signal
    return status.exit_code if status.exit_code is not None else EXIT_SANDPOD_ERROR


_FORWARDS: set[asyncio.Task[Any]] = set()  # owned until done: the loop holds tasks only weakly


def _forward(stream: Any, sig: int) -> None:
    """Ctrl-C/SIGTERM: pass the signal to the remote command (the stream then ends)."""
    task = asyncio.ensure_future(stream.signal(sig))
    _FORWARDS.add(task)
    task.add_done_callback(_forwarded)


def _forwarded(task: asyncio.Task[Any]) -> None:
    """Release a finished forward and retrieve its outcome (a failed signal is not fatal)."""
    _FORWARDS.discard(task)
    if not task.cancelled():
        task.exception()


async def _feed_stdin(stream: Any) -> None:
    fd = sys.stdin.fileno()
    while data := await _read_stdin(fd):
        await stream.write(data)
    with contextlib.suppress(SandpodError):
        await stream.close_stdin()


async def _read_stdin(fd: int) -> bytes:
    """One read of local stdin, cancellable: wait for readability on the loop, then read what
    is there. A read in an executor thread cannot be cancelled: after the command exited it
    would keep blocking on a terminal, and ``asyncio.run`` would wait for it forever.

    Regular files cannot be polled (epoll refuses them); reading one never blocks for long.
    """
    loop = asyncio.get_running_loop()
    while True:
        ready: asyncio.Future[None] = loop.create_future()
        try:
            loop.add_reader(fd, _set_once, ready)
        except PermissionError:
            return os.read(fd, STDIN_READ)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        with contextlib.suppress(BlockingIOError):  # a non-blocking fd someone else drained
            return os.read(fd, STDIN_READ)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _run_ping(args: argparse.Namespace) -> int:
    async def go() -> float:
        async with await AsyncSandbox.connect(
            args.sandbox, nats_url=args.nats_url, prefix=args.prefix
        ) as sbx:
            return await sbx.ping()

    try:
        rtt = asyncio.run(go())
    except SandpodError as exc:
        return _fail(exc)
    if args.output == "text":
        print(f"{args.sandbox}: execd answered in {rtt * 1000:.2f} ms")
    else:
        print(dump({"sandbox": args.sandbox, "rtt_seconds": rtt}, args.output))
    return 0


def _run_info(args: argparse.Namespace) -> int:
    async def go() -> Any:
        async with await AsyncSandbox.connect(
            args.sandbox, nats_url=args.nats_url, prefix=args.prefix
        ) as sbx:
            return await sbx.runtime_info()

    try:
        info = asyncio.run(go())
    except SandpodError as exc:
        return _fail(exc)
    if args.output != "text":
        print(dump(info, args.output))
        return 0
    for field in dataclasses.fields(info):  # the wire fields (not the TYPE/VERSION ClassVars)
        print(f"{field.name:20} {_human(field.name, getattr(info, field.name))}")
    if info.isolation == "none":
        print("\nWARNING: runtime 'process' has NO ISOLATION: commands run on the host.")
    return 0


def _human(key: str, value: object) -> str:
    """One ``sys.info`` value for people: sizes in KiB/MiB, the start as a date, lists joined."""
    if value is None or value == "":  # absent: a dash, never a blank that reads as nothing
        return "-"
    if key in _SIZES and isinstance(value, int):
        return human_bytes(value)
    if key == "started_at" and isinstance(value, int | float):
        return human_time(value)
    if isinstance(value, tuple | list):
        return human_list(value)
    return str(value)
