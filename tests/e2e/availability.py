"""Watching a node through a rollout: its pool as the scheduler reads it, and whether any
instance of the plugin answers NodePrepareResources (the way the kubelet calls it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc

from dradriver import kubeletclient
from dradriver.kube import KubeClient
from dradriver.kubeletapi.pluginregistration import api_pb2 as reg_pb
from dradriver.kubeletapi.pluginregistration import api_pb2_grpc as reg_grpc
from tests.e2e.plugin import DRIVER

REGISTRY = Path("/var/lib/kubelet/plugins_registry")
#: How often the slices are listed and the instances probed.
PERIOD = 0.05


class Watcher(threading.Thread):
    """Calls `sample` every `period` seconds until stopped."""

    def __init__(self, period: float = PERIOD) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.stopped = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            try:
                self.sample()
            except BaseException as err:  # reported by the test
                self.errors.append(err)
                return

    def sample(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


class SliceWatch(Watcher):
    """The node's pool as the scheduler reads it, and how many plugin pods run."""

    def __init__(self, client: KubeClient, node: str, devices: int) -> None:
        super().__init__()
        self.client, self.node, self.devices = client, node, devices
        self.incomplete: list[str] = []
        self.samples = 0

    def sample(self) -> None:
        items = self.client.list_resource_slices(f"spec.driver={DRIVER},spec.nodeName={self.node}")["items"]
        newest = max((s["spec"]["pool"]["generation"] for s in items), default=0)
        current = [s for s in items if s["spec"]["pool"]["generation"] == newest]
        count = sum(len(s["spec"].get("devices") or []) for s in current)
        expected = current[0]["spec"]["pool"]["resourceSliceCount"] if current else 1
        if count != self.devices or len(current) != expected:
            self.incomplete.append(f"{time.strftime('%T')}: {len(current)} slices, {count} devices")
        self.samples += 1


class PrepareProbe(Watcher):
    """Whether some registered instance answers NodePrepareResources, asked every `period`.

    A round in which no instance answers (none registered, or each failing or timing out) opens
    an outage; the next round in which one answers closes it. `longest_outage` is the longest
    such time (0 when every round found an instance that answered); `rounds` counts them all.
    """

    def __init__(self, period: float = PERIOD) -> None:
        super().__init__(period)
        self.longest_outage = 0.0
        self.failed_rounds = 0
        self.rounds = 0
        self.instances: set[str] = set()
        self._down_since: float | None = None

    def sample(self) -> None:
        started = time.monotonic()
        self.rounds += 1
        for socket in REGISTRY.glob(f"{DRIVER}-*reg.sock"):
            try:
                # GetInfo only, as the kubelet's watcher: no registration status is sent.
                with grpc.insecure_channel(f"unix://{socket}") as channel:
                    stub = reg_grpc.RegistrationStub(channel)
                    endpoint = stub.GetInfo(reg_pb.InfoRequest(), timeout=1.0).endpoint
                with kubeletclient.DRAClient(endpoint) as client:
                    client.prepare([], timeout=1.0)
            except (grpc.RpcError, OSError):
                continue
            self.instances.add(socket.name)
            if self._down_since is not None:
                self.longest_outage = max(self.longest_outage, time.monotonic() - self._down_since)
                self._down_since = None
            return
        self.failed_rounds += 1
        if self._down_since is None:
            self._down_since = started

    def stop(self) -> None:
        super().stop()
        if self._down_since is not None:
            self.longest_outage = max(self.longest_outage, time.monotonic() - self._down_since)
