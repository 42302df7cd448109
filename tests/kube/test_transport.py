"""Connections to the API server (kube.transport), over real sockets to a local HTTP/1.1 server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dradriver.kube.transport import ConnectError, Connections, SendError


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        #: (client port, path) of each request, in order.
        self.seen: list[tuple[int, str]] = []
        #: Close each connection after its answer, though the answer says keep-alive.
        self.hang_up = False
        #: Answer with a chunked stream of this many lines, then wait for the client to go.
        self.stream_lines = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self.server.seen.append((self.client_address[1], self.path))
        if self.server.stream_lines:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for n in range(self.server.stream_lines):
                line = f'{{"n": {n}}}\n'.encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()
            self.rfile.read(1)  # until the client goes away
            self.close_connection = True
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.server.hang_up

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _connections(url: str) -> Connections:
    return Connections(url, tls=None, server_name=None, idle_limit=4, connect_timeout=2.0)


def _get(connections: Connections, path: str = "/x") -> bytes:
    return connections.send("GET", path, body=None, headers={}, read_timeout=5.0).read()


def test_a_connection_is_reused_and_the_server_s_path_prefixes_requests(server: _Server) -> None:
    connections = _connections(server.url + "/proxy/c-1/")
    assert _get(connections, "/a") == b'{"ok": true}'
    assert _get(connections, "/b") == b'{"ok": true}'
    (first, a), (second, b) = server.seen
    assert (a, b) == ("/proxy/c-1/a", "/proxy/c-1/b")
    assert first == second
    connections.close()


def test_a_connection_the_server_closed_while_idle_is_not_used(server: _Server) -> None:
    """The server hangs up after answering, as an API server does with idle keep-alive
    connections: the next request goes on a new connection, without an error."""
    server.hang_up = True
    connections = _connections(server.url)
    assert _get(connections) == b'{"ok": true}'
    assert _get(connections) == b'{"ok": true}'
    assert len({port for port, _ in server.seen}) == 2
    connections.close()


def test_no_server_is_a_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectError):
        _get(_connections(f"http://127.0.0.1:{port}"))


def test_an_answer_cut_short_is_a_send_error(server: _Server) -> None:
    """Chunks that stop before their end: the server may have acted, and the connection is not
    given back."""
    server.stream_lines = 2
    connections = _connections(server.url)
    answer = connections.send("GET", "/w", body=None, headers={}, read_timeout=0.5)
    with pytest.raises(SendError):
        answer.read()  # the stream never ends: the read times out
    server.stream_lines = 0
    assert _get(connections) == b'{"ok": true}'
    (cut, _), (after, _) = server.seen
    assert after != cut, "the connection of the answer cut short was used again"
    connections.close()


def test_a_stream_read_on_one_thread_is_stopped_from_another(server: _Server) -> None:
    server.stream_lines = 2
    connections = _connections(server.url)
    answer = connections.send("GET", "/w", body=None, headers={}, read_timeout=30.0)
    assert answer.readline() == b'{"n": 0}\n'
    assert answer.readline() == b'{"n": 1}\n'
    ended = threading.Event()
    outcome: list[object] = []

    def read_on() -> None:
        try:
            outcome.append(answer.readline())
        except OSError as err:
            outcome.append(err)
        ended.set()

    reader = threading.Thread(target=read_on, daemon=True)
    reader.start()
    assert not ended.wait(0.2)  # blocked: nothing more comes
    answer.stop()
    assert ended.wait(5), "the blocked read did not end"
    assert outcome[0] == b"" or isinstance(outcome[0], OSError)
    answer.close()
