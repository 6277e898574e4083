"""``sandpod mcp``: serve Sandpod's tools to an agent over the Model Context Protocol."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Register ``sandpod mcp``."""
    p = sub.add_parser(
        "mcp",
        help="serve Sandpod tools over MCP (stdio by default)",
        description="Run an MCP server whose tools (exec, sessions, processes, files, git) act "
        "on a sandbox. Add it to an agent as a stdio server: `sandpod mcp --sandbox default`.",
    )
    p.add_argument("--sandbox", default="default", help="default sandbox id for the tools")
    p.add_argument("--nats-url", help="NATS URL (default: $SANDPOD_NATS_URL, $NATS_URL)")
    p.add_argument("--prefix", help="subject prefix (default: sandpod)")
    p.add_argument(
        "--transport", choices=["stdio", "streamable-http"], default="stdio", help="MCP transport"
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP listen address (streamable-http)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (streamable-http)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        from sandpod.mcp_server import SandboxPool, build_server
    except ImportError:
        import sys

        print("error: the MCP server needs `pip install 'sandpod[mcp]'`", file=sys.stderr)
        return 2
    server = build_server(SandboxPool(args.sandbox, args.nats_url, args.prefix))
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)
    return 0
