"""Sandpod pool service: keeps warm sandboxes ready and binds claims to them."""
