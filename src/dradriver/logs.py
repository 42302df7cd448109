"""Logging set-up: structlog everywhere, JSON lines in `serve`, readable console output in the CLI.

Importing structlog costs about 0.1 s (it pulls in rich for tracebacks). `dradriver serve` must
bring its sockets up before that, so modules get their logger from `get_logger`, which defers
the import until the first log call.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, TextIO, cast

LogFormat = Literal["json", "console"]

#: Verbosity at which every gRPC request and response is logged (the Go helper uses klog V(6)).
VERBOSITY_TRACE_GRPC = 6
#: Verbosity from which debug-level events are shown.
VERBOSITY_DEBUG = 4


class _LazyLogger:
    """Stands in for a structlog logger until the first call, then becomes a real one."""

    __slots__ = ("_bound", "_initial")

    def __init__(self, initial: dict[str, Any]) -> None:
        self._initial = initial
        self._bound: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            import structlog

            self._bound = structlog.get_logger(**self._initial)
        return getattr(self._bound, name)


def get_logger(**initial: Any) -> Any:
    """A structlog logger bound to `initial`; structlog itself is imported on first use."""
    return _LazyLogger(initial)


_verbosity = 0


def verbosity() -> int:
    """The configured -v level; callers use it to decide whether to log bulky details."""
    return _verbosity


def _standard_fields_first(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    """Put timestamp, level and event at the front of each JSON line, where people look."""
    front = {key: event.pop(key) for key in ("timestamp", "level", "event") if key in event}
    return front | event


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the time of writing, not when logging was configured
    (tests and embedding callers swap sys.stderr; a captured, since-closed one would crash)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure(fmt: LogFormat, level: int = 0, stream: Any = None) -> None:
    """Route structlog (and stdlib logging, e.g. from grpc or kubernetes) to `stream` (stderr)."""
    import structlog

    global _verbosity  # noqa: PLW0603 - one process-wide setting, set once at start-up
    _verbosity = level
    out: TextIO = stream if stream is not None else cast(TextIO, _CurrentStderr())
    min_level = logging.DEBUG if level >= VERBOSITY_DEBUG else logging.INFO
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        processors += [
            structlog.processors.dict_tracebacks,
            _standard_fields_first,
            structlog.processors.JSONRenderer(sort_keys=False),
        ]
    else:
        processors.append(
            structlog.dev.ConsoleRenderer(
                colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
            )
        )
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=out, format="%(levelname)s %(name)s: %(message)s")
