"""HTTP endpoints for the kubelet's probes and Prometheus: /healthz, /readyz and /metrics.

Served by the stdlib's threading HTTP server on `--metrics-address`; off unless configured,
because a DaemonSet on the host network would otherwise expose it on every node address.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dradriver import logs

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
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="probes", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        checks = self._checks
        metrics = self._metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics" and metrics is not None:
                    self._reply(200, metrics().decode(), "text/plain; version=0.0.4; charset=utf-8")
                    return
                check = checks.get(path)
                if check is None:
                    self._reply(404, "not found\n")
                    return
                problem = check()
                self._reply(200, "ok\n") if problem is None else self._reply(503, f"{problem}\n")

            def _reply(self, code: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                """Probes arrive every few seconds: keep them out of the log."""

        return Handler
