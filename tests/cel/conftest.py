"""Fixtures shared by the CEL and allocation tests: the dra-oracle co-processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.oracle import Oracle, start


@pytest.fixture(scope="session")
def cel_oracle() -> Iterator[Oracle]:
    yield from start("cel")


@pytest.fixture(scope="session")
def allocate_oracle() -> Iterator[Oracle]:
    yield from start("allocate")
