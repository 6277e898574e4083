"""What a local user without any Sandpod credential tries against `sandpod up`'s bus.

Run as an unprivileged user by ``test_bus_attacks.py`` (never imported). Prints one JSON object:

    anonymous URL PREFIX NODE SANDBOX MARKER
        connect with no credential; if that works: ask the node's execd to serve SANDBOX with
        no jail, then run ``id -u > MARKER`` in it (as root, on an unprotected bus)
    read STATE_DIR
        which of the state dir's secrets this user can list or read
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import nats

from sandpod_bus import Bus, BusSettings
from sandpod_contract.codec import decode_reply, encode
from sandpod_contract.errors import SandpodError
from sandpod_contract.messages.node import NodeSandboxes, Serve
from sandpod_contract.subjects import Subjects


async def anonymous(
    url: str, prefix: str, node: str, sandbox_id: str, marker: str
) -> dict[str, object]:
    try:
        nc = await nats.connect(
            url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5
        )
    except Exception as exc:  # any refusal is what we report
        return {"connected": False, "error": f"{type(exc).__name__}: {exc}"}
    await nc.close()
    out: dict[str, object] = {"connected": True}
    subjects = Subjects(prefix)
    bus = await Bus.connect(BusSettings(url=url, name="attacker"))
    try:
        try:
            reply = await bus.request(
                subjects.node(node, "execd", "serve"), encode(Serve(sandbox_id=sandbox_id)), 15
            )
            out["served"] = list(decode_reply(NodeSandboxes, reply).sandbox_ids)
        except SandpodError as exc:
            out["serve_error"] = exc.code
        from sandpod import AsyncSandbox

        sbx = await AsyncSandbox.connect(sandbox_id, bus=bus, prefix=prefix)
        try:
            result = await sbx.exec("/", ["sh", "-c", f"id -u > {marker}; id -u"], timeout=15)
            out["exec_uid"] = result.stdout.strip()
        except SandpodError as exc:
            out["exec_error"] = exc.code
    finally:
        await bus.close()
    return out


def read(state: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    try:
        out["listing"] = sorted(os.listdir(state))
    except OSError as exc:
        out["listing_error"] = exc.strerror
    for name in (
        "nats-auth/client.creds",
        "nats-auth/lifecycle.creds",
        "nats-auth/account.seed",
        "nats.conf",
        "logs/lifecycle.log",
        "logs/nats.log",
    ):
        try:
            (state / name).read_bytes()
            out[name] = "read"
        except OSError as exc:
            out[name] = exc.strerror
    return out


def main() -> None:
    mode, *args = sys.argv[1:]
    result = asyncio.run(anonymous(*args)) if mode == "anonymous" else read(Path(args[0]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
