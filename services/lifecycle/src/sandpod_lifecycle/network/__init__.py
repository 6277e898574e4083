"""Egress networking of the local runtime: links, addresses and nftables (see each module)."""
