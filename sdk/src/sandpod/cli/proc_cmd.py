"""``sandpod`` subcommands of this family (see ``sandpod.cli``)."""

from __future__ import annotations

from typing import Any

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Register this module's subcommands on the ``sandpod`` parser."""
