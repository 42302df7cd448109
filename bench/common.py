"""Small helpers for the benchmark scripts: percentiles and a results line."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(name: str, samples_s: Sequence[float], unit: str = "ms") -> str:
    scale = {"ms": 1e3, "us": 1e6, "s": 1.0}[unit]
    return (
        f"{name}: n={len(samples_s)} median={statistics.median(samples_s) * scale:.3f}{unit} "
        f"p99={percentile(samples_s, 99) * scale:.3f}{unit} min={min(samples_s) * scale:.3f}{unit}"
    )
