"""``sandpod secret set|ls|rm``: the node's secrets for header injection, used directly.

A template or sandbox policy names a secret in ``network.inject`` (``{"domain":
"api.example.com", "secret": "openai"}``); the node's egress proxy adds it as a header to that
domain's requests, and the sandbox only ever sees ``sandpod-placeholder-<name>``. The values
live in ``<state dir>/secrets`` (``--state-dir``, else ``$SANDPOD_STATE_DIR``, else
``~/.local/state/sandpod``), one file each, mode 0600, readable by the platform's user only;
like ``sandpod image``, this works on the node's store without a service, so the value never
crosses the bus. ``set`` reads the value from stdin (or ``--from-file``), never from the
command line, where other local users could read it in the process list.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandpod.config import DEFAULT_STATE_DIR

__all__ = ["add_parsers"]

EXIT_ERROR = 1
STORE = "sandpod_lifecycle.network.secretstore"  # installed with sandpod[up] (make install)


def add_parsers(sub: Any) -> None:
    secret = sub.add_parser(
        "secret", help="secrets the egress path injects as headers: set, ls, rm"
    )
    secret.add_argument("--state-dir", help=f"state directory (default: {DEFAULT_STATE_DIR})")
    verbs = secret.add_subparsers(dest="verb", required=True)
    put = verbs.add_parser("set", help="store a secret (the value from stdin or --from-file)")
    put.add_argument("name", help="the name policies use in network.inject[].secret")
    put.add_argument("--from-file", help="read the value from this file instead of stdin")
    verbs.add_parser("ls", help="list the stored secrets' names (never their values)")
    rm = verbs.add_parser("rm", help="delete secrets")
    rm.add_argument("names", nargs="+")
    secret.set_defaults(run=_cmd)


def _cmd(a: argparse.Namespace) -> int:
    """Run the platform's store (``sandpod_lifecycle.network.secretstore``) in its own process:
    the SDK never imports a service, it runs one, as ``sandpod up`` does. stdin passes through."""
    state = Path(a.state_dir or os.environ.get("SANDPOD_STATE_DIR") or DEFAULT_STATE_DIR)
    args = [a.verb, *([a.name] if a.verb == "set" else getattr(a, "names", []))]
    if a.verb == "set" and a.from_file:
        args += ["--from-file", a.from_file]
    argv = [sys.executable, "-m", STORE, "--dir", str(state.expanduser() / "secrets"), *args]
    try:
        return subprocess.run(argv, check=False).returncode
    except OSError as exc:
        print(f"error: cannot run the secret store: {exc}", file=sys.stderr)
        return EXIT_ERROR
