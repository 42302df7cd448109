"""What the release tests share: the repository, and a release directory built from a fresh clone."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
