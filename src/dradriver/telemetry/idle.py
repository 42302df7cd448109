"""Idle claims: a prepared claim whose devices all stayed below a utilisation threshold for a
window (pure; the daemon turns what it reports into Events).

A claim is judged only on readings where every device it holds reports SM utilisation (MIG
devices do not: NVML keeps no utilisation counters for them, so a claim of MIG devices is never
called idle). A claim found busy again starts over, and is reported again after another window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dradriver.telemetry.model import Holder, Reading


@dataclass(frozen=True)
class IdlePolicy:
    #: Below this SM utilisation (percent) a device counts as idle.
    threshold_percent: float
    #: Seconds below the threshold before a claim is reported idle.
    window_seconds: float


class IdleTracker:
    """Feeds on readings; `update` returns the claims that became idle this time."""

    def __init__(self, policy: IdlePolicy) -> None:
        self.policy = policy
        self._since: dict[str, float] = {}
        self._reported: set[str] = set()
        self._holders: dict[str, Holder] = {}

    def update(self, now: float, readings: Sequence[Reading]) -> list[tuple[Holder, float]]:
        utilisation: dict[str, list[float | None]] = {}
        for reading in readings:
            sm = reading.sample.sm_util_percent if reading.sample is not None else None
            for holder in reading.holders:
                utilisation.setdefault(holder.claim_uid, []).append(sm)
                self._holders[holder.claim_uid] = holder
        newly: list[tuple[Holder, float]] = []
        for uid, values in utilisation.items():
            if any(v is None for v in values):
                continue  # cannot tell: keep what was known
            if any(v is not None and v >= self.policy.threshold_percent for v in values):
                self._since.pop(uid, None)
                self._reported.discard(uid)
                continue
            since = self._since.setdefault(uid, now)
            if now - since >= self.policy.window_seconds and uid not in self._reported:
                self._reported.add(uid)
                newly.append((self._holders[uid], now - since))
        for uid in set(self._since) - set(utilisation):  # unprepared
            self._since.pop(uid, None)
            self._reported.discard(uid)
            self._holders.pop(uid, None)
        return newly

    def idle(self, now: float) -> dict[str, tuple[Holder, float]]:
        """Claim UID -> (holder, seconds below the threshold so far), for every claim below it."""
        return {uid: (self._holders[uid], now - since) for uid, since in self._since.items()}
