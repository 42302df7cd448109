"""The fault suite's in-process node (see tests/prepare/node.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import short_tmpdir
from tests.prepare.node import Node


@pytest.fixture
def node() -> Iterator[Node]:
    with short_tmpdir() as root:
        yield Node(root, "dgx-h100")
