"""Errors from the Kubernetes API, as our own small hierarchy.

Callers branch on what happened (not found, conflict, gone, unreachable), never on the client
library's exception types, so the adapter can be swapped or faked without touching them.
"""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """Any failure talking to the Kubernetes API server."""


class ApiError(KubeError):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str, *, reason: str = "", retry_after: float | None = None):
        super().__init__(f"HTTP {status}{f' {reason}' if reason else ''}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class NotFoundError(ApiError):
    """404: the object (or the API) does not exist."""


class ConflictError(ApiError):
    """409: a precondition or resourceVersion did not match, or the name is taken."""


class GoneError(ApiError):
    """410: a watch or list asked for a resourceVersion the server has compacted away."""


class UnreachableError(KubeError):
    """No answer at all: connection refused or reset, DNS failure, or a timeout."""


class UndecodableError(KubeError):
    """The answer is not JSON we can decode (nested deeper than Python recurses, an integer of
    more than 4,300 digits): a fact about that object, not about the server."""


class UnsupportedServerError(KubeError):
    """The server does not serve an API version we need."""


_BY_STATUS: dict[int, type[ApiError]] = {404: NotFoundError, 409: ConflictError, 410: GoneError}


def api_error(status: int, body: bytes | str | None, *, retry_after: float | None = None) -> ApiError:
    """Build the right ApiError from a status code and a (usually metav1.Status) response body."""
    message, reason = _status_message(body)
    cls = _BY_STATUS.get(status, ApiError)
    return cls(status, message, reason=reason, retry_after=retry_after)


def _status_message(body: bytes | str | None) -> tuple[str, str]:
    if not body:
        return "(empty response)", ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        status: Any = json.loads(text)
    except ValueError:
        return text.strip()[:500], ""
    if isinstance(status, dict):
        return str(status.get("message") or text[:500]), str(status.get("reason") or "")
    return text[:500], ""
