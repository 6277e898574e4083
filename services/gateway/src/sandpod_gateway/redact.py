"""Secrets never reach a log line: query values of ``token``/``ticket``/``key``, bearer
credentials and anything shaped like an API key or ticket are replaced before formatting.

uvicorn logs every WebSocket handshake with its full path and query string
(``"WebSocket /v1/...?token=..." [accepted]``); the filter is attached to uvicorn's loggers and to
the root logger's handlers, so a record is redacted whichever way it reaches the log.
"""

from __future__ import annotations

import logging
import re

__all__ = ["RedactingFilter", "install", "redact"]

_PATTERNS = (
    (
        re.compile(r"(?i)\b(token|ticket|api_key|apikey|key|access_token)=[^&\s\"'#]*"),
        r"\1=[redacted]",
    ),
    (
        re.compile(
            r"(?i)\b(authorization|x-api-key)([\"']?\s*[:=]\s*[\"']?)(bearer\s+)?[^\s\"',]+"
        ),
        r"\1\2\3[redacted]",
    ),
    (re.compile(r"\bspk_([0-9a-f]{12})_[0-9a-f]{8,}"), r"spk_\1_[redacted]"),
    (re.compile(r"\bspt_[0-9a-f]{8,}"), "spt_[redacted]"),
    (re.compile(r"\bsandpod\.(key|ticket)\.[^\s,\"']+"), r"sandpod.\1.[redacted]"),
)

_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def redact(text: str) -> str:
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: keep its template only
            message = str(record.msg)
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_FILTER = RedactingFilter()


def install() -> None:
    """Attach the filter to uvicorn's loggers and every handler of the root logger (idempotent)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    for handler in logging.getLogger().handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
