"""Sandbox networking on a node: links, firewall, the policy DNS resolver and the egress proxy.

Every enforcer here compiles from one model, :class:`sandpod_contract.network.NetworkPolicy`;
one module per concern (see each module's docstring).
"""
