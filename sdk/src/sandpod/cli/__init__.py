"""The ``sandpod`` command line: ``up``, ``exec``, ``ping``, ``info`` and the rest.

Errors print ``error: [code] message`` and a hint, and exit 125 (Sandpod could not run the
command); ``exec`` otherwise exits with the command's own code (128+N when signal N killed it,
124 when the timeout did).

Startup is part of the interface: each subcommand's module (and with it the SDK, nats-py and the
contract) is imported only when that subcommand runs. :data:`COMMANDS` names every subcommand,
its module and its one-line help: a run builds only its own module's sub-parsers, and
``sandpod --help`` (or an unknown command) gets a bare stub per command, listing them all
without importing any. (argparse's parsers are not free either: each one looks up gettext
catalogues on disk.)
``tests/unit/test_cli_lazy.py`` checks the table against the modules' own parsers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["COMMANDS", "build_parser", "main"]

# command -> (module under sandpod.cli, help); the order is the order of `sandpod --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("up", "start NATS, the services and a default sandbox here"),
    "exec": ("exec_cmd", "run a command in a sandbox"),
    "ping": ("exec_cmd", "round-trip time to a sandbox's execd"),
    "info": ("exec_cmd", "what a sandbox's execd is and its limits"),
    "create": ("sandbox_cmd", "create a sandbox and wait until Ready"),
    "ls": ("sandbox_cmd", "list sandboxes"),
    "get": ("sandbox_cmd", "show one sandbox (the whole object)"),
    "rm": ("sandbox_cmd", "delete sandboxes (and their instances)"),
    "renew": ("sandbox_cmd", "extend a sandbox's lifetime"),
    "pause": ("sandbox_cmd", "pause a sandbox"),
    "resume": ("sandbox_cmd", "resume a sandbox"),
    "network": ("network_cmd", "show or change a sandbox's egress policy"),
    "snapshot": ("snapshot_cmd", "snapshots of sandboxes: create, ls, get, rm"),
    "fork": ("snapshot_cmd", "start sandboxes with a sandbox's files (a snapshot)"),
    "template": ("template_cmd", "templates: build, get"),
    "pool": ("pool_cmd", "warm pools: create, ls, get, scale, rm"),
    "claim": ("pool_cmd", "claim a ready sandbox from a pool"),
    "claims": ("pool_cmd", "list claims"),
    "volume": ("volume_cmd", "persistent volumes: create, ls, get, rm"),
    "release": ("pool_cmd", "end claims (their sandboxes go)"),
    "cp": ("fs_cmd", "copy a file into or out of a sandbox"),
    "ps": ("proc_cmd", "list a sandbox's background processes"),
    "logs": ("proc_cmd", "print (or follow) a background process's output"),
    "shell": ("pty_cmd", "an interactive terminal (pty) in a sandbox"),
    "watch": ("watch_cmd", "print file events in a sandbox as they happen"),
    "mcp": ("mcp_cmd", "serve Sandpod tools over MCP (stdio by default)"),
    "creds": ("creds_cmd", "credentials: a tenant's NATS credential"),
    "port-forward": ("portfwd_cmd", "forward local ports to a sandbox's ports"),
    "expose": ("portfwd_cmd", "a preview URL of a sandbox's port"),
    "image": ("image_cmd", "images in this node's store: pull, ls, rm, prune"),
    "secret": ("secret_cmd", "secrets the egress path injects as headers: set, ls, rm"),
}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse measures subcommand names without the indent it lists them with, so the longest
    ("port-forward") would wrap its help onto the next line: measure it with the indent."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.nargs == argparse.PARSER:
            self._action_max_length += self._indent_increment


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``sandpod`` parser, with real sub-parsers for ``command``'s module only.

    Args:
        command: the subcommand about to run; None builds every sub-parser (imports every
            module: for tests and documentation, not for a run).
    """
    parser = argparse.ArgumentParser(
        prog="sandpod",
        description="Sandboxes for AI agents, over NATS.",
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command is None:
        modules = dict.fromkeys(module for module, _ in COMMANDS.values())
    elif command in COMMANDS:
        modules = {COMMANDS[command][0]: None}
    else:  # help, or an unknown command: list every command, build none
        for name, (_, help_) in COMMANDS.items():
            sub.add_parser(name, help=help_, add_help=False)  # a stub: listed, never parsed
        return parser
    for module in modules:
        importlib.import_module(f"sandpod.cli.{module}").add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    # The top level has no options but -h: the first word, if any, is the subcommand.
    command = args_in[0] if args_in and not args_in[0].startswith("-") else ""
    args = build_parser(command).parse_args(args_in)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
