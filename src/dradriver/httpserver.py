"""A small GET-only HTTP/1.1 server with bounded threads, connections and time per request.

The stdlib's ThreadingHTTPServer starts a thread per connection and waits for a request
without a timeout, so 200 half-open connections to the metrics port meant 200 threads and a
process that never let go of them. Here one event-loop thread holds every connection: each
must send its request head (at most MAX_REQUEST_BYTES) within REQUEST_TIMEOUT_SECONDS and read
the answer within the same time, at most MAX_CONNECTIONS are open (more are closed at once),
and handlers run on a pool of HANDLER_THREADS. Every answer closes its connection.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dradriver import logs

REQUEST_TIMEOUT_SECONDS = 5.0
MAX_REQUEST_BYTES = 8 * 1024
MAX_CONNECTIONS = 256
HANDLER_THREADS = 2

log = logs.get_logger(component="http")

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


#: Answers a request for a path (query string removed); runs on the handler pool.
Handler = Callable[[str], Response]


def _listener(host: str, port: int) -> socket.socket:
    """Bound and listening now, so that a taken port or a foreign address fails in the caller."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


class HttpServer:
    def __init__(self, host: str, port: int, handler: Handler) -> None:
        self._socket = _listener(host, port)
        self._handler = handler
        self._pool = ThreadPoolExecutor(max_workers=HANDLER_THREADS, thread_name_prefix="http")
        self._loop = asyncio.new_event_loop()
        self._open = 0
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(REQUEST_TIMEOUT_SECONDS)
        self._socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, sock=self._socket, limit=MAX_REQUEST_BYTES)
        )
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self._open += 1
        try:
            await asyncio.wait_for(self._answer(reader, writer), REQUEST_TIMEOUT_SECONDS)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.transport.abort()  # a slow, silent or oversized client
        except Exception:
            log.exception("HTTP request failed")
            writer.transport.abort()
        finally:
            self._open -= 1

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            response = Response(400, b"bad request\n")
        elif parts[0] not in ("GET", "HEAD"):
            response = Response(405, b"only GET\n")
        else:
            path = parts[1].split("?", 1)[0]
            response = await asyncio.get_running_loop().run_in_executor(self._pool, self._handler, path)
        status = f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
        headers = (
            f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write((status + headers).encode("latin-1"))
        if parts[:1] != ["HEAD"]:
            writer.write(response.body)
        await writer.drain()
        writer.close()
        await writer.wait_closed()
