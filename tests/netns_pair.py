"""A network namespace joined to the host by a veth pair on a random /30 of 198.18.0.0/15 (the
benchmarking range: never a real network's), with its own ``/etc/netns/<name>`` files; the
base of the DNS and Pod-guard harnesses."""

from __future__ import annotations

import random
import shutil
import subprocess
import uuid
from pathlib import Path

__all__ = ["NetnsPair", "ip"]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class NetnsPair:
    """``name``'s namespace; ``gateway`` is the host end's address, ``address`` the inside's."""

    def __init__(self, kind: str, nameserver: str | None = None) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name = f"sp{kind}-{tag}"
        self.host_if, self.peer_if = f"sp{kind[0]}{tag}h", f"sp{kind[0]}{tag}n"
        base = (
            f"198.{random.randint(18, 19)}.{random.randint(0, 255)}.{random.randrange(0, 256, 4)}"
        )
        prefix, last = base.rsplit(".", 1)
        self.gateway = f"{prefix}.{int(last) + 1}"  # the host end
        self.address = f"{prefix}.{int(last) + 2}"  # inside
        self.nameserver = nameserver or self.gateway
        self.etc = Path("/etc/netns") / self.name

    def create(self, *, default_route: bool = False, attempts: int = 2) -> None:
        ip("netns", "add", self.name)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
        ip("link", "set", self.peer_if, "netns", self.name)
        ip("addr", "add", f"{self.gateway}/30", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", self.peer_if)
        ip("-n", self.name, "link", "set", self.peer_if, "up")
        ip("-n", self.name, "link", "set", "lo", "up")
        if default_route:
            ip("-n", self.name, "route", "add", "default", "via", self.gateway)
        self.etc.mkdir(parents=True)
        (self.etc / "resolv.conf").write_text(
            f"nameserver {self.nameserver}\noptions timeout:2 attempts:{attempts}\n"
        )
        (self.etc / "hosts").write_text("127.0.0.1 localhost\n")

    def remove(self) -> None:
        # the host end first: deleting it removes the pair at once (a namespace's own
        # devices go only when the kernel frees the namespace, which may lag)
        subprocess.run(["ip", "link", "del", self.host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
        shutil.rmtree(self.etc, ignore_errors=True)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert self.host_if not in links, f"veth {self.host_if} left behind"
        assert not self.etc.exists()
