"""The resolver's TTL -> firewall set timeout path, proven on the real kernel's nftables.

The sink here is the smallest real one: a temporary ``inet`` table (unique name, deleted at the
end) with a ``flags timeout`` set per family; ``add_resolved`` adds each address with its
seconds as the element's timeout, through the ``nft`` tool. The production sink (the
firewall module) does the same through libnftables, per sandbox and rule.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Sequence

import dns.message
import dns.rdatatype
import pytest
from dns_harness import Harness, policy, rcode

from sandpod_contract.network import Rule

pytestmark = pytest.mark.skipif(
    shutil.which("nft") is None, reason="nftables missing: apt-get install nftables"
)


class NftSetSink:
    def __init__(self) -> None:
        self.table = f"sp_dnstest_{uuid.uuid4().hex[:10]}"

    async def _nft(self, *args: str, stdin: str | None = None) -> str:
        proc = await asyncio.create_subprocess_exec(
            "nft",
            *args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin.encode() if stdin else None)
        if proc.returncode != 0:
            raise OSError(f"nft {' '.join(args)}: {err.decode().strip()}")
        return out.decode()

    async def create(self) -> None:
        await self._nft(
            "-f",
            "-",
            stdin=(
                f"table inet {self.table} {{\n"
                " set v4 { type ipv4_addr; flags timeout; }\n"
                " set v6 { type ipv6_addr; flags timeout; }\n"
                "}\n"
            ),
        )

    async def delete(self) -> None:
        await self._nft("delete", "table", "inet", self.table)

    async def add_resolved(
        self, sandbox_id: str, rule: Rule, addresses: Sequence[tuple[str, int]]
    ) -> None:
        for address, seconds in addresses:
            family = "v6" if ":" in address else "v4"
            element = f"{{ {address} timeout {seconds}s }}"
            await self._nft("add", "element", "inet", self.table, family, element)

    async def add_injected(self, sandbox_id: str, addresses: Sequence[tuple[str, int]]) -> None:
        raise AssertionError("no policy here injects headers")

    async def elements(self) -> dict[str, tuple[int, int]]:
        """address -> (timeout, expires) as the kernel reports them."""
        out: dict[str, tuple[int, int]] = {}
        for family in ("v4", "v6"):
            listing = json.loads(await self._nft("-j", "list", "set", "inet", self.table, family))
            for item in listing["nftables"]:
                for elem in item.get("set", {}).get("elem", []):
                    data = elem["elem"]
                    out[data["val"]] = (data["timeout"], data["expires"])
        return out

    async def exists(self) -> bool:
        return self.table in await self._nft("list", "tables")


@pytest.fixture
async def nft_harness() -> AsyncIterator[tuple[Harness, NftSetSink]]:
    sink = NftSetSink()
    await sink.create()
    harness = await Harness.start(sink=sink, min_ttl=30, max_ttl=120)
    try:
        yield harness, sink
    finally:
        await harness.close()
        await sink.delete()
        assert not await sink.exists()


async def test_resolved_addresses_are_in_the_kernel_set_with_their_ttl(
    nft_harness: tuple[Harness, NftSetSink],
) -> None:
    """Allowlist: the moment the reply arrives, the kernel set holds each address with
    timeout = clamp(ttl, min_ttl, max_ttl); a refused name adds nothing."""
    harness, sink = nft_harness
    harness.auth.add("brief.test", "A", 5, "11.22.0.31")
    harness.auth.add("long.test", "A", 86400, "11.22.0.30")
    harness.auth.add("mid.test", "AAAA", 90, "2a00:1450::5")
    harness.auth.add("evil.test", "A", 300, "11.22.0.66")
    source = harness.sandbox(policy("allowlist", ["brief.test", "long.test", "mid.test:443"]))
    expected = {"brief.test": ("11.22.0.31", 30), "long.test": ("11.22.0.30", 120)}
    for name, (address, timeout) in expected.items():
        response = await harness.ask(source, name)
        assert rcode(response) == "NOERROR"
        elements = await sink.elements()  # read right after the reply: already there
        assert address in elements, f"{address} not in the set after the reply"
        assert elements[address][0] == timeout
        assert 0 < elements[address][1] <= timeout
    response = await harness.ask(source, "mid.test", "AAAA")
    assert response.answer[0].rdtype == dns.rdatatype.AAAA
    assert (await sink.elements())["2a00:1450::5"][0] == 90
    assert rcode(await harness.ask(source, "evil.test")) == "REFUSED"
    assert "11.22.0.66" not in await sink.elements()


async def test_public_mode_adds_nothing_to_the_sets(
    nft_harness: tuple[Harness, NftSetSink],
) -> None:
    """Public mode: answers flow, the firewall's sets are not touched."""
    harness, sink = nft_harness
    harness.auth.add("open.test", "A", 300, "11.22.0.1")
    source = harness.sandbox(policy("public"))
    response: dns.message.Message = await harness.ask(source, "open.test")
    assert rcode(response) == "NOERROR"
    assert await sink.elements() == {}
