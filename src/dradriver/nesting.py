"""How deep JSON-like data nests, walked iteratively: untrusted data may nest deeper than Python
recurses, and anything that walks it recursively (validation, copies, encoding) would fail on it
with a RecursionError instead of a message naming where."""

from __future__ import annotations

from typing import Any

#: Containers inside containers, the outermost counting as 1: no object we read needs more.
MAX_DEPTH = 100


def too_deep(data: Any, limit: int = MAX_DEPTH) -> tuple[int | str, ...] | None:
    """The location of the first container nested deeper than `limit` (a pydantic-style loc),
    or None when `data` nests at most that deep."""
    pending: list[tuple[Any, tuple[int | str, ...]]] = [(data, ())] if isinstance(data, dict | list) else []
    while pending:
        value, loc = pending.pop()
        if len(loc) >= limit:
            return loc
        items = value.items() if isinstance(value, dict) else enumerate(value)
        pending.extend((item, (*loc, key)) for key, item in items if isinstance(item, dict | list))
    return None
