"""A fake internet for the real node's Pods: a network namespace joined to the node's, and nothing
else (tests/node/test_real_netguard.py).

The node (``k8s/nodenet.py``) has no way out; this gives its Pods one, confined to two
namespaces the test owns. :meth:`NodeInternet.create` adds:

    node netns  spi<tag>  10.202.K.1/30  -- route <public>/24 via 10.202.K.2 -->
    spinet-<tag>  eth0    10.202.K.2/30, default route back to the node
                  lo      <public>.10 and .11: HTTP on port 80 (``fakenet_server.py``: answers
                          ``fakenet public`` / ``fakenet public2``), .10 on 8080 too

``<public>`` is a /24 of 11.0.0.0/8 (not one of ``SPECIAL_RANGES``: a "public" address, which a
guard in public mode would let through), known only inside the node's namespace: the host has no
route to it and no host address or route is touched. DNS is not here: the test serves its names
(``tests/dnsauth.py``) on the host end of the node's link, which Pods reach already.
:meth:`NodeInternet.close` kills the server and deletes the namespace (its veth, and with it the
node's route, goes too).
"""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from pathlib import Path

from kubernetes import client

from k8s.cluster import NS, Cluster
from k8s.nodenet import NodeNet

__all__ = ["PROBE", "PROBE_PY", "NodeInternet", "pod_ip"]

SERVER = Path(__file__).parent.parent / "fakenet_server.py"
# A TCP connect to HOST PORT: "reached" or "refused:<error>"; never hangs (1.5 s).
PROBE_PY = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
    print("reached")
except OSError as e:
    print("refused:" + type(e).__name__)
"""
PROBE = f"python3 -c '{PROBE_PY}' "


def _ip(*args: str, netns: str | None = None, check: bool = True) -> None:
    argv = ["ip", *(("-n", netns) if netns else ()), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


class NodeInternet:
    """See the module docstring. ``public`` and ``public2`` serve HTTP on port 80, ``public``
    on 8080 too."""

    def __init__(self, node: NodeNet) -> None:
        self.node = node
        self.tag = uuid.uuid4().hex[:6]
        self.netns = f"spinet-{self.tag}"
        self.node_if = f"spi{self.tag}"
        self.node_end = f"10.202.{node.octet}.1"
        self.far_end = f"10.202.{node.octet}.2"
        rnd = random.Random()
        self.public_net = f"11.{rnd.randrange(256)}.{rnd.randrange(256)}.0/24"
        base = self.public_net.rsplit(".", 1)[0]
        self.public, self.public2 = f"{base}.10", f"{base}.11"
        self._server: subprocess.Popen[str] | None = None

    def create(self) -> None:
        ns, node = self.netns, self.node.netns
        _ip("netns", "add", ns)
        try:
            _ip("link", "add", self.node_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", self.node_if, "netns", node)
            _ip("addr", "add", f"{self.node_end}/30", "dev", self.node_if, netns=node)
            _ip("link", "set", self.node_if, "up", netns=node)
            _ip("addr", "add", f"{self.far_end}/30", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)
            for address in (self.public, self.public2):
                _ip("addr", "add", f"{address}/32", "dev", "lo", netns=ns)
            _ip("route", "add", "default", "via", self.node_end, netns=ns)
            _ip("route", "add", self.public_net, "via", self.far_end, netns=node)
            self._server = subprocess.Popen(
                [
                    *("ip", "netns", "exec", ns, sys.executable, str(SERVER)),
                    f"public={self.public}:80",
                    f"public-8080={self.public}:8080",
                    f"public2={self.public2}:80",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self._server.stdout is not None
            if (line := self._server.stdout.readline()).strip() != "ready":
                raise RuntimeError(f"the fake internet's servers did not start: {line!r}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._server is not None:
            self._server.kill()
            self._server.wait()
            if self._server.stdout is not None:
                self._server.stdout.close()
            self._server = None
        # The veth's node end goes with its peer, and the node's route with the veth.
        _ip("link", "del", self.node_if, netns=self.node.netns, check=False)
        _ip("netns", "del", self.netns, check=False)

    def leftovers(self) -> list[str]:
        """What of it still exists (the test asserts none)."""
        left = [f"netns {self.netns}"] if Path("/run/netns", self.netns).exists() else []
        done = subprocess.run(
            ["ip", "-n", self.node.netns, "route", "show", self.public_net],
            capture_output=True,
            text=True,
            check=False,
        )
        return left + [f"route {r}" for r in done.stdout.splitlines()]


def pod_ip(cluster: Cluster, name: str) -> str:
    """A sandbox Pod's address, as the API server has it."""
    with cluster.plane.settings.api_client() as api:
        pod = client.CoreV1Api(api).read_namespaced_pod(name, NS)
    assert pod.status is not None and pod.status.pod_ip, pod.status
    return str(pod.status.pod_ip)
