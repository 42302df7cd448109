"""ClaimWatch: this node's allocated ResourceClaims from one list + watch of all claims.

Runs against the loopback fake API server always, and a real one when the environment names one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.kube import KubeClient, NotFoundError, load_client
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.claims import ClaimWatch
from tests.helpers import allocated_claim, uid, wait_for
from tests.publish.apiservers import (
    CLAIMS,
    TEST_DRIVER,
    Backend,
    create_allocated_claim,
    update_claim_status,
)
from tests.publish.kubefake import FakeApiServer


class Claims:
    """Claims a test creates in the default namespace, with names of their own, removed afterwards."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.prefix = f"watch-{uuid.uuid4().hex[:8]}"
        self.names: list[str] = []

    def create(self, name: str, *, pool: str, driver: str = TEST_DRIVER, device: str = "gpu-0") -> ClaimRef:
        claim = allocated_claim(
            f"{self.prefix}-{name}", uid(0), [{"request": "gpu", "device": device}], pool=pool, driver=driver
        )
        del claim["metadata"]["uid"]  # type: ignore[attr-defined]
        created = create_allocated_claim(self.backend, claim)
        self.names.append(created["metadata"]["name"])
        return ClaimRef("default", created["metadata"]["name"], created["metadata"]["uid"])

    def get(self, ref: ClaimRef) -> dict[str, Any]:
        found: dict[str, Any] = self.backend.direct.request("GET", f"{CLAIMS}/{ref.name}")
        return found

    def delete(self, ref: ClaimRef) -> None:
        self.backend.direct.request("DELETE", f"{CLAIMS}/{ref.name}")

    def cleanup(self) -> None:
        for name in self.names:
            with contextlib.suppress(NotFoundError):
                self.backend.direct.request("DELETE", f"{CLAIMS}/{name}")


@pytest.fixture
def claims(backend: Backend) -> Iterator[Claims]:
    made = Claims(backend)
    yield made
    made.cleanup()


@contextlib.contextmanager
def watching(client: KubeClient, pool: str, **options: Any) -> Iterator[ClaimWatch]:
    watch = ClaimWatch(client, driver_name=TEST_DRIVER, pool_name=pool, **options)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


def test_the_watch_holds_exactly_this_nodes_allocated_claims(backend: Backend, claims: Claims) -> None:
    node = backend.make_node(create=False)
    listed = claims.create("listed", pool=node)
    with watching(backend.client(), node) as watch:
        wait_for(lambda: watch.get(listed) is not None, 15, "the claim that was there before")
        elsewhere = claims.create("elsewhere", pool="another-node")
        other_driver = claims.create("other-driver", pool=node, driver="gpu.other.example.com")
        watched = claims.create("watched", pool=node, device="gpu-1")
        wait_for(lambda: watch.get(watched) is not None, 15, "the claim created while watching")
        # Events arrive in order: the two claims created before `watched` were seen and dropped.
        assert watch.get(elsewhere) is None
        assert watch.get(other_driver) is None
        assert len(watch) == 2
        copy = watch.get(watched)
        assert copy is not None
        assert copy["status"]["allocation"] == claims.get(watched)["status"]["allocation"]
        assert watch.get(ClaimRef("default", watched.name, uid(77))) is None  # another UID

        deallocated = claims.get(watched)
        deallocated["status"] = {}
        update_claim_status(backend, deallocated)
        wait_for(lambda: watch.get(watched) is None, 15, "the deallocated claim to be dropped")
        claims.delete(listed)
        wait_for(lambda: watch.get(listed) is None, 15, "the deleted claim to be dropped")
        assert len(watch) == 0


def test_nothing_is_handed_out_while_the_watch_is_down(backend: Backend, claims: Claims) -> None:
    node = backend.make_node(create=False)
    ref = claims.create("outage", pool=node)
    client, proxy = backend.proxied_client()
    with watching(client, node) as watch:
        wait_for(lambda: watch.get(ref) is not None, 15, "the claim")
        proxy.cut()
        wait_for(lambda: watch.get(ref) is None, 15, "the copy to be withheld during the outage")
        proxy.restore()
        wait_for(lambda: watch.get(ref) is not None, 30, "the watch to be back")


def test_a_claim_allocated_here_warms_the_connection_for_its_fetch(
    fake_api: FakeApiServer, tmp_path: Path
) -> None:
    client = load_client(str(tmp_path / "kubeconfig"))
    assert client is not None
    with watching(client, "node-1", warm_after=0) as watch:
        wait_for(lambda: any(r.watch for r in fake_api.requests), 10, "the watch")
        seen = len(fake_api.requests)
        claim = allocated_claim("warm", uid(5), [{"request": "gpu", "device": "gpu-0"}], driver=TEST_DRIVER)
        ref = ClaimRef(
            "default", "warm", fake_api.create("resourceclaims", "default", claim)["metadata"]["uid"]
        )
        wait_for(lambda: watch.get(ref) is not None, 10, "the claim")
        wait_for(
            lambda: ("GET", "/version") in [(r.method, r.path) for r in fake_api.requests_since(seen)],
            10,
            "a request ahead of the kubelet's call",
        )
