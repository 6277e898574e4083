"""Shared by the network tests: real jails with egress, and probes run from inside them.

:func:`egress_runtime` is a local runtime (as root) with an :class:`Egress` of its own (a unique
installation id, a registry in the test's directory); on exit it destroys every jail, stops the
egress and asserts nothing of it is left (links, table, gateway link, routes of its slice).
:func:`probe` runs a Python script *inside* a sandbox, as its unprivileged user, that tries
each ``host:port`` at once and reports what answered (a refusal says which step failed, the
connect or the reply, and after how long: a failure in CI tells a dropped SYN from a slow
server).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

from test_jail import run  # the jail's own way to run a command, as execd does

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.egress import Egress, EgressSettings
from sandpod_lifecycle.network.nft import Nft
from sandpod_lifecycle.runtime.base import InstanceSpec, InstanceStatus
from sandpod_lifecycle.runtime.installation import remove_cgroup_parents
from sandpod_lifecycle.runtime.local import LocalRuntime, LocalRuntimeConfig

ROOTFS: weakref.WeakKeyDictionary[LocalRuntime, Path] = weakref.WeakKeyDictionary()
PROBE = r"""
import json, socket, sys, time, concurrent.futures as cf
def reach(t):
    h, p = t.rsplit(":", 1)
    t0, step = time.monotonic(), "connect"
    try:
        s = socket.create_connection((h, int(p)), timeout=1.5)
        step = "reply"
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = s.recv(200)
        s.close()
        return data.decode(errors="replace").split("\r\n\r\n", 1)[-1].strip() or "connected"
    except OSError as e:
        return f"refused:{type(e).__name__} ({step}, {time.monotonic() - t0:.2f} s)"
with cf.ThreadPoolExecutor(32) as ex:
    print(json.dumps(dict(zip(sys.argv[1:], ex.map(reach, sys.argv[1:])))))
"""


def leftovers(egress: Egress) -> list[str]:
    """What of an installation's egress exists on the host (empty after a clean stop)."""
    left = []
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    prefix = f"sp{egress.installation_id[:6]}"
    left += [f"link {i['ifname']}" for i in links if i["ifname"].startswith(prefix)]
    tables = Nft().json("list tables inet")
    left += [
        f"table {t['table']['name']}"
        for t in tables
        if "table" in t and t["table"]["name"] == egress.table
    ]
    routes = subprocess.run(
        ["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    if egress.firewall is not None:
        net = egress.plan.slice
        octets = ".".join(str(net.network_address).split(".")[:2]) + "."
        left += [f"route {r}" for r in routes.splitlines() if r.startswith(octets) and prefix in r]
    routes6 = subprocess.run(
        ["ip", "-6", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    left += [f"route {r}" for r in routes6.splitlines() if prefix in r]
    return left


@contextlib.asynccontextmanager
async def egress_runtime(
    state: Path,
    rootfs: Path,
    gateway_uid: int = 0,
    log_group: int | None = None,
    *,
    proxy_port: int | None = None,
    ipv6: bool | None = None,
) -> AsyncIterator[tuple[LocalRuntime, Egress]]:
    ident = uuid.uuid4().hex[:10]
    egress = Egress(
        EgressSettings(
            registry=state / "net-ranges.json",
            gateway_uid=gateway_uid,
            log_group=log_group,
            proxy_port=proxy_port,
            ipv6=ipv6,
        ),
        ident,
        state,
        state / "net",
    )
    config = LocalRuntimeConfig(state_dir=state / "jails", cgroup_parent=f"sandpod-nt-{ident}")
    rt = LocalRuntime(config, egress=egress)
    await egress.start()
    ROOTFS[rt] = rootfs
    try:
        yield rt, egress
    finally:
        errors = []
        for sid in await rt.list():
            try:
                await rt.destroy(sid)
            except Exception as exc:  # still stop the egress, then report
                errors.append(exc)
        await egress.stop()
        remove_cgroup_parents(await rt.capabilities(), config.cgroup_parent)
        left = leftovers(egress)
        assert not errors and not left, f"destroy failed: {errors}; egress left behind: {left}"


async def make(rt: LocalRuntime, policy: NetworkPolicy | None) -> InstanceStatus:
    sid = f"n-{uuid.uuid4().hex[:10]}"
    return await rt.create(InstanceSpec(sandbox_id=sid, rootfs=ROOTFS[rt], network=policy))


async def ok(status: InstanceStatus, command: str | list[str]) -> str:
    out = await run(status, command)
    if out.returncode != 0:
        raise AssertionError((out.returncode, out.stderr.value().decode()))
    return out.stdout.value().decode()


async def probe(status: InstanceStatus, *targets: str) -> dict[str, str]:
    """target ("host:port") -> the HTTP body that answered, or ``refused:<error>``."""
    result: dict[str, str] = json.loads(await ok(status, ["python3", "-c", PROBE, *targets]))
    return result


def reached(results: dict[str, str]) -> set[str]:
    return {t for t, r in results.items() if not r.startswith("refused:")}
