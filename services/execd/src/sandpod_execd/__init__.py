"""execd: the per-sandbox daemon that runs commands for Sandpod clients over NATS."""

__version__ = "0.1.0"
