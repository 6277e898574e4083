"""Each sandbox's link out of its network namespace: a veth pair, addressed as a /31 (and a
/127 when the installation gives IPv6).

The host end is named ``sp<installation id, 6 hex>-<index>`` (at most 15 characters, as the
kernel wants; the firewall matches an installation's sandboxes by that prefix), the sandbox end
is ``eth0`` and is created directly inside the holder's network namespace (``peer ... netns
<holder pid>``), so it never exists on the host. Inside, the sandbox gets its address and a
default route via the host end; code in the sandbox has no ``CAP_NET_ADMIN`` there (its user is
unprivileged), so it cannot change either.

The installation's *gateway address* (where the resolver and proxy listen) sits on a veth pair
of its own kept on the host (``sp<id>g`` / ``sp<id>h``): deleting that link removes the address
(no dummy interface is needed, which some kernels lack).

IPv6 on a link: the sandbox end gets ``addrgenmode none`` (no link-local address of its own:
it sends from its /127 address only), the host end keeps its link-local address (the kernel
sends a neighbour solicitation for a *forwarded* packet only from a link-local address; the
firewall lets a sandbox reach it for neighbour discovery only); duplicate address detection
is off on both (``nodad``, ``accept_dad=0``: usable at once, not 1-2 s later, on a link that
has two ends by construction); the host end accepts no router advertisements.
Without IPv6 the host end's IPv6 is disabled (no link-local address either).

A sandbox's link is made with rtnetlink requests from this process (``rtnl.py``: no process
spawned, about a millisecond; the inside end from a thread that joined the holder's network
namespace); the rest (the gateway's link, teardown, listings) by iproute2, bandwidth by tc.
``create`` returns once the host end is operational, not only up (``_wait_operational``): the
kernel activates a veth end that came up before its peer later, and until then drops what
the host sends the sandbox.
These functions block, callers run them in a thread. Teardown is ``ip link del`` of the host
end (the kernel removes the peer and the /31's route with it); a holder that died took its
end, and with it both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import re
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from sandpod_lifecycle.network import rtnl
from sandpod_lifecycle.network.addressing import SandboxAddresses

__all__ = ["LinkError", "LinkNames", "host_links", "host_networks", "host_networks6", "run"]

SANDBOX_IFACE = "eth0"
OURS = re.compile(r"sp[0-9a-f]{6}[-gh]")  # any installation's links (see LinkNames)
TIMEOUT = 10.0
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


class LinkError(Exception):
    """An iproute2/tc command failed. ``detail`` is its stderr (for people, never matched)."""

    code = "network.link_failed"
    retryable = True

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(f"{message}: {detail}" if detail else message)
        self.message = message
        self.detail = detail


def run(argv: Sequence[str], stdin: str | None = None) -> str:
    """Run an iproute2/tc command; its stdout. Raises LinkError."""
    return _run(argv, stdin)


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            env=ENV,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LinkError(f"cannot run {argv[0]}", detail=str(exc)) from exc
    if done.returncode != 0:
        raise LinkError(f"{' '.join(argv[:4])} failed", detail=done.stderr.strip()[-500:])
    return done.stdout


@dataclasses.dataclass(frozen=True, slots=True)
class LinkNames:
    """Interface names of one installation (see the module docstring)."""

    tag: str  # 6 hex digits of the installation id

    @classmethod
    def of(cls, installation_id: str) -> LinkNames:
        return cls(installation_id[:6])

    @property
    def sandbox_prefix(self) -> str:
        return f"sp{self.tag}-"

    @property
    def gateway(self) -> str:
        return f"sp{self.tag}g"

    @property
    def gateway_peer(self) -> str:
        return f"sp{self.tag}h"

    def sandbox(self, index: int) -> str:
        return f"{self.sandbox_prefix}{index}"

    # -- the gateway address -------------------------------------------------------------------

    def ensure_gateway(
        self, gateway: ipaddress.IPv4Address, gateway6: ipaddress.IPv6Address | None = None
    ) -> None:
        """Create the gateway's link with ``gateway``/32 (and ``gateway6``/128) on it
        (idempotent)."""
        if not _exists(self.gateway):
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    self.gateway,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    self.gateway_peer,
                ]
            )
        _no_ipv6(self.gateway_peer)
        if gateway6 is None:
            _no_ipv6(self.gateway)
        else:
            _ipv6_static(self.gateway)
        v6 = (
            ()
            if gateway6 is None
            else (f"address replace {gateway6}/128 dev {self.gateway} nodad",)
        )
        _run(
            ["ip", "-batch", "-"],
            stdin="\n".join(
                (
                    f"address replace {gateway}/32 dev {self.gateway}",
                    *v6,
                    f"link set {self.gateway} up",
                    f"link set {self.gateway_peer} up",
                )
            )
            + "\n",
        )

    def remove_gateway(self) -> None:
        delete(self.gateway)

    # -- sandboxes -----------------------------------------------------------------------------

    def create(self, addrs: SandboxAddresses, holder_pid: int) -> str:
        """The veth of sandbox ``addrs.index`` into the netns of ``holder_pid``, addressed and
        routed; returns the host end's name. A leftover of the same name is replaced.

        Raises:
            LinkError: a step failed (the caller deletes the host end).
        """
        name = self.sandbox(addrs.index)
        delete(name)
        try:
            with rtnl.Rtnl() as nl:
                nl.add_veth(name, SANDBOX_IFACE, holder_pid)
                host = nl.index(name)
                if addrs.host6 is None or addrs.sandbox6 is None:
                    _no_ipv6(name)
                else:
                    _ipv6_static(name)
                    nl.add_address(host, addrs.host6, 127)
                nl.add_address(host, addrs.host, 31)
                nl.set_up(host)
            rtnl.in_netns_of(holder_pid, lambda: _inside(addrs))
            _wait_operational(name, host)
        except rtnl.RtnlError as exc:
            raise LinkError(f"cannot set up the link {name}", detail=str(exc)) from exc
        return name

    def links(self, names: Sequence[str] | None = None) -> list[str]:
        """Host ends of this installation's sandboxes that exist now (among ``names``, a
        :func:`host_links` taken earlier, when given)."""
        names = host_links() if names is None else names
        return sorted(n for n in names if n.startswith(self.sandbox_prefix))


def _wait_operational(name: str, index: int, timeout: float = TIMEOUT) -> None:
    """Return once host end ``name`` (interface ``index``) can send.

    The host end comes up before its peer, so its carrier comes from the peer's open, and the
    kernel activates its transmit queue (until then the noop queue, which drops everything)
    and sets its operstate later, from its linkwatch work, which waits for the rtnl lock: a
    busy host (namespaces made and torn down) delays it. A sandbox that is Ready before then
    loses what the host sends it, its first ARP reply included (its first connection waits a
    1 s ARP retry, or times out). Linkwatch sets the operstate and activates the queue in one
    hold of the lock, so once the operstate is up one more request under the lock (setting
    the link up again changes nothing) returns only after the queue is active.

    Raises:
        LinkError: not operational within ``timeout`` seconds, or the link is gone.
    """
    state = Path("/sys/class/net", name, "operstate")
    deadline = time.monotonic() + timeout
    pause = 0.0005
    while True:
        try:
            now = state.read_text().strip()
        except OSError as exc:  # its holder died: the kernel removed both ends
            raise LinkError(f"the link {name} is gone", detail=str(exc)) from exc
        if now == "up":
            break
        if time.monotonic() > deadline:
            raise LinkError(f"the link {name} is not operational after {timeout:g} s", detail=now)
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    with rtnl.Rtnl() as nl:
        nl.set_up(index)


def host_links() -> list[str]:
    """The names of every link in the host's network namespace (no subprocess)."""
    return [name for _, name in socket.if_nameindex()]


