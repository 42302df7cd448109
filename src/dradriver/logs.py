"""Logging set-up: structlog everywhere, JSON lines in `serve`, readable console output in the CLI.

Importing structlog costs about 0.1 s (it pulls in rich for tracebacks). `dradriver serve` must
bring its sockets up before that, so modules get their logger from `get_logger`, which defers
the import until the first log call.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Literal, TextIO, cast

LogFormat = Literal["json", "console"]

#: Verbosity at which every gRPC request and response is logged (the Go helper uses klog V(6)).
VERBOSITY_TRACE_GRPC = 6
#: Verbosity from which debug-level events are shown.
VERBOSITY_DEBUG = 4


class _LazyLogger:
    """Stands in for a structlog logger until the first call, then becomes a real one (again
    after each `configure`: structlog's loggers keep the configuration of their first use)."""

    __slots__ = ("__weakref__", "_bound", "_initial")

    def __init__(self, initial: dict[str, Any]) -> None:
        self._initial = initial
        self._bound: Any = None
        _lazy_loggers.add(self)

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            import structlog

            self._bound = structlog.get_logger(**self._initial)
        return getattr(self._bound, name)


_lazy_loggers: weakref.WeakSet[_LazyLogger] = weakref.WeakSet()


def get_logger(**initial: Any) -> Any:
    """A structlog logger bound to `initial`; structlog itself is imported on first use."""
    return _LazyLogger(initial)


_verbosity = 0


def verbosity() -> int:
    """The configured -v level; callers use it to decide whether to log bulky details."""
    return _verbosity


#: A log record never carries more than this many characters of any one string value, list
#: items or map entries, and never renders to more than MAX_RECORD_BYTES: a crafted input must
#: not be able to flood the log (or the memory of whoever reads it).
MAX_VALUE_CHARS = 2048
MAX_ITEMS = 64
MAX_RECORD_BYTES = 16 * 1024
_MAX_NESTING = 8


def _standard_fields_first(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    """Put timestamp, level and event at the front of each JSON line, where people look."""
    front = {key: event.pop(key) for key in ("timestamp", "level", "event") if key in event}
    return front | event


def clip_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was cut (for logs, errors, messages)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def clip(value: Any, depth: int = 0) -> Any:
    """`value` with long strings cut, long lists and maps shortened, deep nesting summarized;
    anything that is not JSON data becomes its (clipped) text."""
    if isinstance(value, str):
        return clip_text(value, MAX_VALUE_CHARS)
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= _MAX_NESTING:
        return f"<{type(value).__name__} nested too deeply to log>"
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k)[:MAX_VALUE_CHARS]: clip(v, depth + 1) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["..."] = f"{len(items) - MAX_ITEMS} more entries"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        clipped = [clip(v, depth + 1) for v in items[:MAX_ITEMS]]
        if len(items) > MAX_ITEMS:
            clipped.append(f"... {len(items) - MAX_ITEMS} more items")
        return clipped
    return clip(str(value), depth)


def _bounded(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    bounded: dict[str, Any] = clip(event)
    return bounded


def _json_line(event: dict[str, Any], **_options: Any) -> str:
    """One JSON line of at most MAX_RECORD_BYTES; an oversized record keeps only its front fields."""
    line = json.dumps(event, ensure_ascii=False, default=str)
    if len(line.encode()) <= MAX_RECORD_BYTES:
        return line
    front: dict[str, Any] = {k: event[k] for k in ("timestamp", "level", "event", "component") if k in event}
    front["event"] = str(front.get("event", ""))[:1024]
    front["truncated"] = f"record of {len(line.encode())} bytes exceeded {MAX_RECORD_BYTES}; fields dropped"
    return json.dumps(front, ensure_ascii=False, default=str)


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the time of writing, not when logging was configured
    (tests and embedding callers swap sys.stderr; a captured, since-closed one would crash)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def _logger_name(_logger: Any, _method: str, event: Any) -> Any:
    """Records from other libraries' stdlib loggers say where they come from."""
    record = event.get("_record")
    if record is not None:
        event.setdefault("logger", record.name)
    return event


class HeldRecords:
    """Records a thread logged inside `holding`, in order, to be rendered and written by `write`.
    Once written, what comes later goes out at once: a call whose deadline passed ends (and
    writes) before its handler is done."""

    def __init__(self) -> None:
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._written = False

    def add(self, entry: dict[str, Any]) -> None:
        with self._lock:
            if not self._written:
                self._records.append(entry)
                return
        self._emit([entry])

    def write(self) -> None:
        """Render and write the held records (any thread; once the answer they waited for is
        out, or the call ended without one)."""
        with self._lock:
            records, self._records = self._records, []
            self._written = True
        self._emit(records)

    def _emit(self, records: list[dict[str, Any]]) -> None:
        for entry in records:
            _write_finished(entry)


_holding: ContextVar[HeldRecords | None] = ContextVar("held_log_records", default=None)
#: Set by `configure`: renders an event past `_hold` and writes it.
_write_finished: Any = None


@contextmanager
def holding(held: HeldRecords) -> Iterator[None]:
    """Hold what this thread logs at info level until `held.write()`: a gRPC handler answers
    first and has its records written after the answer went out. Timestamps are taken at once.
    Warnings, errors and debug lines are written as they come (after what is held, in order):
    they are what explains a call that hangs or a process that dies in one."""
    token = _holding.set(held)
    try:
        yield
    finally:
        _holding.reset(token)


def _hold(_logger: Any, _method: str, event: Any) -> Any:
    held = _holding.get()
    if held is None:
        return event
    if event.get("level") != "info":
        held.write()
        return event
    import structlog

    if event.get("exc_info") is True:  # the exception being handled now, not at write time
        event["exc_info"] = sys.exc_info()
    held.add(event)
    raise structlog.DropEvent


def configure(fmt: LogFormat, level: int = 0, stream: Any = None) -> None:
    """Route structlog, stdlib logging (grpc, other libraries), warnings and uncaught
    exceptions to `stream` (stderr), all in one format: JSON lines or readable console text.

    Exception records carry the traceback's frames but never local variables (they may hold
    whole claims, and rendering them can take unbounded time), and every record is bounded.
    """
    import structlog
    from structlog.tracebacks import ExceptionDictTransformer

    global _verbosity  # noqa: PLW0603 - one process-wide setting, set once at start-up
    _verbosity = level
    for lazy in list(_lazy_loggers):
        lazy._bound = None
    out: TextIO = stream if stream is not None else cast(TextIO, _CurrentStderr())
    min_level = logging.DEBUG if level >= VERBOSITY_DEBUG else logging.INFO
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if fmt == "json":
        tail: list[Any] = [
            structlog.processors.ExceptionRenderer(
                ExceptionDictTransformer(show_locals=False, max_frames=20, use_rich=False)
            ),
            _bounded,
            _standard_fields_first,
        ]
        renderer = structlog.processors.JSONRenderer(serializer=_json_line)
    else:
        tail = [_bounded]
        renderer = structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    global _write_finished  # noqa: PLW0603 - set with the rest of the configuration
    finish, printer = [*tail, renderer], structlog.PrintLogger(out)

    def write_finished(event: Any) -> None:
        for processor in finish:
            event = processor(None, "info", event)
        printer.msg(event)

    _write_finished = write_finished
    structlog.configure(
        processors=[*shared, _hold, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, _logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if level < VERBOSITY_DEBUG else logging.DEBUG)
    logging.captureWarnings(False)  # re-install: a harness may have restored showwarning since
    logging.captureWarnings(True)
    if fmt == "json":
        _log_uncaught_exceptions()


def _log_uncaught_exceptions() -> None:
    """An exception nobody caught (in any thread) is one JSON record too, not a bare traceback."""
    crash_log = get_logger(component="crash")

    def in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        thread = args.thread.name if args.thread is not None else "?"
        crash_log.error(
            "uncaught exception in a thread",
            thread=thread,
            exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback),
        )

    def in_main(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        crash_log.error("uncaught exception", exc_info=(kind, value, tb))

    threading.excepthook = in_thread
    sys.excepthook = in_main
