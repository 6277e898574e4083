"""Sandpod gateway: the HTTP and WebSocket API, translated to NATS."""
