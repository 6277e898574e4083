"""The ``keys`` commands: bootstrap the first API key, list keys, revoke one."""

from __future__ import annotations

import argparse
import sys

from sandpod_bus import Bus
from sandpod_contract.errors import SandpodError
from sandpod_contract.times import to_rfc3339
from sandpod_gateway.keys import KeyStore
from sandpod_gateway.settings import GatewaySettings

__all__ = ["run_keys"]


async def run_keys(settings: GatewaySettings, args: argparse.Namespace) -> int:
    try:
        bus = await Bus.connect(settings.bus)
    except SandpodError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    try:
        store = await KeyStore.open(bus, settings.bucket_base)
        if args.action == "create":
            token, record = await store.create(
                args.tenant, args.name, admin=args.admin, permanent=args.allow_permanent
            )
            print(token)
            print(
                f"key id {record.key_id} for tenant {record.tenant}: store it now, it is not "
                "shown again",
                file=sys.stderr,
            )
        elif args.action == "list":
            for k in await store.list():
                created = to_rfc3339(k.created)
                state = "revoked" if k.revoked else "active"
                flags = (
                    ",".join(f for f, on in (("admin", k.admin), ("permanent", k.permanent)) if on)
                    or "-"
                )
                print(f"{k.key_id}  {k.tenant:<30} {state:<8} {created}  {flags:<15} {k.name}")
        else:
            record = await store.revoke(args.key_id)
            print(f"revoked {record.key_id} (tenant {record.tenant})")
        return 0
    except (SandpodError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await bus.drain()
