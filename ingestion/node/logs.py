"""Structured logging: JSON lines on stdout (docs/REFERENCE.md), or a readable console rendering.

Every line carries ``event``, ``timestamp`` (ISO 8601, UTC), ``level``, and the ``node`` and ``job``
bound by the caller. Wall-clock time appears here and nowhere else.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from ingestion.common.redact import redact


def redact_secrets(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Any:
    """structlog processor: no password or token of a URL survives into a log line (exceptions
    included): :func:`ingestion.common.redact.redact`."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact(value)
        elif isinstance(value, list | tuple):
            event[key] = [redact(v) if isinstance(v, str) else v for v in value]
    return event


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Configure structlog for the whole process. ``fmt``: json, console, or auto."""
    stream = stream or sys.stdout
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=stream.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def node_logger(node: str, job: str) -> Any:
    return structlog.get_logger().bind(node=node, job=job)
