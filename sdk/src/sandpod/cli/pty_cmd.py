"""``sandpod shell``: an interactive terminal in a sandbox, in the user's own terminal.

Data flow: the local terminal is put in raw mode (restored on every exit path); bytes typed are
read as they come and sent in order with ``pty.input``; output is pulled with long-poll
``pty.read`` and written as it arrives; SIGWINCH sends the new size with ``pty.resize``. The
program's exit code becomes the CLI's (128+N when signal N killed it). ``Ctrl-]`` detaches and
leaves the terminal running; ``--attach ID`` re-attaches, replaying what execd kept. When
stdin is not a terminal, its bytes are typed as they are and its end is sent as Ctrl-D.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from typing import Any

from sandpod.aio import AsyncSandbox
from sandpod.errors import PtyClosed, SandpodError
from sandpod.pty import AsyncPty

__all__ = ["add_parsers"]

EXIT_SANDPOD_ERROR = 125
DETACH_KEY = b"\x1d"  # Ctrl-]
EOT = b"\x04"  # Ctrl-D: what ends a shell's input on a terminal


def _options() -> argparse.ArgumentParser:
    opts = argparse.ArgumentParser(add_help=False)
    opts.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    opts.add_argument("--prefix", help="subject prefix (default: sandpod)")
    opts.add_argument("-w", "--cwd", help="working directory (default: the workspace)")
    opts.add_argument("-e", "--env", action="append", default=[], metavar="K=V", help="add env")
    opts.add_argument("--id", help="the terminal's id (to re-attach to it later)")
    opts.add_argument("--attach", metavar="ID", help="re-attach to a running terminal")
    return opts


_OPTIONS = _options()
_TAKES_VALUE = {s for a in _OPTIONS._actions if a.nargs is None for s in a.option_strings}


def add_parsers(sub: Any) -> None:
    """Register this module's subcommands on the ``sandpod`` parser."""
    p = sub.add_parser(
        "shell",
        parents=[_OPTIONS],
        usage="sandpod shell [options] SANDBOX [options] [-- COMMAND...]",
        help="an interactive terminal (pty) in a sandbox",
        description="Open a terminal in a sandbox: its login shell, or a command. Exits with "
        "the program's code. Ctrl-] detaches (the terminal keeps running).",
        epilog="examples:  sandpod shell default\n"
        "           sandpod shell default -- python3\n"
        "           sandpod shell default --id build-1 -- bash -l\n"
        "           sandpod shell default --attach build-1    # re-attach, replaying output",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sandbox", help="sandbox id")
    # REMAINDER (not "*"): argparse would otherwise refuse options between SANDBOX and "--";
    # _split_rest takes the options out again.
    p.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="program and arguments (after --); default: the login shell",
    )
    p.set_defaults(run=_run_shell)


def _split_rest(rest: list[str]) -> tuple[list[str], list[str]]:
    """(option tokens, command) of what follows SANDBOX: options up to ``--`` (or up to the
    first token that is neither an option nor its value), then the command."""
    if "--" in rest:
        cut = rest.index("--")
        return rest[:cut], rest[cut + 1 :]
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        i += 2 if rest[i] in _TAKES_VALUE else 1
    return rest[:i], rest[i:]


def _run_shell(args: argparse.Namespace) -> int:
    tokens, args.argv = _split_rest(args.rest)
    later = _OPTIONS.parse_args(tokens)
    for key, value in vars(later).items():
        if value:  # given after SANDBOX: wins (--env adds)
            setattr(args, key, [*args.env, *value] if key == "env" else value)
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --env {item!r} is not K=V", file=sys.stderr)
            return 2
        env[key] = value
    if args.attach and (args.argv or args.id or env or args.cwd):
        print("error: --attach takes no command, --id, --env or --cwd", file=sys.stderr)
        return 2
    caught: list[int] = []
    try:
        return asyncio.run(_shell(args, env, caught))
    except asyncio.CancelledError:  # SIGTERM/SIGHUP: the terminal is restored, the pty closed
        return 128 + (caught[0] if caught else signal.SIGTERM)
    except SandpodError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.retryable:
            print("hint: this error is retryable; try again", file=sys.stderr)
        return EXIT_SANDPOD_ERROR
    except KeyboardInterrupt:
        return 130


def _size(fd: int) -> tuple[int, int]:
    with contextlib.suppress(OSError):
        size = os.get_terminal_size(fd)
        return max(size.columns, 1), max(size.lines, 1)
    return 80, 24


