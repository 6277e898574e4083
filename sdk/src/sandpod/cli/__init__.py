"""The ``sandpod`` command line: ``up``, ``exec``, ``ping``, ``info``.

Errors print ``error: [code] message`` and a hint, and exit 125 (Sandpod could not run the
command); ``exec`` otherwise exits with the command's own code (128+N when signal N killed it,
124 when the timeout did).
"""

from __future__ import annotations

import argparse
import sys

from sandpod.cli import (
    creds_cmd,
    exec_cmd,
    fs_cmd,
    mcp_cmd,
    pool_cmd,
    proc_cmd,
    pty_cmd,
    sandbox_cmd,
    up,
    watch_cmd,
)

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandpod", description="Sandboxes for AI agents, over NATS."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up.add_parser(sub)
    exec_cmd.add_parsers(sub)
    for module in (sandbox_cmd, pool_cmd, fs_cmd, proc_cmd, pty_cmd, watch_cmd, mcp_cmd, creds_cmd):
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
