"""The API client's tests talk to the publishing tests' fake API server."""

from tests.publish.conftest import fake_api

__all__ = ["fake_api"]
