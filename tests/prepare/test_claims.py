"""Claim sources: the reservations tap, which remembers the pods each fetched claim is reserved for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dradriver.prepare.claims import FORGET_AFTER, ReservationsTap


class _Claims:
    """A claim source of fixed claims (the tap reads what it returns, nothing else)."""

    authoritative = True
    remote = True

    def __init__(self, *claims: Mapping[str, Any]) -> None:
        self._claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self._claims[(namespace, name)]


def _claim(name: str, uid: str, *pods: tuple[str, str]) -> dict[str, Any]:
    reserved = [{"resource": "pods", "name": n, "uid": u} for n, u in pods]
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid}, "status": {"reservedFor": reserved}}


def test_a_claim_fetched_for_a_prepare_under_way_keeps_its_pods_through_a_sweep() -> None:
    """The telemetry sweeps after each reading with the prepared claims as `keep`: a claim fetched
    by a prepare that has not finished is not among them yet, and must not lose its pods (it did:
    its series carried no pods until the next fetch, up to a minute later)."""
    now = [100.0]
    tap = ReservationsTap(_Claims(_claim("a", "uid-a", ("pod-1", "p1"))), clock=lambda: now[0])
    tap.get("ns", "a")
    tap.forget(keep=set())
    assert tap.pods("uid-a") == (("ns", "pod-1", "p1"),)
    now[0] += FORGET_AFTER + 1
    tap.forget(keep={"uid-a"})
    assert tap.pods("uid-a") == (("ns", "pod-1", "p1"),), "a prepared claim keeps its pods"
    tap.forget(keep=set())
    assert tap.pods("uid-a") == (), "once unprepared and long unfetched, it is forgotten"
