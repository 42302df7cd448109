"""Stop signals that arrive before `serve` has installed its own handlers.

`dradriver serve` must exit 0 on SIGTERM at any moment of start-up, including while Python is
still importing the CLI; `main` defers the signals from its first line, and the daemon picks a
pending one up as soon as it takes over.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending: list[int] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _pending.append(signum)


def defer_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)


def pending_stop_signal() -> int | None:
    return _pending[0] if _pending else None
