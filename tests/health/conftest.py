"""The publishing tests' API servers (the loopback fake always, a real one when configured)."""

from tests.publish.conftest import backend, gates_off_backend

__all__ = ["backend", "gates_off_backend"]
