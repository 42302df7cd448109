"""The route a call's claims are fetched along: several requests in flight for a remote source,
one read after the other, on the caller's thread, for a local one."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.fetch import ClaimFetcher, InFlight, InTurn, route_for
from tests.helpers import allocated_claim, uid


class Source:
    """Claims by name; each get waits at `barrier` (if any) and notes the thread it ran on."""

    authoritative = False

    def __init__(self, *, remote: bool, barrier: threading.Barrier | None = None) -> None:
        self.remote = remote
        self.barrier = barrier
        self.threads: list[int] = []

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.threads.append(threading.get_ident())
        if self.barrier is not None:
            self.barrier.wait()  # passes only once every fetch of the call is in flight
        n = int(name.removeprefix("claim-"))
        return allocated_claim(name, uid(n), [{"request": "gpu", "device": f"gpu-{n}"}])


REFS = [ClaimRef("default", f"claim-{n}", uid(n)) for n in range(3)]


def test_a_remote_sources_claims_are_fetched_together() -> None:
    source = Source(remote=True, barrier=threading.Barrier(len(REFS), timeout=30))
    route = route_for(source)
    assert isinstance(route, InFlight)
    fetcher = ClaimFetcher(source, route)
    try:
        claims = fetcher.fetch_all(REFS)
    finally:
        fetcher.close()
    assert [c.metadata.uid for c in claims if not isinstance(c, str)] == [r.uid for r in REFS]
    assert threading.get_ident() not in source.threads


def test_a_local_sources_claims_are_read_in_turn_on_the_callers_thread() -> None:
    source = Source(remote=False)
    route = route_for(source)
    assert isinstance(route, InTurn)
    claims = ClaimFetcher(source, route).fetch_all(REFS)
    assert [c.metadata.uid for c in claims if not isinstance(c, str)] == [r.uid for r in REFS]
    assert source.threads == [threading.get_ident()] * len(REFS)