def _inside(addrs: SandboxAddresses) -> None:
    """The sandbox end, from a thread in its network namespace: addressed, up, routed."""
    with rtnl.Rtnl() as nl:
        eth0 = nl.index(SANDBOX_IFACE)
        if addrs.host6 is not None and addrs.sandbox6 is not None:
            nl.no_ipv6_addrgen(eth0)  # it sends from its /127 only (module docstring)
            nl.add_address(eth0, addrs.sandbox6, 127)
        nl.add_address(eth0, addrs.sandbox, 31)
        nl.set_up(eth0)
        nl.add_default_route(eth0, addrs.host)
        if addrs.host6 is not None and addrs.sandbox6 is not None:
            nl.add_default_route(eth0, addrs.host6)


def delete(name: str) -> None:
    """Remove a link (and its veth peer) if it exists."""
    if _exists(name):
        with contextlib.suppress(LinkError):  # gone meanwhile (its namespace died)
            _run(["ip", "link", "del", name])
    if _exists(name):
        raise LinkError(f"cannot remove the link {name}")


def set_bandwidth(name: str, holder_pid: int, bytes_per_second: int | None) -> None:
    """Limit the sandbox behind host end ``name`` (its holder: ``holder_pid``) to
    ``bytes_per_second`` each way (None: no limit): a token bucket on each end's egress -- the
    host end's shapes its downloads, the sandbox end's (set from outside; code in the sandbox
    has no CAP_NET_ADMIN to remove it) its uploads. Ingress policing would spare the second,
    but needs tc's police action, which not every kernel has."""
    inside = ["nsenter", f"--target={holder_pid}", "--net", "--"]
    for prefix, dev in (([], name), (inside, SANDBOX_IFACE)):
        if _has_qdisc([*prefix, "tc"], dev):
            _run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"])
        if bytes_per_second is not None:
            _run([*prefix, *_tbf(dev, bytes_per_second)])


