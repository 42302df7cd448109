"""A thin adapter over the official `kubernetes` client: raw JSON in and out, bounded, retried.

Why not the generated `ResourceV1Api` methods: they validate every argument with pydantic and
deserialise answers into models (about 11 ms per 128-device slice), and we only need dicts.
So the adapter borrows the client's configuration, authentication (kubeconfig, exec plugins,
in-cluster token refresh) and connection pool, and sends JSON itself. Every call has a connect
and a read timeout; failures that are usually transient (429, 5xx, connection errors) are
retried with jittered exponential backoff that honours Retry-After.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from dradriver.files import FileInputError, load_document
from dradriver.kube.errors import (
    ApiError,
    KubeError,
    NotFoundError,
    UnreachableError,
    UnsupportedServerError,
    api_error,
)
from dradriver.kube.retry import Backoff, parse_retry_after, retryable_status
from dradriver.logs import get_logger

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = get_logger(component="kube")

RESOURCE_API = "/apis/resource.k8s.io/v1"
#: The first Kubernetes release that serves resource.k8s.io/v1 by default.
MIN_KUBERNETES = "1.34"
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")

Json = dict[str, Any]


@dataclass(frozen=True)
class Timeouts:
    """Seconds. The watch read timeout exceeds two bookmark intervals (the apiserver sends one a
    minute to watchers that ask), so a silent dead connection is noticed without extra requests."""

    connect: float = 5.0
    read: float = 20.0
    watch_read: float = 150.0
    #: Server-side lifetime of one watch request; long, so a quiet node keeps one connection.
    watch_server: int = 3600


@dataclass(frozen=True)
class RetryPolicy:
    backoff: Backoff = field(default_factory=Backoff)
    max_attempts: int = 5
    #: Give up once this many seconds have been spent waiting between attempts.
    budget: float = 15.0


ConfigSource = tuple[Literal["kubeconfig"], str] | tuple[Literal["in-cluster"], None]


def pick_config_source(
    kubeconfig: str | None,
    environ: Mapping[str, str],
    home: Path,
    token_file: Path = SERVICE_ACCOUNT_TOKEN,
) -> ConfigSource | None:
    """Where cluster access comes from: the flag, then the pod's service account (what the
    DaemonSet's RBAC grants), then $KUBECONFIG, then ~/.kube/config; None when there is none
    (serve then runs node-only). As with kubectl, files in $KUBECONFIG that do not exist are
    skipped, and a set $KUBECONFIG means ~/.kube/config is not read; a file given with the
    flag must exist (load_client says so)."""
    if kubeconfig:
        return ("kubeconfig", kubeconfig)
    if (
        environ.get("KUBERNETES_SERVICE_HOST")
        and environ.get("KUBERNETES_SERVICE_PORT")
        and token_file.exists()
    ):
        return ("in-cluster", None)
    if environ.get("KUBECONFIG"):
        existing = [p for p in environ["KUBECONFIG"].split(os.pathsep) if p and Path(p).expanduser().exists()]
        return ("kubeconfig", os.pathsep.join(existing)) if existing else None
    default = home / ".kube" / "config"
    if default.exists():
        return ("kubeconfig", str(default))
    return None


def load_client(kubeconfig: str | None = None, **options: Any) -> KubeClient | None:
    """A client for the cluster this process can reach, or None when it has no access at all.

    A kubeconfig that is missing (when named with the flag) or cannot be used raises KubeError
    naming the file. Kubeconfig files go through the project's safe loader first (limits,
    duplicate keys), so the client library only ever parses a file already found sound.
    """
    source = pick_config_source(kubeconfig, os.environ, Path.home())
    if source is None:
        return None
    # Lazy, as every kubernetes and urllib3 import here: 0.25 s of imports (-X importtime) that
    # the commands without a cluster (`slices`, `discover`) never load (tests/discovery/test_cli.py).
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if source[0] == "in-cluster":
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            for path in source[1].split(os.pathsep):
                if not isinstance(load_document(Path(path).expanduser()), dict):
                    raise ValueError(f"{path}: must be a kubeconfig mapping (apiVersion: v1, kind: Config)")
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=source[1], client_configuration=configuration, persist_config=False
            )
    except FileInputError as err:
        raise KubeError(f"cannot load kubeconfig {err}") from None
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        where = "in-cluster service account" if source[0] == "in-cluster" else f"kubeconfig {source[1]}"
        raise KubeError(f"cannot load {where}: {err}") from err
    # We retry ourselves (with backoff and Retry-After); urllib3's immediate retries would hide
    # outages and double non-idempotent requests.
    configuration.retries = False
    return KubeClient(client.ApiClient(configuration), **options)


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Json


class WatchStream:
    """One watch request's event stream. Iterate it; `close()` from any thread ends it.

    The iterator ends when the server ends the watch or the read times out (reconnect from the
    last resourceVersion); an ERROR event raises (GoneError for 410: list again).
    """

    def __init__(self, response: Any) -> None:
        self._response = response
        self._closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import HTTPError

        try:
            for line in iter_resp_lines(self._response):  # type: ignore[no-untyped-call]
                event = json.loads(line)
                kind = event.get("type", "")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    raise api_error(int(obj.get("code") or 500), json.dumps(obj))
                yield WatchEvent(kind, obj)
        except (HTTPError, OSError, ValueError) as err:
            if not self._closed:
                log.debug("watch stream ended", error=str(err))
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # shutdown() unblocks a read in progress on another thread; close() alone would not.
        # It refuses once urllib3 closed the response or pooled the connection (the stream ended).
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            self._response.shutdown()
        self._response.release_conn()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KubeClient:
    """The calls dradriver makes, on raw JSON dicts."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api = api_client
        self.timeouts = timeouts or Timeouts()
        self.retry = retry or RetryPolicy()
        self._sleep = sleep

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._api.rest_client.close()

    # -- generic -------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Json | None = None,
        idempotent: bool = True,
    ) -> Json:
        """Send one API call (retried as policy allows) and return the decoded JSON answer.

        `idempotent=False` (creates with generateName) retries only when the server surely did
        not act: 429, 503, or a connection that was never established.
        """
        attempt = 0
        waited = 0.0
        while True:
            try:
                return self._once(method, path, query, body)
            except (ApiError, UnreachableError) as err:
                retry_after = err.retry_after if isinstance(err, ApiError) else None
                if not self._should_retry(err, idempotent) or attempt + 1 >= self.retry.max_attempts:
                    raise
                delay = self.retry.backoff.wait(attempt, retry_after)
                if waited + delay > self.retry.budget:
                    raise
                log.debug(
                    "retrying API call", method=method, path=path, error=str(err), retry_in=round(delay, 3)
                )
                self._sleep(delay)
                waited += delay
                attempt += 1

    @staticmethod
    def _should_retry(err: KubeError, idempotent: bool) -> bool:
        if isinstance(err, ApiError):
            return retryable_status(err.status) if idempotent else err.status in (429, 503)
        if isinstance(err, _NotConnectedError):
            return True
        return idempotent

    def _send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: Json | None,
        read_timeout: float,
    ) -> Any:
        """Send and return the raw urllib3 response (not yet read); connection errors -> UnreachableError."""
        from urllib3.exceptions import ConnectTimeoutError, HTTPError

        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        _, url, headers, _, _ = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query or []),
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.rest_client.request(  # type: ignore[no-untyped-call]
                method,
                url,
                headers=headers,
                body=body,
                _request_timeout=(self.timeouts.connect, read_timeout),
            )
        except ConnectTimeoutError as err:  # includes connection refused and DNS failures
            raise _NotConnectedError(f"{method} {path}: cannot connect to {self.host}: {err}") from err
        except HTTPError as err:
            raise UnreachableError(f"{method} {path}: {err}") from err
        return response.response

    def _once(self, method: str, path: str, query: list[tuple[str, str]] | None, body: Json | None) -> Json:
        from urllib3.exceptions import HTTPError

        response = self._send(method, path, query, body, self.timeouts.read)
        try:
            data = response.data
        except HTTPError as err:
            raise UnreachableError(f"{method} {path}: reading the answer: {err}") from err
        if not 200 <= response.status < 300:
            raise api_error(
                response.status, data, retry_after=parse_retry_after(response.headers.get("Retry-After"))
            )
        result: Json = json.loads(data) if data else {}
        return result

    def _watch(self, path: str, resource_version: str, field_selector: str | None = None) -> WatchStream:
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.timeouts.watch_server)),
        ]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        response = self._send("GET", path, query, None, self.timeouts.watch_read)
        if response.status != 200:
            data = response.data
            response.release_conn()
            raise api_error(
                response.status, data, retry_after=parse_retry_after(response.headers.get("Retry-After"))
            )
        return WatchStream(response)

    # -- discovery -----------------------------------------------------------------------------

    def check_resource_v1(self) -> None:
        """Raise UnsupportedServerError unless the server serves resource.k8s.io/v1 ResourceSlices."""
        try:
            resources = self.request("GET", RESOURCE_API)
        except NotFoundError as err:
            raise UnsupportedServerError(
                f"the API server at {self.host} does not serve resource.k8s.io/v1 "
                f"(server version {self.server_version() or 'unknown'}); dradriver needs "
                f"Kubernetes >= {MIN_KUBERNETES}, where DRA's v1 API is served by default"
            ) from err
        names = {r.get("name") for r in resources.get("resources", [])}
        if "resourceslices" not in names:
            raise UnsupportedServerError(
                f"the API server at {self.host} serves resource.k8s.io/v1 without resourceslices"
            )

    def server_version(self) -> str | None:
        """The server's gitVersion, e.g. v1.36.0; None if it will not say."""
        try:
            return str(self.request("GET", "/version").get("gitVersion") or "") or None
        except KubeError:
            return None

    # -- nodes, claims, classes, events --------------------------------------------------------

    def get_node(self, name: str) -> Json:
        return self.request("GET", f"/api/v1/nodes/{_seg(name)}")

    def node_uid(self, name: str) -> str:
        return str(self.get_node(name)["metadata"]["uid"])

    def get_resource_claim(self, namespace: str, name: str) -> Json:
        """The v1 ResourceClaim (NotFoundError if it does not exist)."""
        return self.request("GET", f"{RESOURCE_API}/namespaces/{_seg(namespace)}/resourceclaims/{_seg(name)}")

    def list_resource_claims(self) -> list[Json]:
        """Every v1 ResourceClaim of every namespace."""
        items: list[Json] = self.request("GET", f"{RESOURCE_API}/resourceclaims").get("items", [])
        return items

    def list_device_classes(self) -> list[Json]:
        items: list[Json] = self.request("GET", f"{RESOURCE_API}/deviceclasses").get("items", [])
        return items

    def create_event(self, namespace: str, event: Json) -> Json:
        # generateName: a retry after a lost answer would create a second Event
        return self.request(
            "POST", f"/api/v1/namespaces/{_seg(namespace)}/events", body=event, idempotent=False
        )

    # -- resource slices -----------------------------------------------------------------------

    def list_resource_slices(self, field_selector: str | None = None) -> Json:
        """The ResourceSliceList (with metadata.resourceVersion, for a watch to start from)."""
        query = [("fieldSelector", field_selector)] if field_selector else []
        return self.request("GET", f"{RESOURCE_API}/resourceslices", query=query)

    def watch_resource_slices(self, field_selector: str | None, resource_version: str) -> WatchStream:
        """Open a watch from `resource_version` (one attempt: the caller owns reconnecting)."""
        return self._watch(f"{RESOURCE_API}/resourceslices", resource_version, field_selector)

    def create_resource_slice(self, slice_: Json) -> Json:
        return self.request("POST", f"{RESOURCE_API}/resourceslices", body=slice_, idempotent=False)

    def update_resource_slice(self, slice_: Json) -> Json:
        """Full update (PUT); metadata.resourceVersion makes it conditional (ConflictError if stale)."""
        name = slice_["metadata"]["name"]
        return self.request("PUT", f"{RESOURCE_API}/resourceslices/{_seg(name)}", body=slice_)

    def delete_resource_slice(
        self, name: str, *, uid: str | None = None, resource_version: str | None = None
    ) -> None:
        """Delete, only if the object still has this UID and resourceVersion (when given)."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body: Json = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if preconditions:
            body["preconditions"] = preconditions
        self.request("DELETE", f"{RESOURCE_API}/resourceslices/{_seg(name)}", body=body)


class _NotConnectedError(UnreachableError):
    """The connection was never established, so the request surely did not reach the server."""


def _seg(value: str) -> str:
    """One URL path segment."""
    return quote(value, safe="")
