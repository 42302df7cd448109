"""A thin client for the Kubernetes API: raw JSON in and out over reused connections
(`kube.transport`), bounded, retried.

Why not the official `kubernetes` package: its generated methods validate every argument and
deserialise answers into models (about 11 ms per 128-device slice) where we need dicts, and
importing it costs every node start 0.2-0.35 s of CPU and 9 MB (kube/access.py says what we read
of a kubeconfig instead). Every call has a connect and a read timeout; failures that are usually
transient (429, 5xx, connection errors) are retried with jittered exponential backoff that
honours Retry-After; a 401 renews a renewable token (token file, exec plugin) once.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlencode

from dradriver import __version__
from dradriver.kube.access import (
    SERVICE_ACCOUNT_DIR,
    Access,
    AccessError,
    Credentials,
    from_kubeconfig,
    in_cluster,
)
from dradriver.kube.errors import (
    ApiError,
    KubeError,
    NotFoundError,
    UndecodableError,
    UnreachableError,
    UnsupportedServerError,
    api_error,
)
from dradriver.kube.retry import Backoff, parse_retry_after, retryable_status
from dradriver.kube.transport import SEND_ERRORS, Answer, ConnectError, Connections, SendError
from dradriver.logs import get_logger

log = get_logger(component="kube")

RESOURCE_API = "/apis/resource.k8s.io/v1"
#: The first Kubernetes release that serves resource.k8s.io/v1 by default.
MIN_KUBERNETES = "1.34"
SERVICE_ACCOUNT_TOKEN = SERVICE_ACCOUNT_DIR / "token"
USER_AGENT = f"dradriver/{__version__}"
JSON = "application/json"
#: A watch's objects reduced to their metadata by the API server (as kubectl's and client-go's
#: metadata informers ask): what a watch that only needs to notice changes costs the server.
METADATA_JSON = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

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
    naming the file. Kubeconfig files go through the project's safe loader (limits, duplicate keys).
    """
    source = pick_config_source(kubeconfig, os.environ, Path.home())
    if source is None:
        return None
    try:
        access = in_cluster(os.environ) if source[0] == "in-cluster" else from_kubeconfig(source[1])
        return KubeClient(access, **options)
    except AccessError as err:
        raise KubeError(f"cannot load {err}") from None


def tls_context(access: Access) -> ssl.SSLContext | None:
    """TLS as the access says, for an https server (client certificates are loaded from a private
    temporary directory: Python's ssl reads them only from files)."""
    if not access.server.startswith("https:"):
        return None
    context = ssl.create_default_context(cadata=access.ca_pem)
    if access.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if access.client_cert is not None:
        with tempfile.TemporaryDirectory(prefix="dradriver-tls-") as directory:
            cert, key = Path(directory, "tls.crt"), Path(directory, "tls.key")
            cert.write_text(access.client_cert[0])
            key.touch(mode=0o600)
            key.write_text(access.client_cert[1])
            try:
                context.load_cert_chain(cert, key)
            except ssl.SSLError as err:
                raise AccessError(f"{access.origin}: client-certificate and client-key: {err}") from None
    return context


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Json


