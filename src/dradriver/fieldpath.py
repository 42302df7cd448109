"""Field paths as the API server writes them in errors: `spec.devices[0].name`."""

from __future__ import annotations

from collections.abc import Sequence

#: A map key in a path is cut to this many characters: a tenant's key may be megabytes long.
MAX_PART = 64


def clip(text: str) -> str:
    """`text`, cut to MAX_PART characters with an ellipsis when longer."""
    return text if len(text) <= MAX_PART else f"{text[: MAX_PART - 1]}…"


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path: names joined by dots, list indexes in brackets."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{clip(part)}" if path else clip(part))
    return path
