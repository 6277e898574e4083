"""Include/exclude globs for watches, matched against paths relative to the watched root.

Rules (gitignore-like, so the patterns agents already write for ``.gitignore`` work):

- ``*`` matches within one path segment, ``?`` one character, ``[...]`` a class (``[!...]``
  negated), ``**`` as a whole segment any number of segments (zero included);
- a pattern without ``/`` matches a single segment at any depth: ``*.py`` matches ``a/b/c.py``,
  ``node_modules`` matches ``x/node_modules``;
- a pattern with ``/`` is anchored at the watched root: ``src/**/*.py``; a leading ``/`` is ignored;
- a path matches when the pattern matches it **or any of its ancestors**, so ``node_modules``
  (or ``build/**``) also covers everything below that directory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["GlobSet", "compile_glob"]


def _segment(seg: str) -> str:
    """Regex for one segment: * ? and [...] classes; everything else literal."""
    out = []
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := seg.find("]", i + (3 if seg[i + 1 : i + 2] in "!^" else 2))) > 0:
            body = seg[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = (body[1:] if negate else body).replace("\\", "\\\\").replace("[", "\\[")
            body = body.replace("]", "\\]")
            out.append(("[^/" if negate else "[") + body + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex that fully matches the relative paths ``pattern`` names (ancestors not included).

    Raises:
        ValueError: the pattern is empty (or only slashes).
    """
    anchored = "/" in pattern.strip("/")
    segments = [s for s in pattern.strip("/").split("/") if s]
    if not segments:
        raise ValueError(f"empty glob {pattern!r}")
    if not anchored:  # one segment, any depth
        regex = f"(?:[^/]+/)*{_segment(segments[0])}"
    else:
        parts: list[str] = []
        for i, seg in enumerate(segments):
            last = i == len(segments) - 1
            if seg == "**":
                parts.append(".*" if last else "(?:[^/]+/)*")
            else:
                parts.append(_segment(seg) + ("" if last else "/"))
        regex = "".join(parts)
    try:
        return re.compile(regex, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"invalid glob {pattern!r}: {exc}") from exc


class GlobSet:
    """Several patterns; :meth:`matches` is true if any matches a path or one of its ancestors."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        self._regexes = [compile_glob(p) for p in self.patterns]

    def __bool__(self) -> bool:
        return bool(self._regexes)

    def matches(self, rel: str) -> bool:
        """``rel`` is relative to the watched root, ``/``-separated, without a leading ``/``."""
        if not rel or not self._regexes:
            return False
        prefix = ""
        for seg in rel.split("/"):
            prefix = f"{prefix}/{seg}" if prefix else seg
            if any(r.fullmatch(prefix) for r in self._regexes):
                return True
        return False
