"""Cluster DNS for the real test node: Services' names, nothing else (``python clusterdns.py``).

The kubelet points every Pod's resolv.conf at the node's address, where this answers:

    <service>.<namespace>.svc.cluster.local  A  the Service's ClusterIP, or for a headless
                                                Service the ready addresses of its EndpointSlices
    <pod-hostname>.<service>.<ns>.svc...     A  that Pod's address (a StatefulSet's stable names)

and NXDOMAIN for every other name: there is no upstream, since the node has no way out. The
table is rebuilt from a list of Services and EndpointSlices every half second (a watch would be
quicker, and is not needed at test scale); queries are answered from it on UDP only. It is what
CoreDNS's ``kubernetes`` plugin does for these record types, without building CoreDNS's module
graph (cloud SDKs included) on two cores.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
from kubernetes import client, config

DOMAIN = "svc.cluster.local."
TTL = 5


def build_table(api: client.ApiClient) -> dict[str, list[str]]:
    """name (absolute, lower case) -> IPv4 addresses."""
    services = client.CoreV1Api(api).list_service_for_all_namespaces().to_dict()["items"]
    slices = client.DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces().to_dict()
    table: dict[str, list[str]] = {}
    headless: set[tuple[str, str]] = set()
    for svc in services:
        meta = svc["metadata"]
        ip = svc["spec"].get("cluster_ip")
        if ip and ip != "None":
            table[f"{meta['name']}.{meta['namespace']}.{DOMAIN}"] = [ip]
        else:
            headless.add((meta["namespace"], meta["name"]))
    for eps in slices["items"]:
        owner = (eps["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
        ns = eps["metadata"]["namespace"]
        if owner is None:
            continue
        for ep in eps.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for address in ep.get("addresses") or []:
                if (ns, owner) in headless:
                    table.setdefault(f"{owner}.{ns}.{DOMAIN}", []).append(address)
                if ep.get("hostname"):
                    table[f"{ep['hostname']}.{owner}.{ns}.{DOMAIN}"] = [address]
    return table


class Table:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.names: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def refresh_forever(self) -> None:
        while True:
            try:
                names = build_table(self.api)
            except Exception as exc:  # the API server restarting: keep the last table
                print(f"clusterdns: refresh failed: {exc}", flush=True)
            else:
                with self.lock:
                    self.names = names
            time.sleep(0.5)

    def lookup(self, name: str) -> list[str] | None:
        with self.lock:
            return self.names.get(name.lower())


def answer(wire: bytes, table: Table) -> bytes | None:
    try:
        query = dns.message.from_wire(wire)
    except Exception:
        return None
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA | dns.flags.RA
    if len(query.question) != 1:
        response.set_rcode(dns.rcode.FORMERR)
        return response.to_wire()
    question = query.question[0]
    addresses = table.lookup(question.name.to_text())
    if addresses is None:
        response.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A:
        response.answer.append(dns.rrset.from_text_list(question.name, TTL, "IN", "A", addresses))
    return response.to_wire()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args()
    table = Table(config.new_client_from_config(args.kubeconfig))  # type: ignore[no-untyped-call]
    threading.Thread(target=table.refresh_forever, daemon=True).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.listen, 53))
    print(f"clusterdns: serving {DOMAIN} on {args.listen}:53", flush=True)
    while True:
        wire, peer = sock.recvfrom(4096)
        reply = answer(wire, table)
        if reply is not None:
            sock.sendto(reply, peer)


if __name__ == "__main__":
    main()
