"""The probe and metrics server under load it cannot serve: scrapes stuck in their handler never
delay a probe, requests past the queue's bound are answered 503 at once, and when every slot is
held a new connection takes an idle one's (real server, real TCP)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from dradriver.httpserver import HANDLER_THREADS, MAX_CONNECTIONS, MAX_QUEUED, HttpServer, Response
from tests.helpers import http_get, wait_for


@contextmanager
def stuck_scrapes() -> Iterator[tuple[HttpServer, threading.Event, list[int]]]:
    """A server whose /metrics waits for the event; `entered` counts scrapes in the handler."""
    release = threading.Event()
    entered: list[int] = []

    def handler(path: str) -> Response:
        if path == "/metrics":
            entered.append(1)
            release.wait(30)
        return Response(200, b"ok\n")

    server = HttpServer("127.0.0.1", 0, handler, probe_paths=["/readyz"])
    server.start()
    try:
        yield server, release, entered
    finally:
        release.set()
        server.stop()


def test_stuck_scrapes_delay_no_probe_and_one_past_the_bound_is_answered_503() -> None:
    with stuck_scrapes() as (server, release, entered), ThreadPoolExecutor(MAX_QUEUED) as pool:
        scrapes = [pool.submit(http_get, server.port, "/metrics") for _ in range(MAX_QUEUED)]
        wait_for(lambda: len(entered) == HANDLER_THREADS, 10, "the scrapes in their handler threads")
        assert http_get(server.port, "/readyz") == (200, "ok\n")
        # The server's count of scrapes waiting: only it knows when it has read every request.
        lane = server._lanes[False]
        wait_for(lambda: lane.queued == MAX_QUEUED, 10, "the scrapes queued")
        assert http_get(server.port, "/metrics") == (503, "busy\n")
        release.set()
        assert [s.result() for s in scrapes] == [(200, "ok\n")] * MAX_QUEUED


def closed(conn: socket.socket) -> bool:
    conn.settimeout(10)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_new_connection_takes_the_oldest_idle_ones_slot() -> None:
    with stuck_scrapes() as (server, _release, _entered):
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_CONNECTIONS)]
        try:
            assert http_get(server.port, "/readyz") == (200, "ok\n")
            assert closed(idle[0])  # the oldest gave up its slot
            idle[-1].setblocking(False)
            with pytest.raises(BlockingIOError):  # the newest is still open, waiting for its request
                idle[-1].recv(1)
        finally:
            for conn in idle:
                conn.close()
