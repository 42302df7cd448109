"""The telemetry tests run serve against an API server (the publishing tests' `backend`)."""

from tests.publish.conftest import backend

__all__ = ["backend"]
