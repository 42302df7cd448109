"""API servers to publish to: the loopback fake, or the real cluster of the e2e harness.

The real API server is the `real_cluster` fixture's (tests/e2e/realcluster.py: started from
DRADRIVER_E2E_BIN or named by DRADRIVER_E2E_KUBECONFIG), and `gates_off_kubeconfig` one with
the slice-stripping DRA gates off. Each test gets Nodes of its own, and their slices and the
Nodes are removed afterwards.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from dradriver.kube import ConflictError, KubeClient, NotFoundError, load_client
from dradriver.publish import delete_node_slices
from tests.publish.kubefake import FakeApiServer
from tests.publish.tcpproxy import TcpProxy

TEST_DRIVER = "gpu.test.dradriver.dev"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
GATES_OFF = frozenset({"DRADeviceTaints", "DRAPartitionableDevices"})


@dataclass
class Backend:
    """An API server, a client to poke it directly, and what to clean up."""

    kind: str  # "fake" or "cluster"
    kubeconfig: Path
    tmp: Path
    fake: FakeApiServer | None = None
    nodes: list[str] = field(default_factory=list)
    #: Pods of the default namespace a test made.
    pods: list[str] = field(default_factory=list)
    proxies: list[TcpProxy] = field(default_factory=list)
    clients: list[KubeClient] = field(default_factory=list)

    def client(self, kubeconfig: Path | None = None) -> KubeClient:
        client = load_client(str(kubeconfig or self.kubeconfig))
        assert client is not None
        self.clients.append(client)
        return client

    @property
    def direct(self) -> KubeClient:
        if not self.clients:
            self.client()
        return self.clients[0]

    def proxied_client(self) -> tuple[KubeClient, TcpProxy]:
        """A client whose connections go through a TcpProxy the test can cut."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
        server = urlsplit(cluster["server"])
        proxy = TcpProxy(server.hostname or "127.0.0.1", server.port or 443)
        self.proxies.append(proxy)
        cluster["server"] = f"{server.scheme}://127.0.0.1:{proxy.port}"
        if server.scheme == "https" and server.hostname and not cluster.get("tls-server-name"):
            cluster["tls-server-name"] = server.hostname
        path = self.tmp / f"kubeconfig-proxy-{proxy.port}"
        path.write_text(yaml.safe_dump(config))
        return self.client(path), proxy

    def make_node(self, create: bool = True) -> str:
        name = f"dradriver-test-{uuid.uuid4().hex[:10]}"
        self.nodes.append(name)
        if create:
            self.direct.request(
                "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
            )
        return name

    def slices(self, node: str) -> list[dict[str, Any]]:
        selector = f"spec.driver={TEST_DRIVER},spec.nodeName={node}"
        items: list[dict[str, Any]] = self.direct.list_resource_slices(selector)["items"]
        return sorted(items, key=lambda s: str(s["metadata"]["name"]))

    def cleanup(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        for pod in self.pods:
            with contextlib.suppress(NotFoundError):
                self.direct.request(
                    "DELETE", f"/api/v1/namespaces/default/pods/{pod}", query=[("gracePeriodSeconds", "0")]
                )
        for node in self.nodes:
            delete_node_slices(self.direct, driver_name=TEST_DRIVER, node_name=node)
            with contextlib.suppress(NotFoundError):
                self.direct.request("DELETE", f"/api/v1/nodes/{node}")
        for client in self.clients:
            client.close()
        if self.fake is not None:
            self.fake.stop()


def create_allocated_claim(backend: Backend, claim: dict[str, Any]) -> dict[str, Any]:
    """Create the claim, then write its allocation through the status subresource (the scheduler's way)."""
    status = claim.pop("status")
    created: dict[str, Any] = backend.direct.request("POST", CLAIMS, body=claim)
    created["status"] = status
    return update_claim_status(backend, created)


def update_claim_status(backend: Backend, claim: dict[str, Any]) -> dict[str, Any]:
    """Set the claim's status to `claim`'s. A real cluster's resourceclaim controller may change
    the claim meanwhile (it drops reservations for pods that do not exist): on a conflict the
    status is put again on the latest version."""
    name = claim["metadata"]["name"]
    suffix = "/status" if backend.kind == "cluster" else ""
    body = claim
    for _ in range(5):
        try:
            updated: dict[str, Any] = backend.direct.request("PUT", f"{CLAIMS}/{name}{suffix}", body=body)
            return updated
        except ConflictError:
            body = backend.direct.request("GET", f"{CLAIMS}/{name}") | {"status": claim["status"]}
    raise AssertionError(f"the status of claim {name} kept conflicting")


def fake_backend(tmp_path: Path, gates_off: bool = False) -> Backend:
    fake = FakeApiServer(gates_off=GATES_OFF if gates_off else frozenset()).start()
    return Backend("fake", fake.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path, fake=fake)


def make_backend(request: pytest.FixtureRequest, tmp_path: Path, gates_off: bool = False) -> Backend:
    """The fake API server for param "fake", else the real cluster's (or its gates-off twin)."""
    if request.param == "fake":
        return fake_backend(tmp_path, gates_off)
    if gates_off:
        kubeconfig: Path = request.getfixturevalue("gates_off_kubeconfig")
    else:
        kubeconfig = request.getfixturevalue("real_cluster").kubeconfig
    return Backend("cluster", kubeconfig, tmp_path)
