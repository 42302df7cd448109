"""Kubernetes API access: raw JSON dicts over the standard library's HTTP client, its
connections kept alive (`kube.transport`).

`load_client()` finds cluster access (flag, in-cluster, $KUBECONFIG, ~/.kube/config) and
returns None when there is none, so `serve` can run node-only.
"""

from dradriver.kube.client import (
    MIN_KUBERNETES,
    KubeClient,
    RetryPolicy,
    Timeouts,
    WatchEvent,
    WatchStream,
    load_client,
    pick_config_source,
)
from dradriver.kube.errors import (
    ApiError,
    ConflictError,
    GoneError,
    KubeError,
    NotFoundError,
    UndecodableError,
    UnreachableError,
    UnsupportedServerError,
)
from dradriver.kube.retry import Backoff

__all__ = [
    "MIN_KUBERNETES",
    "ApiError",
    "Backoff",
    "ConflictError",
    "GoneError",
    "KubeClient",
    "KubeError",
    "NotFoundError",
    "RetryPolicy",
    "Timeouts",
    "UndecodableError",
    "UnreachableError",
    "UnsupportedServerError",
    "WatchEvent",
    "WatchStream",
    "load_client",
    "pick_config_source",
]
