"""A loopback stand-in for kube-apiserver, for tests that cannot have a real one.

It speaks the real wire protocol for the few resources dradriver uses (nodes, events,
ResourceSlices, DeviceClasses, ResourceClaims): bearer-token auth, cluster-wide
resourceVersions, generateName, field selectors, conditional PUT, DELETE preconditions, no-op
updates that keep the resourceVersion, chunked watch streams with bookmarks and 410 Gone after
compaction, and the two DRA behaviours the publisher depends on: taint timeAdded set by the
server, and gated fields dropped when a feature gate is "off". It records every request, can
fail the next requests on demand, and can be told not to serve resource.k8s.io/v1.

It is not Kubernetes: validation is minimal. Tests that need the real thing run against
KUBECONFIG / DRADRIVER_TEST_KUBECONFIG.
"""

from __future__ import annotations

import copy
import json
import queue
import random
import re
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]

RESOURCES = {
    # plural: (api prefix, kind, namespaced)
    "nodes": ("/api/v1", "Node", False),
    "events": ("/api/v1", "Event", True),
    "pods": ("/api/v1", "Pod", True),
    "resourceslices": ("/apis/resource.k8s.io/v1", "ResourceSlice", False),
    "deviceclasses": ("/apis/resource.k8s.io/v1", "DeviceClass", False),
    "resourceclaims": ("/apis/resource.k8s.io/v1", "ResourceClaim", True),
}
_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/resource\.k8s\.io/v1)(?:/watch)?"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?$"
)
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"
HISTORY_LIMIT = 5000


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    user_agent: str = field(default="", compare=False)
    accept: str = field(default="", compare=False)

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")

    @property
    def collection(self) -> bool:
        """A list or watch of a resource, not a request for one named object."""
        match = _PATH.match(self.path)
        return self.method == "GET" and match is not None and match["name"] is None

    @property
    def write(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")


class _Watcher:
    def __init__(self, plural: str, namespace: str | None, selector: list[tuple[str, str]]) -> None:
        self.plural = plural
        self.namespace = namespace
        self.selector = selector
        self.events: queue.Queue[Json | None] = queue.Queue()


class FakeApiServer:
    def __init__(
        self,
        *,
        gates_off: frozenset[str] = frozenset(),
        serve_resource_v1: bool = True,
        bookmark_interval: float = 60.0,
        token: str = "dradriver-test-token",
        allow_anonymous: bool = False,
        max_watch_seconds: float | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.gates_off = gates_off
        self.serve_resource_v1 = serve_resource_v1
        self.bookmark_interval = bookmark_interval
        self.token = token
        self.allow_anonymous = allow_anonymous
        self.max_watch_seconds = max_watch_seconds
        #: An admission policy on ResourceSlice creates: the reason to refuse one, or None. The
        #: default stands in for dradriver's own policy as serve's start check sees it.
        self.slice_admission: Callable[[Json], str | None] | None = _no_invalid_nodes
        self.requests: list[Request] = []
        self._lock = threading.RLock()
        self._rv = 100
        self._objects: dict[tuple[str, str | None, str], Json] = {}
        self._history: list[tuple[int, str, str, Json]] = []  # (rv, plural, type, object)
        self._oldest_rv = 0
        self._watchers: list[_Watcher] = []
        self._faults: list[tuple[int, float | None]] = []
        self._stalls: list[tuple[str, threading.Event]] = []
        #: Verbatim answers to GETs of these paths: objects nested deeper than Python can copy or
        #: encode.
        self.raw_answers: dict[str, bytes] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._scheme = "https" if tls is not None else "http"
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}"

    def start(self) -> FakeApiServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            for watcher in self._watchers:
                watcher.events.put(None)
        if self._thread is not None:
            self._server.shutdown()
        self._server.server_close()

    def write_kubeconfig(self, path: Path, server: str | None = None) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": server or self.url}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "admin"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    # -- test helpers --------------------------------------------------------------------------

    def fail_next(self, status: int, count: int = 1, retry_after: float | None = None) -> None:
        """Answer the next `count` non-watch requests with `status`."""
        with self._lock:
            self._faults.extend([(status, retry_after)] * count)

    def stall(self, path_part: str) -> threading.Event:
        """Hold every request whose path contains `path_part` until the returned event is set
        (a server that accepted the request and never answers)."""
        release = threading.Event()
        with self._lock:
            self._stalls.append((path_part, release))
        return release

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older watches get 410 Gone."""
        with self._lock:
            self._history.clear()
            self._oldest_rv = self._rv

    def requests_since(self, index: int) -> list[Request]:
        with self._lock:
            return list(self.requests[index:])

    def objects(self, plural: str) -> list[Json]:
        with self._lock:
            return [copy.deepcopy(o) for (p, _, _), o in self._objects.items() if p == plural]

    # -- storage -------------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _notify(self, plural: str, kind: str, obj: Json) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._history.append((rv, plural, kind, copy.deepcopy(obj)))
        if len(self._history) > HISTORY_LIMIT:
            dropped = self._history.pop(0)
            self._oldest_rv = dropped[0]
        for watcher in self._watchers:
            if watcher.plural == plural and _matches(obj, watcher.namespace, watcher.selector):
                watcher.events.put({"type": kind, "object": copy.deepcopy(obj)})

    def create(self, plural: str, namespace: str | None, obj: Json, *, dry_run: bool = False) -> Json:
        """Store a new object (`dry_run`: only answer what would be stored, as dryRun=All)."""
        with self._lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise _FailError(422, "Invalid", "metadata.name or metadata.generateName is required")
                meta["name"] = meta["generateName"] + "".join(random.choices(_SUFFIX_CHARS, k=5))
            key = (plural, namespace, meta["name"])
            if key in self._objects:
                raise _FailError(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            if namespace:
                meta["namespace"] = namespace
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta["generation"] = 1
            if not dry_run:  # a dry run takes no resourceVersion
                meta["resourceVersion"] = str(self._next_rv())
            obj["apiVersion"], obj["kind"] = _api_version(plural), RESOURCES[plural][1]
            if plural == "resourceslices":
                self._prepare_slice(obj, None)
            if dry_run:
                return obj
            self._objects[key] = obj
            self._notify(plural, "ADDED", obj)
            return copy.deepcopy(obj)

    def update(self, plural: str, namespace: str | None, name: str, obj: Json) -> Json:
        with self._lock:
            key = (plural, namespace, name)
            current = self._objects.get(key)
            if current is None:
                raise _FailError(404, "NotFound", f'{plural} "{name}" not found')
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            rv = meta.get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise _FailError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            if meta.get("uid") and meta["uid"] != current["metadata"]["uid"]:
                raise _FailError(409, "Conflict", f"Precondition failed: UID in object meta: {meta['uid']}")
            for field in ("uid", "creationTimestamp", "generation", "resourceVersion", "name"):
                meta[field] = current["metadata"][field]
            if namespace:
                meta["namespace"] = namespace
            if obj.get("apiVersion") != current["apiVersion"] or obj.get("kind") != current["kind"]:
                raise _FailError(400, "BadRequest", "Object 'Kind' is missing or does not match")
            if plural == "resourceslices":
                self._prepare_slice(obj, current)
            if obj == current:  # a no-op update is not written (etcd3 store behaviour)
                return copy.deepcopy(current)
            if obj.get("spec") != current.get("spec"):
                meta["generation"] = current["metadata"]["generation"] + 1
            meta["resourceVersion"] = str(self._next_rv())
            self._objects[key] = obj
            self._notify(plural, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, plural: str, namespace: str | None, name: str, options: Json | None = None) -> Json:
        with self._lock:
            key = (plural, namespace, name)
            current = self._objects.get(key)
            if current is None:
                raise _FailError(404, "NotFound", f'{plural} "{name}" not found')
            pre = (options or {}).get("preconditions") or {}
            for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                if pre.get(field) and pre[field] != current["metadata"][field]:
                    raise _FailError(
                        409,
                        "Conflict",
                        f"Precondition failed: {label} in precondition: {pre[field]}, "
                        f"{label} in object meta: {current['metadata'][field]}",
                    )
            del self._objects[key]
            gone = copy.deepcopy(current)
            gone["metadata"]["resourceVersion"] = str(self._next_rv())
            self._notify(plural, "DELETED", gone)
            return gone

    def list_objects(self, plural: str, namespace: str | None, selector: list[tuple[str, str]]) -> Json:
        with self._lock:
            # Like the apiserver's JSON lists: items carry no apiVersion and kind.
            items = [
                {k: copy.deepcopy(v) for k, v in o.items() if k not in ("apiVersion", "kind")}
                for (p, _, _), o in sorted(self._objects.items(), key=lambda kv: kv[0][2])
                if p == plural and _matches(o, namespace, selector)
            ]
            return {
                "apiVersion": _api_version(plural),
                "kind": RESOURCES[plural][1] + "List",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

    def _prepare_slice(self, obj: Json, current: Json | None) -> None:
        spec = obj.get("spec") or {}
        for required in ("driver", "pool"):
            if not spec.get(required):
                raise _FailError(422, "Invalid", f"spec.{required}: Required value")
        if current is not None:
            for path in (("driver",), ("nodeName",), ("pool", "name")):
                if _get(spec, path) != _get(current["spec"], path):
                    raise _FailError(
                        422, "Invalid", f"spec.{'.'.join(path)}: Invalid value: field is immutable"
                    )
        if int(spec["pool"].get("resourceSliceCount") or 0) <= 0:
            raise _FailError(422, "Invalid", "spec.pool.resourceSliceCount: must be greater than zero")
        if len(spec.get("devices") or []) > 128:
            raise _FailError(422, "Invalid", "spec.devices: Too many: must have at most 128 items")
        # Like the apiserver's dropDisabledFields: a gated field survives an update only when
        # the stored object already uses the feature.
        old_spec = (current or {}).get("spec") or {}
        old_devices = old_spec.get("devices") or []
        drop_taints = "DRADeviceTaints" in self.gates_off and not any(d.get("taints") for d in old_devices)
        drop_counters = "DRAPartitionableDevices" in self.gates_off and not (
            old_spec.get("sharedCounters")
            or old_spec.get("perDeviceNodeSelection") is not None
            or any(d.get("consumesCounters") for d in old_devices)
        )
        if drop_counters:
            spec.pop("sharedCounters", None)
            spec.pop("perDeviceNodeSelection", None)
        for device in spec.get("devices") or []:
            if drop_taints:
                device.pop("taints", None)
            if drop_counters:
                device.pop("consumesCounters", None)
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", _now())

    # -- HTTP ----------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as Go's net/http does; else delayed ACKs add 40 ms

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_POST(self) -> None:
                server._handle(self, "POST")

            def do_PUT(self) -> None:
                server._handle(self, "PUT")

            def do_DELETE(self) -> None:
                server._handle(self, "DELETE")

        return Handler

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        request = Request(
            method, url.path, query, h.headers.get("User-Agent", ""), h.headers.get("Accept", "")
        )
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append(request)
            fault = self._faults.pop(0) if self._faults and not request.watch else None
            held = [release for part, release in self._stalls if part in url.path and not request.watch]
        for release in held:
            release.wait(120)
        try:
            auth = h.headers.get("Authorization")
            if auth != f"Bearer {self.token}" and not (auth is None and self.allow_anonymous):
                raise _FailError(401, "Unauthorized", "Unauthorized")
            if fault is not None:
                headers = {"Retry-After": str(int(fault[1]))} if fault[1] is not None else {}
                raise _FailError(
                    fault[0], "InternalError" if fault[0] >= 500 else "TooManyRequests", "injected", headers
                )
            body = json.loads(raw) if raw else None
            if method == "GET" and url.path in self.raw_answers:
                _send_bytes(h, 200, self.raw_answers[url.path])
                return
            if request.watch:
                self._watch(h, url.path, query, metadata_only="as=PartialObjectMetadata" in request.accept)
                return
            status, answer = self._route(method, url.path, query, body)
        except _FailError as fail:
            status, answer = fail.status, fail.body()
            _send(h, status, answer, fail.headers)
            return
        _send(h, status, answer)

    def _route(self, method: str, path: str, query: dict[str, str], body: Json | None) -> tuple[int, Json]:
        if path == "/version":
            return 200, {"major": "1", "minor": "36", "gitVersion": "v1.36.0-dradriver-fake"}
        if path == "/apis/resource.k8s.io/v1":
            if not self.serve_resource_v1:
                raise _FailError(404, "NotFound", "the server could not find the requested resource")
            return 200, {
                "kind": "APIResourceList",
                "groupVersion": "resource.k8s.io/v1",
                "resources": [
                    {"name": p, "kind": k, "namespaced": ns}
                    for p, (prefix, k, ns) in RESOURCES.items()
                    if prefix.startswith("/apis/")
                ],
            }
        plural, namespace, name = self._parse(path)
        if method == "GET" and name is None:
            return 200, self.list_objects(plural, namespace, _selector(query.get("fieldSelector", "")))
        if method == "GET" and name is not None:
            with self._lock:
                obj = self._objects.get((plural, namespace, name))
            if obj is None:
                raise _FailError(404, "NotFound", f'{plural} "{name}" not found')
            return 200, copy.deepcopy(obj)
        if method == "POST" and name is None:
            denied = (
                self.slice_admission(body or {})
                if plural == "resourceslices" and self.slice_admission
                else None
            )
            if denied:
                raise _FailError(
                    422,
                    "Invalid",
                    f"ValidatingAdmissionPolicy 'fake' with binding 'fake' denied request: {denied}",
                )
            return 201, self.create(plural, namespace, body or {}, dry_run=query.get("dryRun") == "All")
        if method == "PUT" and name is not None:
            return 200, self.update(plural, namespace, name, body or {})
        if method == "DELETE" and name is not None:
            return 200, self.delete(plural, namespace, name, body)
        raise _FailError(405, "MethodNotAllowed", f"{method} {path}")

    def _parse(self, path: str) -> tuple[str, str | None, str | None]:
        match = _PATH.match(path)
        if not match or match["plural"] not in RESOURCES or RESOURCES[match["plural"]][0] != match["prefix"]:
            raise _FailError(404, "NotFound", "the server could not find the requested resource")
        if match["prefix"] != "/api/v1" and not self.serve_resource_v1:
            raise _FailError(404, "NotFound", "the server could not find the requested resource")
        return match["plural"], match["ns"], match["name"]

    def _watch(
        self, h: BaseHTTPRequestHandler, path: str, query: dict[str, str], *, metadata_only: bool
    ) -> None:
        plural, namespace, _ = self._parse(path)
        watcher = _Watcher(plural, namespace, _selector(query.get("fieldSelector", "")))
        since = query.get("resourceVersion", "")
        seconds = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + min(
            seconds, seconds if self.max_watch_seconds is None else self.max_watch_seconds
        )
        bookmarks = query.get("allowWatchBookmarks") == "true"
        with self._lock:
            if since in ("", "0"):
                backlog = [
                    {
                        "type": "ADDED",
                        "object": {"apiVersion": _api_version(plural), "kind": RESOURCES[plural][1], **o},
                    }
                    for o in self.list_objects(plural, namespace, watcher.selector)["items"]
                ]
            elif int(since) < self._oldest_rv:
                backlog = [
                    {"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {since}")}
                ]
            else:
                backlog = [
                    {"type": kind, "object": copy.deepcopy(obj)}
                    for rv, p, kind, obj in self._history
                    if rv > int(since) and p == plural and _matches(obj, namespace, watcher.selector)
                ]
            self._watchers.append(watcher)
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for event in self._events(watcher, backlog, deadline, bookmarks):
                sent = event
                if metadata_only and event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    sent = {"type": event["type"], "object": _partial(event["object"])}
                data = json.dumps(sent).encode() + b"\n"
                h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                h.wfile.flush()
                if event["type"] == "ERROR":
                    break
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            pass
        finally:
            with self._lock:
                self._watchers.remove(watcher)
            h.close_connection = True

    def _events(
        self, watcher: _Watcher, backlog: list[Json], deadline: float, bookmarks: bool
    ) -> Iterator[Json]:
        yield from backlog
        next_bookmark = time.monotonic() + self.bookmark_interval
        while (now := time.monotonic()) < deadline:
            try:
                event = watcher.events.get(timeout=max(0.0, min(deadline, next_bookmark) - now))
            except queue.Empty:
                if bookmarks and time.monotonic() >= next_bookmark:
                    with self._lock:
                        rv = str(self._rv)
                    yield {
                        "type": "BOOKMARK",
                        "object": {"kind": "ResourceSlice", "metadata": {"resourceVersion": rv}},
                    }
                    next_bookmark = time.monotonic() + self.bookmark_interval
                continue
            if event is None:
                return
            yield event


class _FailError(Exception):
    def __init__(self, status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.headers = headers or {}

    def body(self) -> Json:
        return _status(self.status, self.reason, self.message)


def _partial(obj: Json) -> Json:
    """The object as a metadata watch sends it."""
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def _status(code: int, reason: str, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _send(h: BaseHTTPRequestHandler, status: int, body: Json, headers: dict[str, str] | None = None) -> None:
    _send_bytes(h, status, json.dumps(body).encode(), headers)


def _send_bytes(
    h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str] | None = None
) -> None:
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(data)


def _api_version(plural: str) -> str:
    return RESOURCES[plural][0].removeprefix("/api/").removeprefix("/apis/")


def _selector(text: str) -> list[tuple[str, str]]:
    return [tuple(term.split("=", 1)) for term in text.split(",") if "=" in term]  # type: ignore[misc]


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _matches(obj: Json, namespace: str | None, selector: list[tuple[str, str]]) -> bool:
    if namespace and obj["metadata"].get("namespace") != namespace:
        return False
    return all(str(_get(obj, tuple(field.split("."))) or "") == value for field, value in selector)


def _no_invalid_nodes(slice_: Json) -> str | None:
    """Refuse slices of `*.invalid` nodes: what no test's node is called, and what serve's
    admission check probes with (a real policy refuses every node but the caller's)."""
    node = str((slice_.get("spec") or {}).get("nodeName", ""))
    return (
        f"may only write ResourceSlices of its own node, not {node!r}" if node.endswith(".invalid") else None
    )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def main() -> None:
    """`python tests/publish/kubefake.py KUBECONFIG_OUT [--gates-off G1,G2]`: serve until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kubeconfig", type=Path)
    parser.add_argument("--gates-off", default="")
    args = parser.parse_args()
    gates = frozenset(g for g in args.gates_off.split(",") if g)
    # kubectl sends no token over plain http, so the standalone server also lets anonymous in.
    server = FakeApiServer(gates_off=gates, allow_anonymous=True).start()
    server.write_kubeconfig(args.kubeconfig)
    print(f"fake apiserver on {server.url}; kubeconfig {args.kubeconfig}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
