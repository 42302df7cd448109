"""Fixtures shared by the CEL and allocation tests: the dra-oracle co-processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.oracle import Oracle, start


@pytest.fixture(scope="session")
def cel_oracle() -> Iterator[Oracle]:
    yield from start("cel")


# The oracle's allocation time limit (the scheduler's filter timeout is 10 s): long enough that
# generated scenarios are decided, not given up on.
ALLOCATE_TIMEOUT = "60s"


@pytest.fixture(scope="session")
def allocate_oracle() -> Iterator[Oracle]:
    yield from start("allocate", "-timeout", ALLOCATE_TIMEOUT)
