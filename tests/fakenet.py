"""A fake internet made of a network namespace the test creates (issue 15's test bed).

:class:`FakeNet` builds, with unique names per run so concurrent runs never collide:

- a network namespace ``fn<tag>`` joined to the host by a veth (``fn<tag>h`` on the host,
  a /30 from 172.31.0.0/16), with a default route back through the host;
- "public" addresses that are NOT in ``SPECIAL_RANGES``: a /24 of 11.0.0.0/8 (``public``:
  ``.10`` runs HTTP on ports 80 and 8080 and UDP sinks, ``.11`` a second HTTP server), routed
  by the host into the namespace (UDP sinks on ``public`` ports 9999 and 53: they log what
  they receive, never answer);
- the cloud metadata server at 169.254.169.254:80 (a host route with a unique metric);
- a "private" service on a 10.x address (outside the sandbox pool), port 80;
- :meth:`host_service`: a TCP server of the test's own bound to 0.0.0.0 on the host.

With ``ipv6=True`` it has an IPv6 side too: a ULA /64 on the veth, "public" v6 addresses
``public6``/``public6b`` in a /64 of ``3fff::/20`` (a range not in ``SPECIAL_RANGES``), a
ULA service ``private6`` (a /64 of ``fd7e::/16``: special, like 10.x) and the IPv6 metadata
address fd00:ec2::254, each serving HTTP on port 80 (UDP sink on ``public6`` port 9999),
routed by the host into the namespace.

With ``tls_cert`` (a PEM holding a certificate and its key), ``public`` and ``public2`` also
serve HTTPS on port 443 with it (as ``public-tls``, ``public2-tls``).

HTTP answers ``fakenet <name>`` (``fakenet_server.py``), ``GET /udp`` lists what the UDP sink
received (the spoofing test), ``GET /bytes/<n>`` sends n bytes (throughput). DNS is not here:
the resolver's tests bring their own server on these addresses (``add_address`` gives more).
``close`` removes the namespace, its veth, every route and the server; ``leftovers`` says what
of it still exists (tests assert it is empty).

Every FakeNet holds an exclusive lock on ``/run/sandpod-fakenet/fn<tag>.lock`` from before its
namespace exists until it is gone. A run killed mid-test (SIGKILL, a CI timeout) cannot close
its FakeNet, and what it leaves is harmful: its host routes to the *shared* metadata addresses
lead to a namespace whose server died, so another FakeNet's metadata with a higher metric
answers with a reset. ``create`` therefore first removes every ``fn<tag>`` namespace whose lock
nobody holds (or that has no lock file), with its veth, routes and processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

__all__ = ["FakeNet"]

SERVER = Path(__file__).with_name("fakenet_server.py")
PRIVATE_POOL_AVOID = ipaddress.ip_network("10.240.0.0/12")  # sandbox pools live here
LOCKS = Path("/run/sandpod-fakenet")  # fn<tag>.lock: held by the process owning that FakeNet
NAME = re.compile(r"fn[0-9a-f]{8}")


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _routes() -> list[ipaddress.IPv4Network]:
    out = json.loads(_ip("-j", "-4", "route", "show", "table", "all") or "[]")
    nets = []
    for r in out:
        with contextlib.suppress(ValueError):
            if r.get("dst") not in (None, "default"):
                nets.append(ipaddress.IPv4Network(r["dst"], strict=False))
    return nets


def _free(candidates: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    taken = _routes()
    for net in candidates:
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free test network")


def _reap_stale() -> list[str]:
    """Remove the fake internets of runs that died without closing them (see the module
    docstring); returns their names."""
    listed = json.loads(_ip("-j", "netns", "list", check=False) or "[]")
    reaped = []
    for name in (str(n.get("name", "")) for n in listed):
        if not NAME.fullmatch(name):
            continue
        lock = LOCKS / f"{name}.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = None  # a FakeNet locks before its namespace exists: this one is a leftover
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its owner runs
            for pid in _ip("netns", "pids", name, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            _ip("link", "del", f"{name}h", check=False)  # its routes go with it
            _ip("netns", "del", name, check=False)
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            reaped.append(name)
        finally:
            if fd is not None:
                os.close(fd)
    return reaped


class FakeNet:
    """See the module docstring. Use as a context manager, or call ``create``/``close``."""

    def __init__(self, tls_cert: Path | None = None, *, ipv6: bool = False) -> None:
        self.tls_cert = tls_cert
        self.ipv6 = ipv6
        self.tag = uuid.uuid4().hex[:8]
        self.netns = f"fn{self.tag}"
        self.host_if = f"fn{self.tag}h"
        rnd = random.Random()
        self.link = _free(
            [
                ipaddress.IPv4Network(f"172.31.{rnd.randrange(256)}.{4 * rnd.randrange(64)}/30")
                for _ in range(64)
            ]
        )
        self.public_net = _free(
            [
                ipaddress.IPv4Network(f"11.{rnd.randrange(256)}.{rnd.randrange(256)}.0/24")
                for _ in range(64)
            ]
        )
        private = [
            ipaddress.IPv4Network(f"10.{rnd.randrange(256)}.{rnd.randrange(256)}.0/24")
            for _ in range(64)
        ]
        self.private_net = _free([p for p in private if not p.overlaps(PRIVATE_POOL_AVOID)])
        hosts = list(self.link.hosts())
        self.host_addr, self.ns_addr = str(hosts[0]), str(hosts[1])
        self.public = str(self.public_net.network_address + 10)
        self.public2 = str(self.public_net.network_address + 11)
        self.private = str(self.private_net.network_address + 10)
        self.metadata = "169.254.169.254"
        self.udp_port = 9999
        self.metric = 1000 + rnd.randrange(60000)
        r1, r2, r3 = (f"{rnd.randrange(1, 0xFFFF):x}" for _ in range(3))
        self.link6 = ipaddress.IPv6Network(f"fd7e:{r1}:{r2}:1::/64")
        self.host_addr6, self.ns_addr6 = str(self.link6[1]), str(self.link6[2])
        self.public6_net = ipaddress.IPv6Network(f"3fff:{r3[:3]}:{r1}:{r2}::/64")
        self.public6 = str(self.public6_net[0x10])
        self.public6b = str(self.public6_net[0x11])
        self.private6_net = ipaddress.IPv6Network(f"fd7e:{r1}:{r2}:2::/64")
        self.private6 = str(self.private6_net[0x10])
        self.metadata6 = "fd00:ec2::254"
        self._server: subprocess.Popen[str] | None = None
        self._host_socks: list[socket.socket] = []
        self._routes: list[list[str]] = []
        self._lock: int | None = None

    def __enter__(self) -> FakeNet:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        ns = self.netns
        _reap_stale()
        LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = os.open(LOCKS / f"{ns}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            _ip("netns", "add", ns)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("address", "add", f"{self.host_addr}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("link", "set", "lo", "up", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            _ip("address", "add", f"{self.ns_addr}/30", "dev", "eth0", netns=ns)
            _ip("route", "add", "default", "via", self.host_addr, netns=ns)
            for addr in (self.public, self.public2, self.private, self.metadata):
                _ip("address", "add", f"{addr}/32", "dev", "lo", netns=ns)
            if self.ipv6:
                self._create6()
            self._wait_operational()
            # Servers first, host routes last (and removed first by close): the metadata address
            # is the same in every FakeNet, so a concurrent one's route (another xdist worker's)
            # may win by metric; it must never lead to a namespace whose servers are not up.
            self._start_server()
            for dst in (str(self.public_net), str(self.private_net), f"{self.metadata}/32"):
                route = [dst, "via", self.ns_addr, "metric", str(self.metric)]
                _ip("route", "add", *route)
                self._routes.append(route)
            if self.ipv6:
                for dst in (str(self.public6_net), str(self.private6_net), f"{self.metadata6}/128"):
                    route = [dst, "via", self.ns_addr6, "metric", str(self.metric)]
                    _ip("-6", "route", "add", *route)
                    self._routes.append(["-6", *route])
        except BaseException:
            self.close()
            raise

    def _wait_operational(self, timeout: float = 10.0) -> None:
        """Until the host end can send: it came up before its peer, so the kernel activates its
        queue later (linkwatch, behind the rtnl lock; until then it drops what it sends, the
        first ARP request into the fake internet included), as for a sandbox's link
        (``sandpod_lifecycle.network.link``). ``ip link set up`` once more takes the rtnl lock:
        it returns after linkwatch's work on the link is done."""
        state = Path("/sys/class/net", self.host_if, "operstate")
        deadline = time.monotonic() + timeout
        while state.read_text().strip() != "up":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.host_if} not operational after {timeout:g} s")
            time.sleep(0.001)
        _ip("link", "set", self.host_if, "up")

    def _create6(self) -> None:
        ns = self.netns
        _ip("address", "add", f"{self.host_addr6}/64", "dev", self.host_if, "nodad")
        _ip("address", "add", f"{self.ns_addr6}/64", "dev", "eth0", "nodad", netns=ns)
        _ip("-6", "route", "add", "default", "via", self.host_addr6, netns=ns)
        for addr in (self.public6, self.public6b, self.private6, self.metadata6):
            _ip("address", "add", f"{addr}/128", "dev", "lo", "nodad", netns=ns)

    def add_address(self, address: str) -> None:
        """Another address of the fake internet (in ``public_net`` or ``private_net``)."""
        _ip("address", "add", f"{address}/32", "dev", "lo", netns=self.netns)

    def _start_server(self) -> None:
        argv = [
            "ip",
            "netns",
            "exec",
            self.netns,
            sys.executable,
            str(SERVER),
            f"public={self.public}:80",
            f"public-8080={self.public}:8080",
            f"public2={self.public2}:80",
            f"private={self.private}:80",
            f"metadata={self.metadata}:80",
            "--udp",
            f"{self.public}:{self.udp_port}",
            "--udp",
            f"{self.public}:53",
        ]
        if self.ipv6:
            argv += [
                f"public6={self.public6}:80",
                f"public6b={self.public6b}:80",
                f"private6={self.private6}:80",
                f"metadata6={self.metadata6}:80",
                "--udp",
                f"{self.public6}:{self.udp_port}",
            ]
        if self.tls_cert is not None:
            argv += ["--cert", str(self.tls_cert)]
            argv += ["--tls", f"public-tls={self.public}:443"]
            argv += ["--tls", f"public2-tls={self.public2}:443"]
        self._server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self._server.stdout is not None
        line = self._server.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"fake internet servers did not start: {line!r}")

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a command inside the fake internet's namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True, check=False
        )

    def host_service(self) -> int:
        """A TCP server on 0.0.0.0 of the host (port returned) answering ``host secret``."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", 0))
        sock.listen(16)
        self._host_socks.append(sock)

        def serve() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                with conn, contextlib.suppress(OSError):
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 12\r\n\r\nhost secret\n")

        threading.Thread(target=serve, daemon=True).start()
        return int(sock.getsockname()[1])

    def close(self) -> None:
        for route in self._routes:  # first: no route may lead to servers that are gone
            if route[0] == "-6":
                _ip("-6", "route", "del", *route[1:], check=False)
            else:
                _ip("route", "del", *route, check=False)
        for sock in self._host_socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._server is not None:
            self._server.kill()
            self._server.wait()
            if self._server.stdout is not None:
                self._server.stdout.close()
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.netns, check=False)
        if self._lock is not None:
            with contextlib.suppress(FileNotFoundError):
                (LOCKS / f"{self.netns}.lock").unlink()
            os.close(self._lock)
            self._lock = None

    def leftovers(self) -> list[str]:
        """What of this fake internet still exists (namespace, link, routes)."""
        left = []
        if Path("/run/netns", self.netns).exists():
            left.append(f"netns {self.netns}")
        if Path("/sys/class/net", self.host_if).exists():
            left.append(f"link {self.host_if}")
        for family in ("-4", "-6"):
            routes = _ip(family, "route", "show", "table", "all")
            left += [
                f"route {r}" for r in routes.splitlines() if f"metric {self.metric} " in r + " "
            ]
        return left


if __name__ == "__main__":  # a manual check: build it, print its addresses, wait
    with FakeNet() as net:
        print(json.dumps({k: v for k, v in vars(net).items() if isinstance(v, str)}, indent=1))
        os.system(f"curl -s -m 2 http://{net.public}/")
