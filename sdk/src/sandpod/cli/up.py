"""``sandpod up``: bring the embedded platform up on this machine and keep it running."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sandpod._jetstream_room import EVENTS_MAX_BYTES, MIN_EVENTS_BYTES
from sandpod.config import DEFAULT_STATE_DIR
from sandpod.supervisor import PlatformConfig, StartupError, Supervisor

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="start NATS, the services and a default sandbox here",
        description="Start the embedded platform (nats-server with JetStream, execd serving "
        "the sandbox 'default') in the foreground. Ctrl-C or SIGTERM stops everything.",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("SANDPOD_STATE_DIR", DEFAULT_STATE_DIR)).expanduser(),
        help="where NATS data, workspaces and logs live (default: %(default)s)",
    )
    p.add_argument("--nats-url", help="use an existing NATS instead of starting one")
    p.add_argument("--host", default="127.0.0.1", help="NATS listen address")
    p.add_argument("--port", type=int, default=4222, help="NATS port (default: %(default)s)")
    p.add_argument(
        "--sandbox", action="append", dest="sandboxes", help="sandbox id to serve (repeatable)"
    )
    p.add_argument("--prefix", default="sandpod", help="subject prefix")
    p.add_argument(
        "--runtime",
        choices=["auto", "local", "process"],
        default="auto",
        help="local: namespace jail (needs root); process: NO isolation; auto: local if root",
    )
    p.add_argument(
        "--gateway-port",
        type=int,
        default=8080,
        help="HTTP API and web terminal port (default: %(default)s)",
    )
    p.add_argument("--no-gateway", action="store_true", help="do not start the HTTP gateway")
    given = os.environ.get("SANDPOD_DEFAULT_ROOTFS")
    p.add_argument(
        "--default-rootfs",
        type=Path,
        default=Path(given) if given else None,
        help="a prepared default sandbox root filesystem (`python -m sandpod_image.debian` "
        "prints one; env SANDPOD_DEFAULT_ROOTFS); default: built in <state dir>/rootfs on "
        "first run (Debian, about a minute) and reused",
    )
    p.set_defaults(run=_run)


def _say(line: str) -> None:
    print(f"sandpod: {line}", flush=True)


def _events_max_bytes() -> int | None:
    """``SANDPOD_EVENTS_MAX_BYTES`` (the event stream's size), or None if it is no size."""
    given = os.environ.get("SANDPOD_EVENTS_MAX_BYTES", "").strip()
    if not given:
        return EVENTS_MAX_BYTES
    try:
        value = int(given)
    except ValueError:
        return None
    return value if value >= MIN_EVENTS_BYTES else None


def _run(args: argparse.Namespace) -> int:
    events_max_bytes = _events_max_bytes()
    if events_max_bytes is None:
        print(
            f"error: SANDPOD_EVENTS_MAX_BYTES must be a number of bytes, at least "
            f"{MIN_EVENTS_BYTES} (1 MiB); unset, {EVENTS_MAX_BYTES} (256 MiB)",
            file=sys.stderr,
        )
        return 2
    config = PlatformConfig(
        state_dir=args.state_dir.resolve(),
        nats_url=args.nats_url,
        host=args.host,
        port=args.port,
        sandboxes=tuple(args.sandboxes or ["default"]),
        prefix=args.prefix,
        runtime=args.runtime,
        gateway_port=None if args.no_gateway else args.gateway_port,
        default_rootfs=args.default_rootfs.resolve() if args.default_rootfs else None,
        events_max_bytes=events_max_bytes,
    )
    return asyncio.run(_up(config))


async def _up(config: PlatformConfig) -> int:
    sup = Supervisor(config, _say)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        starting = asyncio.ensure_future(sup.start())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 130
        stopper.cancel()
        try:
            starting.result()
        except StartupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        _banner(sup, config)
        exited = asyncio.ensure_future(sup.wait_any_exit())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({exited, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            child = exited.result()
            print(
                f"error: {child.name} exited unexpectedly with {child.proc.returncode}; "
                f"see {child.log_path}. Stopping everything.",
                file=sys.stderr,
            )
            return 1
        exited.cancel()
        await asyncio.gather(exited, return_exceptions=True)
        return 0
    finally:
        await sup.stop()
        _say("stopped")


def _runtime_line(runtime: str) -> str:
    if runtime == "local":
        how = "" if os.geteuid() == 0 else " (rootless: in a user namespace)"
        return f"local: each sandbox in its own namespace jail{how}; see `sandpod get <id>`"
    return f"process: NO ISOLATION, commands run on this host as {getpass.getuser()!r}"


def _rootfs_line(sup: Supervisor, sandbox: str) -> str:
    """What the first sandbox's root is made of; HOST ROOT loudly if its template asked."""
    if sup.runtime != "local":
        return "this host's own (process runtime: no jail)"
    # Display only: lifecycle flags a host-root base in the Isolated condition's text.
    if "rootfs: host root" in sup.isolation.get(sandbox, ""):
        return "HOST ROOT (template rootfs: /): sandbox code reads every world-readable host file"
    return sup.base.summary if sup.base is not None else "-"


def _network_line(runtime: str) -> str:
    """What a sandbox's network is on this runtime (its policy: ``sandpod network <sbx>``)."""
    if runtime != "local":
        return "this host's own (process runtime: no isolation)"
    if os.geteuid() != 0:
        return "loopback only (rootless: egress refused; run as root for egress)"
    return "egress under each sandbox's policy (public by default); `sandpod network <sbx>`"


def _credential_lines(sup: Supervisor, config: PlatformConfig) -> tuple[str, str]:
    """The banner's credential row, and the export a second terminal needs (if any)."""
    creds = sup.client_creds
    if creds is None:
        given = os.environ.get("SANDPOD_NATS_CREDS")
        return (given or "none (anonymous NATS)", "")
    default = Path(os.environ.get("SANDPOD_STATE_DIR", DEFAULT_STATE_DIR)).expanduser()
    found = default.resolve() == config.state_dir
    row = f"{creds}  (0600; NATS refuses anonymous clients"
    row += ", found by this user's CLI and SDK)" if found else ")"
    return row, "" if found else f"\n  export SANDPOD_NATS_CREDS={creds}"


def _banner(sup: Supervisor, config: PlatformConfig) -> None:
    first = config.sandboxes[0]
    creds_row, creds_export = _credential_lines(sup, config)
    print(
        f"""
Sandpod is up.
  NATS       {sup.nats_url}
  credential {creds_row}
  sandboxes  {", ".join(config.sandboxes)}
  runtime    {_runtime_line(sup.runtime)}
  isolation  {sup.isolation.get(first, "-")}
  rootfs     {_rootfs_line(sup, first)}
  network    {_network_line(sup.runtime)}
  workspace  {sup.workspaces.get(first, "?")}  (host path of /workspace in {first})
  logs       {sup.logs}
  gateway    {sup.gateway_url or "(not started)"}  (HTTP API, OpenAPI at /openapi.json)
  API key    {sup.api_key or "-"}  (tenant "default"; kept in the state dir)
  terminal   {(sup.gateway_url or "") + "/terminal" if sup.gateway_url else "-"}

Try it (in another terminal):
  export SANDPOD_NATS_URL={sup.nats_url}{creds_export}
  sandpod exec {first} -- date
  python -c 'from sandpod import Sandbox
  print(Sandbox.connect("{first}").exec("/workspace", "date").stdout)'

Ctrl-C stops everything.""",
        flush=True,
    )
