"""A small GET-only HTTP/1.1 server with bounded threads, connections and time per request.

The stdlib's ThreadingHTTPServer starts a thread per connection and waits for a request
without a timeout, so 200 half-open connections to the metrics port meant 200 threads and a
process that never let go of them. Here one event-loop thread holds every connection: each
must send its request head (at most MAX_REQUEST_BYTES) within REQUEST_TIMEOUT_SECONDS and read
the answer within the same time. Every answer closes its connection.

At most MAX_CONNECTIONS are open. Servers that refuse connections past such a limit (uvicorn's
limit_concurrency, a listen backlog) let anyone who holds the slots open fail the kubelet's
readiness probe, so a new connection is never refused for idle ones: it takes the slot of the
oldest connection that is still sending its request head (or, failing that, still reading its
answer). A client that sends its request at once, as probes and Prometheus do, is answered
however many idle connections are held open. Only connections whose answer is being computed
are kept, and at most MAX_QUEUED of them per lane: probe paths have a thread of their own, so
queued scrapes never delay a probe, and a request past the bound is answered 503 at once.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from dradriver import logs

REQUEST_TIMEOUT_SECONDS = 5.0
MAX_REQUEST_BYTES = 8 * 1024
MAX_CONNECTIONS = 256
#: Requests waiting for or in a lane's threads; more are answered 503 at once.
MAX_QUEUED = 16
HANDLER_THREADS = 2
#: Connections waiting to be accepted; the loop accepts them as fast as they come.
LISTEN_BACKLOG = 1024

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


#: Answers a request for a path (query string removed); runs on a handler thread.
Handler = Callable[[str], Response]

_BUSY = Response(503, b"busy\n")


class _Stage(Enum):
    """Where a connection is; the first two may give up their slot to a new connection."""

    HEAD = 0  # its request head is not in yet
    WRITE = 1  # its answer is being sent
    ANSWER = 2  # its answer is being computed


class _Lane:
    """Threads for some paths, with a bound on the requests waiting for them."""

    def __init__(self, threads: int, name: str) -> None:
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self.queued = 0


def _listener(host: str, port: int) -> socket.socket:
    """Bound and listening now, so that a taken port or a foreign address fails in the caller."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)


class HttpServer:
    """`handler` answers every path; those in `probe_paths` on a thread of their own."""

    def __init__(self, host: str, port: int, handler: Handler, *, probe_paths: Collection[str] = ()) -> None:
        self._socket = _listener(host, port)
        self._handler = handler
        self._probe_paths = frozenset(probe_paths)
        self._lanes = {False: _Lane(HANDLER_THREADS, "http"), True: _Lane(1, "http-probe")}
        self._loop = asyncio.new_event_loop()
        #: Every open connection, oldest first (dicts keep insertion order).
        self._open: dict[asyncio.WriteTransport, _Stage] = {}
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
        for lane in self._lanes.values():
            lane.pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(
                self._connection, sock=self._socket, limit=MAX_REQUEST_BYTES, backlog=LISTEN_BACKLOG
            )
        )
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.run_until_complete(self._close_connections())
            self._loop.close()

    async def _close_connections(self) -> None:
        """Cut every connection and let its task end (cancelled ones log an error on 3.11);
        the few whose answer is still being computed are cancelled after a moment."""
        for transport in self._open:
            transport.abort()
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=1.0)
            for task in pending:
                task.cancel()

    def _make_room(self) -> bool:
        """Close the oldest connection still sending its head, else the oldest still reading its
        answer; False when every slot is computing an answer."""
        for stage in (_Stage.HEAD, _Stage.WRITE):
            oldest = next((t for t, s in self._open.items() if s is stage), None)
            if oldest is not None:
                del self._open[oldest]
                oldest.abort()
                return True
        return False

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        if len(self._open) >= MAX_CONNECTIONS and not self._make_room():
            transport.abort()
            return
        self._open[transport] = _Stage.HEAD
        try:
            await asyncio.wait_for(self._answer(reader, writer), REQUEST_TIMEOUT_SECONDS)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            transport.abort()  # a slow, silent or oversized client, or one that gave up its slot
        except Exception:
            log.exception("HTTP request failed")
            transport.abort()
        finally:
            self._open.pop(transport, None)

    def _stage(self, transport: asyncio.WriteTransport, stage: _Stage) -> None:
        if transport not in self._open:  # its slot was given away meanwhile
            raise ConnectionAbortedError
        self._open[transport] = stage

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self._stage(writer.transport, _Stage.ANSWER)
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            response = Response(400, b"bad request\n")
        elif parts[0] not in ("GET", "HEAD"):
            response = Response(405, b"only GET\n")
        else:
            response = await self._handle(parts[1].split("?", 1)[0])
        self._stage(writer.transport, _Stage.WRITE)
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

    async def _handle(self, path: str) -> Response:
        lane = self._lanes[path in self._probe_paths]
        if lane.queued >= MAX_QUEUED:
            return _BUSY
        lane.queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(lane.pool, self._handler, path)
        finally:
            lane.queued -= 1
