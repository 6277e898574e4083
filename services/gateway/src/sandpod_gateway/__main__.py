"""``python -m sandpod_gateway``: serve the HTTP API (default), manage API keys, print OpenAPI.

python -m sandpod_gateway                       # serve until SIGTERM
python -m sandpod_gateway keys create --tenant acme [--name ci] [--admin] [--allow-permanent]
python -m sandpod_gateway keys list
python -m sandpod_gateway keys revoke <key_id>
python -m sandpod_gateway openapi               # the OpenAPI document (schemas/openapi/)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from sandpod_gateway.settings import GatewaySettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sandpod-gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("serve", help="serve the HTTP API (the default)")
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="action", required=True
    )
    create = keys.add_parser("create", help="create a key and print it (shown once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    create.add_argument(
        "--admin",
        action="store_true",
        help="the key may read /metrics (SANDPOD_GATEWAY_METRICS_AUTH=admin)",
    )
    create.add_argument(
        "--allow-permanent",
        action="store_true",
        help="the key may create permanent sandboxes (spec.permanent: true)",
    )
    keys.add_parser("list", help="list keys (ids, tenants, revoked)")
    revoke = keys.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id")
    sub.add_parser("openapi", help="print the OpenAPI document")
    args = parser.parse_args(argv)
    try:
        settings = GatewaySettings.from_env()
    except ValueError as exc:
        print(f"sandpod-gateway: bad settings: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "openapi":
        from sandpod_gateway.openapi import spec

        print(json.dumps(spec(), indent=2, sort_keys=True))
        return 0
    if args.cmd == "keys":
        from sandpod_gateway.keys_cli import run_keys

        return asyncio.run(run_keys(settings, args))
    return _serve(settings)


def _serve(settings: GatewaySettings) -> int:
    from sandpod_gateway.service import GatewayService
    from sandpod_service import serve

    service = GatewayService(settings)
    coro = serve(service, settings.bus, grace=settings.grace, log_level=settings.log_level)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


if __name__ == "__main__":
    sys.exit(main())
