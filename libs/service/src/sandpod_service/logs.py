"""structlog, configured once per process by ``serve()``.

JSON lines when stderr is not a TTY, a readable console otherwise. Handlers bind ``service``,
``sandbox_id`` and ``request_id`` with :func:`structlog.contextvars.bind_contextvars`.
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging"]


def configure_logging(service: str, level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog and route stdlib logging (nats-py, the bus) through it."""
    use_json = (not sys.stderr.isatty()) if json is None else json
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(lvl, logging.INFO))
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
