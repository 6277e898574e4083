"""The network of a real test node: a network namespace of its own, linked to the host.

Everything the node runs (etcd, kube-apiserver, the controllers, kubelet, kube-proxy, containerd,
the cluster DNS and every Pod) lives in the namespace ``spnode-<id>``, so its routes, nftables
rules (kube-proxy's) and listening ports touch nothing on the host and nothing of another
installation. One veth pair joins it to the host:

    host  spn<id>  10.200.K.1/30  --- route 10.201.K.0/24 via the node --->  Pods (cni0 bridge)
    node  eth0     10.200.K.2/30      API server :6443, kubelet, DNS :53, Pods' gateway

``K`` is the first third octet whose two /24s no host address or route uses. Nothing is
masqueraded and there is no default route out: a Pod reaches the node, other Pods and Services,
and the host's test processes on 10.200.K.1, never the internet. :meth:`NodeNet.down` deletes the
namespace (and with it the veth, the bridge and every rule in it) and the host route.

Processes enter with ``nsenter --net`` (not ``ip netns exec``, which also gives each one a
mount namespace of its own: kubelet's volume mounts must be seen by containerd and runc).
"""

from __future__ import annotations

import ipaddress
import subprocess
import uuid
from dataclasses import dataclass

__all__ = ["NodeNet"]

SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"


def _ip(*args: str, netns: str | None = None) -> str:
    argv = ["ip", *(("-n", netns) if netns else ()), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _used_networks() -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        first = line.split()[0] if line.split() else ""
        if first in ("default", "broadcast", "local", "unreachable", "prohibit"):
            first = line.split()[1] if len(line.split()) > 1 else ""
        try:
            used.append(ipaddress.IPv4Network(first, strict=False))
        except ValueError:
            continue
    return used


@dataclass(frozen=True, slots=True)
class NodeNet:
    """The addresses of one node (see the module docstring)."""

    ident: str
    octet: int

    @property
    def netns(self) -> str:
        return f"spnode-{self.ident}"

    @property
    def host_if(self) -> str:
        return f"spn{self.ident}"

    @property
    def host_ip(self) -> str:
        return f"10.200.{self.octet}.1"

    @property
    def node_ip(self) -> str:
        return f"10.200.{self.octet}.2"

    @property
    def pod_cidr(self) -> str:
        return f"10.201.{self.octet}.0/24"

    @property
    def service_cidr(self) -> str:
        return SERVICE_CIDR

    def enter(self) -> list[str]:
        """The argv prefix that runs a command in the node's network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"]

    @classmethod
    def up(cls) -> NodeNet:
        """Create the namespace and its link on the first free pair of /24s."""
        used = _used_networks()
        for octet in range(1, 255):
            mine = (
                ipaddress.IPv4Network(f"10.200.{octet}.0/24"),
                ipaddress.IPv4Network(f"10.201.{octet}.0/24"),
            )
            if not any(net.overlaps(u) for net in mine for u in used if u.prefixlen > 0):
                break
        else:
            raise RuntimeError("no free 10.200.K.0/24 + 10.201.K.0/24 pair for a test node")
        net = cls(uuid.uuid4().hex[:6], octet)
        _ip("netns", "add", net.netns)
        try:
            _ip(
                "link",
                "add",
                net.host_if,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                net.netns,
            )
            _ip("addr", "add", f"{net.host_ip}/30", "dev", net.host_if)
            _ip("link", "set", net.host_if, "up")
            _ip("addr", "add", f"{net.node_ip}/30", "dev", "eth0", netns=net.netns)
            _ip("link", "set", "eth0", "up", netns=net.netns)
            _ip("link", "set", "lo", "up", netns=net.netns)
            _ip("route", "add", net.pod_cidr, "via", net.node_ip, "dev", net.host_if)
            # A route for Service IPs, so the node's own processes may connect to one (kube-
            # proxy's output-hook DNAT rewrites it before the packet leaves).
            _ip("route", "add", SERVICE_CIDR, "dev", "eth0", netns=net.netns)
            sysctl = ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]
            subprocess.run([*net.enter(), *sysctl], check=True)
        except BaseException:
            net.down()
            raise
        return net

    def down(self) -> None:
        """Delete the namespace, the veth and the host route (idempotent)."""
        route = ["ip", "route", "del", self.pod_cidr, "dev", self.host_if]  # ours, not a twin's
        subprocess.run(route, capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