def _tbf(dev: str, bytes_per_second: int) -> list[str]:
    rate = f"{bytes_per_second * 8}bit"
    burst = max(bytes_per_second // 10, 16 * 1024)
    return [
        "tc",
        "qdisc",
        "add",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        str(burst),
        "latency",
        "100ms",
    ]


def host_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks this host already routes or holds addresses in (every table)."""
    nets: list[ipaddress.IPv4Network] = []
    for item in json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        dst = item.get("dst") if isinstance(item, dict) else None
        if OURS.match(str(item.get("dev", "")) if isinstance(item, dict) else ""):
            continue  # a Sandpod installation's own links: its slice is in the registry
        if isinstance(dst, str) and dst not in ("default", "0.0.0.0/0"):
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(dst, strict=False))
    return nets


def host_networks6() -> list[ipaddress.IPv6Network]:
    """IPv6 networks this host already routes or holds addresses in (every table)."""
    nets: list[ipaddress.IPv6Network] = []
    for item in json.loads(_run(["ip", "-j", "-6", "route", "show", "table", "all"]) or "[]"):
        if not isinstance(item, dict) or OURS.match(str(item.get("dev", ""))):
            continue
        dst = item.get("dst")
        if isinstance(dst, str) and dst not in ("default", "::/0"):
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv6Network(dst, strict=False))
    return nets


def _exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _has_qdisc(tc: list[str], name: str) -> bool:
    out = _run([*tc, "-j", "qdisc", "show", "dev", name, "root"])
    return any(isinstance(q, dict) and q.get("kind") == "tbf" for q in json.loads(out or "[]"))


def _ipv6_static(name: str) -> None:
    """IPv6 on a host end, static only: no router advertisements taken, no duplicate address
    detection (see the module docstring)."""
    conf = Path(f"/proc/sys/net/ipv6/conf/{name}")
    with contextlib.suppress(OSError):
        (conf / "accept_ra").write_text("0")
        (conf / "accept_dad").write_text("0")
        (conf / "disable_ipv6").write_text("0")


def _no_ipv6(name: str) -> None:
    """No IPv6 on a host end: no link-local address for a sandbox to talk to."""
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")
