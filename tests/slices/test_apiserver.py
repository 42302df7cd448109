"""Round trip through a real API server: what we render is accepted and stored unchanged.

Runs on the real cluster of the e2e harness (`real_cluster`); otherwise skipped. Slices go into
a pool of a made-up node and are deleted afterwards.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.backend.select import builtin_profile_names
from dradriver.devicemodel.shares import SharePolicy
from dradriver.kube import KubeClient, load_client
from dradriver.kube.client import RESOURCE_API
from dradriver.slices import Finding, build_node_slices, stored_differences
from tests.e2e.realcluster import RealCluster
from tests.helpers import write_gpu_profile

DRIVER = "gpu.dradriver.dev"


def test_stored_differences_names_dropped_fields_and_their_gate(tmp_path: Path) -> None:
    profile = write_gpu_profile(tmp_path / "mig.yaml", 6, mig_empty=True)
    sent = build_node_slices(str(profile), node_name="n", driver_name=DRIVER, partitionable=True)
    assert all(stored_differences(s, copy.deepcopy(s)) == [] for s in sent)
    stored = copy.deepcopy(sent[0])
    for device in stored["spec"]["devices"]:
        device.pop("consumesCounters")
    stored["spec"]["devices"][1]["capacity"]["memory"]["value"] = "1Gi"
    stored["spec"]["devices"][2]["attributes"]["extra"] = {"int": 1}
    differences = stored_differences(sent[0], stored)
    assert differences[0] == Finding(
        ".spec.devices[0].consumesCounters",
        "dropped by the API server; is the DRAPartitionableDevices feature gate off?",
    )
    assert len([d for d in differences if d.message.startswith("dropped")]) == 64
    sent_memory = sent[0]["spec"]["devices"][1]["capacity"]["memory"]["value"]
    assert (
        Finding(".spec.devices[1].capacity.memory.value", f"stored as '1Gi', sent {sent_memory!r}")
        in differences
    )
    assert Finding(".spec.devices[2].attributes.extra", "added by the API server: {'int': 1}") in differences
    # Empty lists and absent fields are the same thing on the wire.
    empty = build_node_slices("t4x4", node_name="n", driver_name=DRIVER)[0]
    empty["spec"]["devices"] = []
    omitted = copy.deepcopy(empty)
    del omitted["spec"]["devices"]
    assert stored_differences(empty, omitted) == []


@pytest.fixture(scope="module")
def resource_api(real_cluster: RealCluster) -> Iterator[KubeClient]:
    client = load_client(str(real_cluster.kubeconfig))
    assert client is not None
    yield client
    client.close()


def _round_trip(api: KubeClient, slices: list[dict[str, Any]]) -> list[Finding]:
    created: list[str] = []
    findings: list[Finding] = []
    try:
        for index, obj in enumerate(slices):
            stored = api.create_resource_slice(obj)
            created.append(stored["metadata"]["name"])
            assert stored["metadata"]["name"].startswith(obj["metadata"]["generateName"][:58])
            read = api.request("GET", f"{RESOURCE_API}/resourceslices/{created[-1]}")
            findings += [Finding(f"[{index}]{f.path}", f.message) for f in stored_differences(obj, read)]
    finally:
        for name in created:
            api.delete_resource_slice(name)
    return findings


@pytest.mark.cluster
@pytest.mark.parametrize("profile", builtin_profile_names())
def test_api_server_stores_every_profile_unchanged(resource_api: KubeClient, profile: str) -> None:
    node = f"dradriver-test-{uuid.uuid4().hex[:8]}"
    slices = build_node_slices(profile, node_name=node, driver_name=DRIVER)
    assert _round_trip(resource_api, slices) == []


@pytest.mark.cluster
@pytest.mark.parametrize("profile", ["dgx-a100-mig", "mixed"])
def test_api_server_partitionable_slices_are_stored_or_the_drop_is_reported(
    resource_api: KubeClient, profile: str
) -> None:
    """Counters need DRAPartitionableDevices (beta, on by default from 1.36): a server without it
    drops them, and that must show up as findings naming the gate, never pass silently."""
    node = f"dradriver-test-{uuid.uuid4().hex[:8]}"
    slices = build_node_slices(profile, node_name=node, driver_name=DRIVER, partitionable=True)
    findings = _round_trip(resource_api, slices)
    if findings:
        assert all("DRAPartitionableDevices" in f.message for f in findings), findings
        assert any(f.path.endswith(".sharedCounters") for f in findings)
        pytest.xfail(f"the API server dropped {len(findings)} counter fields: DRAPartitionableDevices is off")


@pytest.mark.cluster
@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100-mig"])
def test_api_server_stores_shared_gpus_unchanged(resource_api: KubeClient, profile: str) -> None:
    """Shareable GPUs and MIG devices (--gpu-shares): allowMultipleAllocations and the request
    policies are stored as sent (DRAConsumableCapacity, beta and on by default in 1.36)."""
    node = f"dradriver-test-{uuid.uuid4().hex[:8]}"
    slices = build_node_slices(profile, node_name=node, driver_name=DRIVER, shares=SharePolicy("mps"))
    assert any(d.get("allowMultipleAllocations") for s in slices for d in s["spec"]["devices"])
    assert _round_trip(resource_api, slices) == []
