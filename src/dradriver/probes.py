"""HTTP endpoints for the kubelet's probes and Prometheus: /healthz, /readyz and /metrics.

Served by `httpserver.HttpServer` (bounded threads, connections and time per request; the
probes on a thread of their own, answered whatever idle connections are held open) on
`--metrics-address`; off unless configured, because a DaemonSet on the host network would
otherwise expose it on every node address.
"""

from __future__ import annotations

from collections.abc import Callable

from dradriver import logs
from dradriver.httpserver import HttpServer, Response

#: A check returns None when fine, else the reason it is not.
Check = Callable[[], str | None]

log = logs.get_logger(component="probes")


def parse_address(address: str) -> tuple[str, int]:
    """`:8080` (all interfaces), `127.0.0.1:8080` or `[::1]:8080` -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid address {address!r}: expected [HOST]:PORT")
    return host.strip("[]"), int(port)


class ProbeServer:
    def __init__(
        self, address: str, *, liveness: Check, readiness: Check, metrics: Callable[[], bytes] | None = None
    ) -> None:
        self._checks = {"/healthz": liveness, "/readyz": readiness}
        self._metrics = metrics
        host, port = parse_address(address)
        self._httpd = HttpServer(host, port, self._respond, probe_paths=self._checks)

    @property
    def port(self) -> int:
        return self._httpd.port

    def start(self) -> None:
        self._httpd.start()

    def stop(self) -> None:
        self._httpd.stop()

    def _respond(self, path: str) -> Response:
        if path == "/metrics" and self._metrics is not None:
            return Response(200, self._metrics(), "text/plain; version=0.0.4; charset=utf-8")
        check = self._checks.get(path)
        if check is None:
            return Response(404, b"not found\n")
        problem = check()
        return Response(200, b"ok\n") if problem is None else Response(503, f"{problem}\n".encode())
