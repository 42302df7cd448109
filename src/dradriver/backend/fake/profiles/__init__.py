"""Built-in fake GPU profiles (`--fake-gpus NAME`) and the MIG profile tables they use (package data).

Listing them needs no parsing, so `serve` can tell a built-in name before its sockets are up
without importing the profile model.
"""

from __future__ import annotations

from importlib import resources

MIG_TABLES_FILE = "mig-tables.yaml"


def names() -> list[str]:
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in resources.files(__name__).iterdir()
        if entry.name.endswith(".yaml") and entry.name != MIG_TABLES_FILE
    )
