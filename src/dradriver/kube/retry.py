"""When to retry an API call and how long to wait: pure policy, no I/O.

Retries follow client-go's spirit: 429 and 5xx answers and connection failures are retried
with jittered exponential backoff, and a server's Retry-After is honoured (never waited less).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

#: Statuses worth another try: too many requests, and server-side failures that are usually
#: transient (a restarting or overloaded apiserver, an unavailable etcd behind it).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Backoff:
    """Jittered exponential backoff: `initial * factor**attempt`, capped, +- `jitter` of it."""

    initial: float = 0.2
    factor: float = 2.0
    cap: float = 10.0
    jitter: float = 0.5

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        base = min(self.cap, self.initial * self.factor ** max(attempt, 0))
        return max(0.0, base * (1.0 + self.jitter * (2.0 * rand() - 1.0)))

    def wait(
        self, attempt: int, retry_after: float | None, rand: Callable[[], float] = random.random
    ) -> float:
        """The delay for `attempt`, but never shorter than what the server asked for."""
        own = self.delay(attempt, rand)
        return own if retry_after is None else max(own, retry_after)


def retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date; None if absent or bad."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if now is None:
        now = time.time()
    return max(0.0, when.timestamp() - now)
