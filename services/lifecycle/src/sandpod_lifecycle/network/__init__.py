"""Sandbox networking on the local runtime: links, firewall, resolver and the egress proxy."""
