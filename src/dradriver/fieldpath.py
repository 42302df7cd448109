"""Field paths as the API server writes them in errors: `spec.devices[0].name`."""

from __future__ import annotations

from collections.abc import Sequence


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path: names joined by dots, list indexes in brackets."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path
