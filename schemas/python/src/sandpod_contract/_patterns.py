"""Pattern building blocks for the generated JSON Schemas, in the syntax every engine shares.

A client in Go or Rust compiles the schemas' ``pattern`` keywords with an RE2-style engine, a
browser with ECMA-262, this binding with Python ``re``. Their common subset has no lookaround,
no backreferences, no ``\\u`` escapes (RE2 spells them ``\\x{...}``, Python ``re`` and ECMA-262
without the ``u`` flag do not know that form) and no ``\\s`` (each engine's whitespace differs).
So code points up to U+00FF are written ``\\xHH`` (all four agree) and higher ones literally;
``tests/contract/test_schema_patterns.py`` compiles every pattern under RE2 to keep it so.
"""

from __future__ import annotations

__all__ = ["NO_NUL", "NUL", "SPACE", "no_nul"]

NUL = "\\x00"
# Python's str.isspace spelled out, plus NUL: what "no whitespace" means in value rules.
SPACE = (
    "\\x00\\x09-\\x0d\\x1c-\\x20\\x85\\xa0"
    + "".join(chr(c) for c in (0x1680,))
    + f"{chr(0x2000)}-{chr(0x200A)}"
    + "".join(chr(c) for c in (0x2028, 0x2029, 0x202F, 0x205F, 0x3000))
)
NO_NUL = f"^[^{NUL}]*$"


def no_nul(extra: str = "") -> str:
    """A whole-string pattern: no NUL and none of the characters ``extra`` (a class body)."""
    return f"^[^{extra}{NUL}]*$"
