"""Typed wire messages, one module per subject family."""
