"""Files in and out: one safe loader for every YAML/JSON input, safe writes for what we own.

`load_documents` / `load_document` are what every file input goes through (claims in
--claims-dir, validate, dry-run, cel eval, fake GPU profiles, --health-config, kubeconfig):
a regular file within a size limit, UTF-8, then parsed with nesting, node and alias limits and
duplicate keys refused (`files.parse`). Any problem is a `FileInputError` whose message is one
line naming the file. The parser (and PyYAML) is imported on first use: `serve` writes files
before it reads any.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dradriver.files.read import FileReadError, decode_text, read_bytes, read_text, size_text

__all__ = [
    "FileInputError",
    "FileReadError",
    "load_document",
    "load_documents",
    "parse_text",
    "read_bytes",
    "read_text",
]


class FileInputError(ValueError):
    """A file that cannot be used as input; str() is one line naming the file and the problem."""


def parse_text(text: str, source: str, *, json_text: bool | None = None) -> list[Any]:
    """Documents of YAML or JSON text (JSON: `json_text`, or when None, text that starts like
    JSON); FileInputError naming `source`."""
    from dradriver.files.parse import ParseError, looks_like_json, parse_json, parse_yaml

    is_json = json_text if json_text is not None else looks_like_json(text)
    try:
        return [parse_json(text)] if is_json else parse_yaml(text)
    except ParseError as err:
        raise FileInputError(f"{source}: {err}") from None


def load_documents(path: Path | str, *, follow_symlinks: bool = True) -> list[Any]:
    """Every document in a YAML or JSON file (JSON when named *.json or starting with { or [)."""
    from dradriver.files.parse import JSON_LIMITS, YAML_LIMITS, looks_like_json

    limit = max(JSON_LIMITS.max_bytes, YAML_LIMITS.max_bytes)
    try:
        data = read_bytes(path, limit, follow_symlinks=follow_symlinks)
        text = decode_text(data, path)
    except FileReadError as err:
        raise FileInputError(str(err)) from None
    is_json = str(path).endswith(".json") or looks_like_json(text)
    limits = JSON_LIMITS if is_json else YAML_LIMITS
    if len(data) > limits.max_bytes:
        kind = "JSON" if is_json else "YAML"
        raise FileInputError(
            f"{path}: is larger than {size_text(limits.max_bytes)} (the limit for {kind} files)"
        )
    return parse_text(text, str(path), json_text=is_json)


def load_document(path: Path | str) -> Any:
    """The one document of a file (None when empty); FileInputError if it holds several."""
    documents = load_documents(path)
    if len(documents) > 1:
        raise FileInputError(f"{path}: holds {len(documents)} YAML documents; expected one")
    return documents[0] if documents else None
