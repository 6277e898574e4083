"""Handlers by subject family: decode is done by the router, domain logic lives elsewhere."""
