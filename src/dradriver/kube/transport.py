"""Connections to the one API server a client talks to: the standard library's `http.client`,
kept alive and reused.

Why not urllib3: a prepare's work is a claim's GET, and on a node's few cores its CPU time is
what the call waits for. Through urllib3's pool (its URL parsing, header dictionaries, response
wrapper and pool queue) 64 GETs took 28 ms of CPU one after the other and 34 ms with eight in
flight; over `http.client` 16 and 24 ms (bench/RESULTS.md, issue 36, fourth pass).

What urllib3's pool did for us is here: idle connections reused (LIFO) up to a bound, one the
server closed noticed before it is used, TLS with a separate server name, a connect timeout apart
from the read timeout, and a streamed answer that another thread can stop.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
from urllib.parse import urlsplit

#: What a request can fail with once a connection is up: the socket's errors and HTTP's.
SEND_ERRORS = (OSError, http.client.HTTPException)
#: Methods whose request may be sent twice (HTTP's idempotent ones; the API server's PUT and
#: DELETE carry a resourceVersion or preconditions where twice would matter).
REPLAYABLE = frozenset({"GET", "HEAD", "PUT", "DELETE"})


class ConnectError(Exception):
    """No connection could be made (refused, unknown host, timed out): the request was not sent."""


class SendError(Exception):
    """A request, or the reading of its answer, failed on an established connection: the server
    may have acted on it."""


class _TLSConnection(http.client.HTTPSConnection):
    """An HTTPS connection whose certificate is checked against `server_name` (kubeconfig's
    tls-server-name) rather than the host it connects to."""

    def __init__(self, host: str, port: int, *, timeout: float, context: ssl.SSLContext, server_name: str):
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls = context
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


class Answer:
    """A response, read on its connection. `read()` reads it whole and gives the connection back
    for reuse; a stream is read with `readline()`, stopped with `stop()` from any thread, and
    closed with `close()` by the thread that reads it."""

    def __init__(
        self,
        pool: Connections,
        conn: http.client.HTTPConnection,
        sock: socket.socket,
        response: http.client.HTTPResponse,
    ) -> None:
        self._pool = pool
        self._conn = conn
        # Its own reference: the connection lets go of a socket the server will close.
        self._sock = sock
        self._response = response
        self.status = response.status

    def header(self, name: str) -> str | None:
        return self._response.getheader(name)

    def read(self) -> bytes:
        """The whole body (SendError if it cannot be read)."""
        try:
            data = self._response.read()
        except SEND_ERRORS as err:
            self.close()
            raise SendError(str(err) or type(err).__name__) from err
        self._pool.give_back(self._conn)
        return data

    def readline(self) -> bytes:
        """The next line of a streamed body; b"" at its end. Raises OSError or HTTPException."""
        return self._response.readline()

    def stop(self) -> None:
        """Make a `readline()` blocked on another thread return or raise."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the response and its connection (not reused)."""
        self._response.close()
        self._conn.close()


class Connections:
    """Connections to `server` (scheme, host, port and path: a proxy's path prefixes every
    request), at most `idle_limit` kept idle for reuse.

    Lock rule: `_lock` guards `_idle` and `_closed`; a connection is used by one thread at a time,
    from taking it out of `_idle` to giving it back.
    """

    def __init__(
        self,
        server: str,
        *,
        tls: ssl.SSLContext | None,
        server_name: str | None,
        idle_limit: int,
        connect_timeout: float,
    ) -> None:
        url = urlsplit(server)
        https = url.scheme == "https"
        self._host = url.hostname or ""
        self._port = url.port or (443 if https else 80)
        self._base = url.path.rstrip("/")
        self._tls = (tls or ssl.create_default_context()) if https else None
        self._server_name = server_name or self._host
        self._idle_limit = idle_limit
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False

    def send(
        self, method: str, path: str, *, body: bytes | None, headers: dict[str, str], read_timeout: float
    ) -> Answer:
        """Send one request and return its answer, its headers read, its body not yet. A
        replayable request that finds its reused connection hung up on (the server ended it while
        idle, as we took it) is sent again once, on a new connection."""
        conn, reused = self._take()
        for last in (not reused or method not in REPLAYABLE, True):
            sock = conn.sock
            assert sock is not None
            try:
                sock.settimeout(read_timeout)
                conn.request(method, self._base + path, body=body, headers=headers)
                return Answer(self, conn, sock, conn.getresponse())
            except SEND_ERRORS as err:
                conn.close()
                if last or not isinstance(err, ConnectionError):
                    raise SendError(str(err) or type(err).__name__) from err
            conn = self._connect()
        raise AssertionError("unreachable")  # the second pass returns or raises

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        """A connection whose answer was read whole: kept for the next request, unless the server
        ends it or enough are idle."""
        with self._lock:
            if conn.sock is not None and not self._closed and len(self._idle) < self._idle_limit:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections; those in use are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection still up (and True), else a new one (and False)."""
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn = self._idle.pop()
            if not _dropped(conn):
                return conn, True
            conn.close()
        return self._connect(), False

    def _connect(self) -> http.client.HTTPConnection:
        conn = self._new()
        try:
            conn.connect()
        except OSError as err:  # refused, unknown host, timed out, TLS refused
            conn.close()
            raise ConnectError(str(err) or type(err).__name__) from err
        return conn

    def _new(self) -> http.client.HTTPConnection:
        if self._tls is not None:
            return _TLSConnection(
                self._host,
                self._port,
                timeout=self._connect_timeout,
                context=self._tls,
                server_name=self._server_name,
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was ended by the server: an idle connection has nothing to read
    unless it was closed (or the server broke the protocol). poll, not select: any fd number."""
    if conn.sock is None:
        return True
    poller = select.poll()
    try:
        poller.register(conn.sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
