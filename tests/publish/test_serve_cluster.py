"""`dradriver serve` with an API server: publishes its slices, fetches claims, reports readiness.

Runs against the loopback fake API server always, and a real one when the environment names it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import grpc
import pytest

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import ServeProcess, allocated_claim, free_port, http_get, short_tmpdir, uid, wait_for
from tests.publish.apiservers import CLAIMS, TEST_DRIVER, Backend, create_allocated_claim


def serve_on(backend: Backend, root: Path, node: str, *extra: str) -> ServeProcess:
    """`serve` for `node` on the backend's API server, claims fetched from it, started."""
    return ServeProcess(
        root,
        ["--kubeconfig", str(backend.kubeconfig), "--node-name", node, *extra],
        {"DRADRIVER_DRIVER_NAME": TEST_DRIVER},
        TEST_DRIVER,
        claims_from_files=False,
    ).start()


def test_serve_publishes_and_prepares_claims_from_the_api_server(backend: Backend) -> None:
    node = backend.make_node()
    port = free_port()
    with short_tmpdir() as root:
        serve = serve_on(backend, root, node, "--metrics-address", f"127.0.0.1:{port}")
        try:
            wait_for(lambda: len(backend.slices(node)) == 1, 15, f"our slice (log: {serve.log()})")
            (published,) = backend.slices(node)
            assert published["spec"]["nodeName"] == node
            assert published["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
            assert [d["name"] for d in published["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
            (owner,) = published["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["controller"]) == ("Node", node, True)

            assert http_get(port, "/readyz") == (503, "not registered with the kubelet yet\n")
            kubeletclient.register(serve.registration_socket)
            wait_for(lambda: http_get(port, "/readyz")[0] == 200, 10, "readiness")

            claim = allocated_claim(
                "from-api", uid(1), [{"request": "gpu", "device": "gpu-1"}], pool=node, driver=TEST_DRIVER
            )
            del claim["metadata"]["uid"]  # type: ignore[attr-defined]
            created = create_allocated_claim(backend, claim)
            ref = ClaimRef("default", "from-api", created["metadata"]["uid"])
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                (device,) = client.prepare([ref]).claims[ref.uid].devices
                assert device.device_name == "gpu-1"
                spec = json.loads((serve.cdi_dir / f"k8s.{TEST_DRIVER}-claim_{ref.uid}.json").read_text())
                assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia1"
                stale = ClaimRef("default", "from-api", uid(99))
                with pytest.raises(grpc.RpcError) as caught:
                    client.prepare([stale])
                assert caught.value.details() == "get resource claims: claim default/from-api got replaced"
                with pytest.raises(grpc.RpcError) as caught:
                    client.prepare([ClaimRef("default", "missing", uid(98))])
                assert "get resource claims: retrieve claim default/missing" in str(caught.value.details())
                assert client.unprepare([ref]).claims[ref.uid].error == ""

            # Someone (the kubelet at its restart) deletes our slices: they come back.
            name = published["metadata"]["name"]
            backend.direct.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}")
            wait_for(
                lambda: [s["metadata"]["name"] for s in backend.slices(node)] not in ([], [name]),
                10,
                "republish",
            )
            assert serve.stop(signal.SIGTERM) == 0
            assert len(backend.slices(node)) == 1  # left in place on purpose (docs/design.md)
        finally:
            serve.kill()


def test_serve_unprepares_claims_deleted_from_the_api_server(backend: Backend) -> None:
    node = backend.make_node()
    with short_tmpdir() as root:
        serve = serve_on(backend, root, node, "--stale-claim-grace", "1")
        try:
            claim = allocated_claim(
                "short-lived", uid(2), [{"request": "gpu", "device": "gpu-4"}], pool=node, driver=TEST_DRIVER
            )
            del claim["metadata"]["uid"]  # type: ignore[attr-defined]
            created = create_allocated_claim(backend, claim)
            ref = ClaimRef("default", "short-lived", created["metadata"]["uid"])
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                assert client.prepare([ref]).claims[ref.uid].error == ""
            spec = serve.cdi_dir / f"k8s.{TEST_DRIVER}-claim_{ref.uid}.json"
            assert spec.exists()
            # Deleted while the kubelet never calls unprepare (say, a force-deleted pod).
            backend.direct.request("DELETE", f"{CLAIMS}/short-lived")
            wait_for(lambda: not spec.exists(), 15, f"the stale claim to be unprepared (log: {serve.log()})")
            assert "ResourceClaim is gone from the API server: unpreparing it" in serve.log()
        finally:
            serve.kill()


def test_serve_keeps_running_while_the_api_server_is_unreachable(tmp_path: Path) -> None:
    from tests.publish.kubefake import FakeApiServer

    fake = FakeApiServer().start()
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    fake.stop()  # the kubeconfig now points at a port nobody listens on
    port = free_port()
    with short_tmpdir() as root:
        serve = ServeProcess(
            root,
            ["--kubeconfig", str(kubeconfig), "--metrics-address", f"127.0.0.1:{port}"],
            claims_from_files=False,
        ).start()
        try:
            kubeletclient.register(serve.registration_socket)
            wait_for(lambda: "cannot be reached yet" in serve.log(), 60, f"the warning (log: {serve.log()})")
            assert serve.proc is not None
            assert serve.proc.poll() is None  # still serving: no crash loop over a transient outage
            wait_for(
                lambda: http_get(port, "/readyz")[1].startswith("ResourceSlices not published yet"),
                30,
                "readiness reason",
            )
            assert http_get(port, "/readyz")[0] == 503
            with kubeletclient.DRAClient(serve.dra_socket) as client, pytest.raises(grpc.RpcError) as caught:
                client.prepare([ClaimRef("default", "c", uid(5))])
            assert "get resource claims: retrieve claim default/c" in str(caught.value.details())
        finally:
            serve.kill()


def _claim_watches(backend: Backend) -> int:
    """ResourceClaim watches the real API server holds open now (apiserver_longrunning_requests)."""
    response = backend.direct._send("GET", "/metrics", None, None, 10.0)
    text = response.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("apiserver_longrunning_requests{")
        and 'resource="resourceclaims"' in line
        and 'verb="WATCH"' in line
    )


def test_serve_reads_nothing_of_other_nodes(backend: Backend) -> None:
    """What one node costs the API server must not grow with the cluster: serve lists and
    watches only its own node's slices and reads each claim by name when asked to prepare it."""
    node = backend.make_node()
    seen = len(backend.fake.requests) if backend.fake is not None else 0
    watches_before = _claim_watches(backend) if backend.fake is None else 0
    with short_tmpdir() as root:
        serve = serve_on(backend, root, node)
        try:
            wait_for(lambda: len(backend.slices(node)) == 1, 15, f"our slice (log: {serve.log()})")
            claim = allocated_claim(
                "own-node", uid(3), [{"request": "gpu", "device": "gpu-2"}], pool=node, driver=TEST_DRIVER
            )
            del claim["metadata"]["uid"]  # type: ignore[attr-defined]
            ref = ClaimRef("default", "own-node", create_allocated_claim(backend, claim)["metadata"]["uid"])
            created = len(backend.fake.requests) if backend.fake is not None else 0
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                assert client.prepare([ref]).claims[ref.uid].error == ""
                assert client.unprepare([ref]).claims[ref.uid].error == ""
            if backend.fake is None:
                # The real API server: the scheduler and the controllers hold their own claim
                # watches (one may be between two of them now); serve adds none.
                assert _claim_watches(backend) <= watches_before
            else:
                made = backend.fake.requests_since(seen)
                claims = [r for r in backend.fake.requests_since(created) if "/resourceclaims" in r.path]
                assert claims, "prepare read no claim"
                assert {(r.method, r.path, r.watch) for r in claims} == {("GET", f"{CLAIMS}/own-node", False)}
                lists = [r for r in made if r.collection]
                assert lists, "serve listed nothing (its slices)"
                for request in lists:
                    assert f"spec.nodeName={node}" in request.query.get("fieldSelector", ""), request
            assert serve.stop(signal.SIGTERM) == 0
        finally:
            serve.kill()