async def _shell(args: argparse.Namespace, env: dict[str, str], caught: list[int]) -> int:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    if main is None:  # called from a coroutine run by asyncio.run: there is always one
        raise RuntimeError("sandpod pty: not running in a task")

    def stop(sig: int) -> None:
        caught.append(sig)
        main.cancel()

    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop, sig)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    interactive = os.isatty(stdin)
    cols, rows = _size(stdout if os.isatty(stdout) else stdin)
    async with await AsyncSandbox.connect(
        args.sandbox, nats_url=args.nats_url, prefix=args.prefix
    ) as sbx:
        if args.attach:
            term = await sbx.pty.connect(args.attach, cursor=0)
            # Two resizes: a SIGWINCH even at the same size, so full-screen programs redraw
            # (after the replay, which may be cut or drawn for another size).
            await term.resize(cols, rows - 1 if rows > 1 else rows + 1)
            await term.resize(cols, rows)
        else:
            local_term = os.environ.get("TERM") or "xterm-256color"
            term = await sbx.pty.open(
                args.argv or None,
                cols=cols,
                rows=rows,
                cwd=args.cwd,
                env={"TERM": local_term, **env},
                pty_id=args.id,
            )
        saved = termios.tcgetattr(stdin) if interactive else None
        try:
            if interactive:
                tty.setraw(stdin, termios.TCSANOW)  # TCSANOW: keep what was typed ahead
            code = await _attached(term, stdin, stdout, interactive)
        except BaseException:
            if not args.attach:  # we started it: do not leave it running unattended
                with contextlib.suppress(SandpodError):
                    await asyncio.shield(term.close())
            raise
        finally:
            if saved is not None:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
    if code is None:
        print(
            f"\n[detached from pty {term.id}; re-attach with: "
            f"sandpod shell {args.sandbox} --attach {term.id}]",
            file=sys.stderr,
        )
        return 0
    return code


async def _attached(term: AsyncPty, stdin: int, stdout: int, interactive: bool) -> int | None:
    """Pump keys in and output out until the program ends (its exit code) or the user
    detaches (``None``)."""
    return await _Session(term, stdin, stdout, interactive).run()


class _Session:
    """The three pumps of one attached terminal: keys in, output out, window size."""

    def __init__(self, term: AsyncPty, stdin: int, stdout: int, interactive: bool) -> None:
        self.term, self.stdin, self.stdout, self.interactive = term, stdin, stdout, interactive
        self.loop = asyncio.get_running_loop()
        self.keys: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)  # full: stop reading keys
        self.detach = asyncio.Event()
        self.resized = asyncio.Event()
        self.ended = False  # stdin reached its end (or the user detached): read no more

    async def run(self) -> int | None:
        self.loop.add_reader(self.stdin, self.on_stdin)
        self.loop.add_signal_handler(signal.SIGWINCH, self.resized.set)
        helpers = [asyncio.create_task(self.send_keys()), asyncio.create_task(self.send_size())]
        output = asyncio.create_task(self.show_output())
        detached = asyncio.create_task(self.detach.wait())
        try:
            pending: set[asyncio.Task[Any]] = {output, detached, *helpers}
            while not output.done() and not detached.done():
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done & set(helpers):
                    task.result()  # a helper's failure ends the session with its error
            return output.result() if output.done() else None
        finally:
            self.loop.remove_reader(self.stdin)
            self.loop.remove_signal_handler(signal.SIGWINCH)
            await _cancel_all([*helpers, output, detached])

    def on_stdin(self) -> None:
        try:
            data = os.read(self.stdin, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if self.interactive and DETACH_KEY in data:
            data = data[: data.index(DETACH_KEY)]
            self.detach.set()
            self.ended = True
        elif not data:
            self.ended = True
            data = b"" if self.interactive else EOT
        if data:
            self.keys.put_nowait(data)
        if self.ended or self.keys.full():
            self.loop.remove_reader(self.stdin)

    async def send_keys(self) -> None:
        while True:
            data = await self.keys.get()
            while not self.keys.empty():  # coalesce what queued up during the last round trip
                data += self.keys.get_nowait()
            try:
                await self.term.write(data, timeout=None)
            except PtyClosed:
                return  # the program ended: its last output and exit status are on their way
            if not self.ended:
                self.loop.add_reader(self.stdin, self.on_stdin)

    async def send_size(self) -> None:
        while True:
            await self.resized.wait()
            self.resized.clear()
            fd = self.stdout if os.isatty(self.stdout) else self.stdin
            with contextlib.suppress(SandpodError):
                await self.term.resize(*_size(fd))

    async def show_output(self) -> int:
        while True:
            out = await self.term.read()
            if out.skipped:
                note = f"\r\n[sandpod: {out.skipped} bytes skipped]\r\n"
                _write_all(self.stdout, note.encode())
            _write_all(self.stdout, out.data)
            if out.exit is not None:
                if out.exit.signal is not None:
                    return 128 + out.exit.signal
                return out.exit.exit_code if out.exit.exit_code is not None else 0


async def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again any that swallowed it: on Python
    3.11 ``wait_for`` (under every NATS request) returns the reply instead of raising when the
    reply and the cancellation arrive together, and the pump would then park another read."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.5)
    for task in tasks:  # retrieve outcomes so none is reported as never retrieved
        if not task.cancelled():
            task.exception()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            os.set_blocking(fd, True)
