"""Fetching the claims of a prepare call, before any lock is taken (as the Go helper does).

Every claim is fetched from its source before anything is prepared for it (one GET each from
the API server): nothing cluster-wide is listed or watched, so what a node costs the API server
does not grow with the cluster, and no allocation is acted on unconfirmed. The route is chosen
once, from the source: requests to a remote source are sent several at a time, local reads are
cheaper in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from dradriver.plugin.driver import CallError, ClaimRef
from dradriver.prepare.claims import ClaimSource, ClaimSourceError, ClaimUnusableError
from dradriver.prepare.resourceclaim import ClaimFormatError, ResourceClaim, decode_claim

#: Claims of one call are fetched with this many requests in flight.
FETCH_CONCURRENCY = 8

#: A claim as fetched, or the error that is that claim's result.
Fetched = ResourceClaim | str


class Route(Protocol):
    """How the fetches of one call are run."""

    def map(self, fetch: Callable[[ClaimRef], Fetched], refs: Sequence[ClaimRef]) -> Iterable[Fetched]: ...

    def close(self) -> None: ...


class InTurn:
    """One fetch after the other (local sources)."""

    def map(self, fetch: Callable[[ClaimRef], Fetched], refs: Sequence[ClaimRef]) -> Iterable[Fetched]:
        return [fetch(r) for r in refs]

    def close(self) -> None:
        """Nothing to stop."""


class InFlight:
    """Several requests in flight together (a remote source)."""

    def __init__(self, concurrency: int = FETCH_CONCURRENCY) -> None:
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fetch-claim")

    def map(self, fetch: Callable[[ClaimRef], Fetched], refs: Sequence[ClaimRef]) -> Iterable[Fetched]:
        if len(refs) < 2:
            return [fetch(r) for r in refs]
        return self._pool.map(fetch, refs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def route_for(source: ClaimSource) -> Route:
    """The route that suits the source: requests in flight together when each is a request."""
    return InFlight() if source.remote else InTurn()


class ClaimFetcher:
    """Fetches and decodes the claims of a call from `source`, along `route`."""

    def __init__(self, source: ClaimSource, route: Route) -> None:
        self.source = source
        self._route = route

    def fetch_all(self, refs: Sequence[ClaimRef]) -> list[Fetched]:
        """Fetch every claim; a claim we cannot see fails the whole call (the Go helper's rules),
        while a claim that cannot be used (no claim source, a malformed object, an unreadable
        claim file) is that claim's error."""
        return list(self._route.map(self._fetch, refs))

    def close(self) -> None:
        self._route.close()

    def _fetch(self, ref: ClaimRef) -> Fetched:
        try:
            raw = self.source.get(ref.namespace, ref.name)
        except ClaimUnusableError as err:
            return str(err)
        except ClaimSourceError as err:
            raise CallError(f"get resource claims: retrieve claim {ref}: {err}") from err
        try:
            claim = decode_claim(raw)
        except ClaimFormatError as err:
            return f"claim {ref}: {err}"
        if claim.status.allocation is None:
            raise CallError(f"get resource claims: claim {ref} not allocated")
        if claim.metadata.uid != ref.uid:
            raise CallError(f"get resource claims: claim {ref} got replaced")
        return claim
