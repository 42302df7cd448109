"""Rich console settings shared by the table outputs of the DRA tools."""

from __future__ import annotations

import shutil
import sys
from typing import Any


def console() -> Any:
    """A rich Console on stdout; wide enough when piped so tables are not squeezed to 80 columns."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else max(shutil.get_terminal_size((140, 24)).columns, 140)
    return Console(width=width, highlight=False, soft_wrap=False)
