"""Contract tests are pure: they need neither nats-server nor execd.

The root conftest starts both for every session through the autouse ``_session_daemons``; this
no-op override lets ``pytest tests/contract`` run anywhere (a plain CI job, a laptop without the
nats-server binary). When the whole suite runs, other tests still start the daemons.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No daemons for contract tests."""
