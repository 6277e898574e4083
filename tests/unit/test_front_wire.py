"""What the gateway and its native front (``services/gateway/native``) say to each other: the
pass in a response header and the report datagram. ``native/vectors.json`` is read here and by
the front's own tests (``cargo test``), so the two sides cannot drift apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandpod_gateway.native import FrontPass, FrontReport, peer_of

VECTORS = json.loads(
    (Path(__file__).parents[2] / "services/gateway/native/vectors.json").read_text()
)


@pytest.mark.parametrize("case", VECTORS["passes"], ids=lambda c: c["pass"]["up"])
def test_a_pass_encodes_as_the_front_decodes_it(case: dict[str, object]) -> None:
    fields = dict(case["pass"])  # type: ignore[call-overload]
    fields["creds"] = [tuple(c) for c in fields["creds"]]
    assert FrontPass(**fields).encode().decode() == case["value"]


def test_a_report_parses_and_anything_else_is_refused() -> None:
    line = b"v1\tPOST\t201\t1500\tfabc\t1\tacme\tacme--web\t3"
    assert FrontReport.parse(line) == FrontReport(
        "POST", 201, 0.0015, "fabc", True, "acme", "acme--web", 3
    )
    for bad in (
        b"",
        b"v2\tPOST\t201\t1500\tfabc\t1\tacme\tacme--web\t0",
        b"v1\tPOST\t2x1\t1500\tfabc\t1\tacme\tacme--web\t0",
        b"v1\tPOST\t201\t-5\tfabc\t1\tacme\tacme--web\t0",
        b"v1\tPOST\t201\t1500\tfabc\tyes\tacme\tacme--web\t0",
        b"v1\tPOST\t201\t1500\tfabc\t1\tacme\tacme--web",
        b"v1\tPOST\t201\t1500\tfabc\t1\tacme\tacme--web\t0\textra",
        b"\xff\xfe" * 100,
    ):
        assert FrontReport.parse(bad) is None, bad


def test_the_peer_the_front_names() -> None:
    assert peer_of([(b"x-sandpod-front-peer", b"127.0.0.1:5000")]) == ("127.0.0.1", 5000)
    assert peer_of([(b"x-sandpod-front-peer", b"[::1]:5000")]) == ("::1", 5000)
    for bad in (b"", b"127.0.0.1", b"127.0.0.1:x", b":5000"):
        assert peer_of([(b"x-sandpod-front-peer", bad)]) is None, bad
    assert peer_of([(b"x-forwarded-for", b"127.0.0.1:5000")]) is None
