"""The publishing tests' API servers (the loopback fake always, a real one when configured)."""

from tests.publish.conftest import backend

__all__ = ["backend"]