class WatchStream:
    """One watch request's event stream. Iterate it; `close()` from any thread ends it.

    The iterator ends when the server ends the watch or the read times out (reconnect from the
    last resourceVersion); an ERROR event raises (GoneError for 410: list again).
    Lock rule: `_lock` guards `_closed` and `_reading`; the connection is closed by the thread
    that iterates, or by `close()` when none does (closing it under a reader would break the read).
    """

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._lock = threading.Lock()
        self._closed = False
        self._reading = False

    def __iter__(self) -> Iterator[WatchEvent]:
        with self._lock:
            if self._closed:
                return
            self._reading = True
        try:
            while line := self._answer.readline():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type", "")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    raise api_error(int(obj.get("code") or 500), json.dumps(obj))
                yield WatchEvent(kind, obj)
        except (*SEND_ERRORS, ValueError, RecursionError) as err:
            if not self._closed:
                log.debug("watch stream ended", error=str(err))
        finally:
            with self._lock:
                self._closed = True
                self._reading = False
            self._answer.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
        self._answer.stop()
        if not reading:
            self._answer.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KubeClient:
    """The calls dradriver makes, on raw JSON dicts."""

    def __init__(
        self,
        access: Access,
        *,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._access = access
        self._credentials = Credentials(access)
        self.timeouts = timeouts or Timeouts()
        # As the official client: up to 5 idle connections per core are kept for reuse.
        self._connections = Connections(
            access.server,
            tls=tls_context(access),
            server_name=access.tls_server_name,
            idle_limit=(os.cpu_count() or 1) * 5,
            connect_timeout=self.timeouts.connect,
        )
        self.retry = retry or RetryPolicy()
        self._sleep = sleep

    @property
    def host(self) -> str:
        return self._access.server

    @property
    def service_account_like(self) -> bool:
        """Whether the credentials could be a service account's: a bearer token or token file
        (client certificates and exec plugins never are)."""
        return self._access.token is not None or self._access.token_file is not None

    def close(self) -> None:
        self._connections.close()

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
        *,
        accept: str = JSON,
    ) -> Answer:
        """Send and return the answer (its body not yet read); connection errors -> UnreachableError.
        A 401 to a renewable token renews it and sends once more."""
        target = path + (f"?{urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        for renew in (True, False):
            headers = {"Accept": accept, "Content-Type": JSON, "User-Agent": USER_AGENT}
            try:
                if (authorization := self._credentials.header()) is not None:
                    headers["Authorization"] = authorization
                answer = self._connections.send(
                    method, target, body=data, headers=headers, read_timeout=read_timeout
                )
            except AccessError as err:
                raise KubeError(str(err)) from None
            except ConnectError as err:  # refused, DNS, timed out: the request was not sent
                raise _NotConnectedError(f"{method} {path}: cannot connect to {self.host}: {err}") from err
            except SendError as err:
                raise UnreachableError(f"{method} {path}: {err}") from err
            if answer.status != 401 or not renew or not self._credentials.renewable:
                return answer
            with contextlib.suppress(SendError):
                answer.read()
            self._credentials.invalidate()
        raise AssertionError("unreachable")  # the second pass always returns

    def _once(self, method: str, path: str, query: list[tuple[str, str]] | None, body: Json | None) -> Json:
        answer = self._send(method, path, query, body, self.timeouts.read)
        data = _read(answer, method, path)
        if not 200 <= answer.status < 300:
            raise _refused(answer, data)
        try:
            result: Json = json.loads(data) if data else {}
        except (ValueError, RecursionError) as err:
            raise UndecodableError(f"{method} {path}: cannot decode the answer: {err}") from None
        return result

    def _watch(
        self, path: str, resource_version: str, field_selector: str | None = None, *, accept: str = JSON
    ) -> WatchStream:
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.timeouts.watch_server)),
        ]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        answer = self._send("GET", path, query, None, self.timeouts.watch_read, accept=accept)
        if answer.status != 200:
            raise _refused(answer, _read(answer, "GET", path))
        return WatchStream(answer)

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

    def watch_resource_slices(
        self, field_selector: str | None, resource_version: str, *, metadata_only: bool = False
    ) -> WatchStream:
        """Open a watch from `resource_version` (one attempt: the caller owns reconnecting);
        `metadata_only`: its objects are PartialObjectMetadata, without spec."""
        return self._watch(
            f"{RESOURCE_API}/resourceslices",
            resource_version,
            field_selector,
            accept=METADATA_JSON if metadata_only else JSON,
        )

    def get_resource_slice(self, name: str) -> Json:
        """The ResourceSlice (NotFoundError if it does not exist)."""
        return self.request("GET", f"{RESOURCE_API}/resourceslices/{_seg(name)}")

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


def _read(answer: Answer, method: str, path: str) -> bytes:
    """The whole body of an answer; UnreachableError if it cannot be read."""
    try:
        return answer.read()
    except SendError as err:
        raise UnreachableError(f"{method} {path}: reading the answer: {err}") from err


def _refused(answer: Answer, body: bytes) -> ApiError:
    """The error an answer that is no success stands for."""
    return api_error(answer.status, body, retry_after=parse_retry_after(answer.header("Retry-After")))


def _seg(value: str) -> str:
    """One URL path segment."""
    return quote(value, safe="")
