"""Claims deleted behind the kubelet's back are unprepared after the grace period, and only then."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.claims import ClaimNotFoundError, ClaimSourceError
from dradriver.prepare.stale import StaleClaimCollector
from tests.helpers import uid
from tests.prepare.node import Node
from tests.prepare.test_gpu_driver import one_gpu


class ApiLike:
    """An authoritative claim source whose answers the test controls."""

    authoritative = True
    remote = True

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.unreachable = False

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        if self.unreachable:
            raise ClaimSourceError("connection refused")
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFoundError(f"{namespace}/{name} not found") from None


def test_gone_claims_are_unprepared_after_the_grace_period(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    api = ApiLike()
    driver = node.driver(claims=api)
    kept, deleted, replaced = one_gpu(1, "gpu-0"), one_gpu(2, "gpu-1"), one_gpu(3, "gpu-2")
    for claim in (kept, deleted, replaced):
        meta: Any = claim["metadata"]
        api.claims[(meta["namespace"], meta["name"])] = claim
    refs = [ClaimRef("default", f"claim-{i}", uid(i)) for i in (1, 2, 3)]
    assert all(r.error == "" for r in driver.prepare(refs).values())

    now = [1000.0]
    collector = StaleClaimCollector(driver, api, grace=300, clock=lambda: now[0])
    del api.claims[("default", "claim-2")]
    api.claims[("default", "claim-3")] = one_gpu(33, "gpu-2") | {
        "metadata": {"namespace": "default", "name": "claim-3", "uid": uid(33)}
    }
    assert collector.check_once() == []  # gone, but not for long enough
    now[0] += 200
    api.unreachable = True
    assert collector.check_once() == []  # the API server is down: never a reason to unprepare
    api.unreachable = False
    now[0] += 100
    assert sorted(collector.check_once()) == [uid(2), uid(3)]
    assert sorted(r.uid for r in driver.records()) == [uid(1)]
    assert node.cdi.claim_uids() == [uid(1)]


def test_a_claim_that_comes_back_restarts_the_clock(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    api = ApiLike()
    driver = node.driver(claims=api)
    claim = one_gpu(4, "gpu-3")
    api.claims[("default", "claim-4")] = claim
    driver.prepare([ClaimRef("default", "claim-4", uid(4))])
    now = [0.0]
    collector = StaleClaimCollector(driver, api, grace=60, clock=lambda: now[0])
    del api.claims[("default", "claim-4")]
    collector.check_once()
    now[0] = 50
    api.claims[("default", "claim-4")] = claim  # it was a blip (e.g. a list/watch lag)
    collector.check_once()
    del api.claims[("default", "claim-4")]
    now[0] = 100
    assert collector.check_once() == []
    now[0] = 160
    assert collector.check_once() == [uid(4)]
