"""Property tests: whatever discovery reports, what we render passes the upstream limits."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver.devicemodel import build_devices
from dradriver.devicemodel.values import binary_quantity, decimal_quantity, truncate_utf8
from dradriver.discovery import Gpu, MigDevice, MigPlacement, MigProfile, MigResources, NodeInventory
from dradriver.quantity import parse_quantity
from dradriver.slices import render_slices, validate_slices

DRIVER = "gpu.dradriver.dev"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

texts = st.text(max_size=100)
counts = st.integers(min_value=0, max_value=2**40)
versions = st.one_of(
    texts,
    st.from_regex(r"\A\d{1,4}(\.\d{1,4}){0,3}\Z"),
    st.from_regex(r"\Av?\d{1,3}\.\d{1,3}\.0\d\Z"),
)
uuids = st.one_of(texts, st.uuids().map(lambda u: f"GPU-{u}"))
placements = st.builds(MigPlacement, start=st.integers(0, 40), size=st.integers(1, 10))
resources = st.builds(
    MigResources,
    memory_mib=counts,
    multiprocessors=counts,
    copy_engines=counts,
    decoders=counts,
    encoders=counts,
    jpeg_engines=counts,
    ofa_engines=counts,
)
profiles = st.builds(
    MigProfile,
    name=st.one_of(texts, st.sampled_from(["1g.10gb", "1g.10gb+me", "3g.40gb", "7g.80gb"])),
    profile_id=st.integers(0, 64),
    slice_count=st.integers(1, 8),
    instance_count=st.integers(1, 8),
    resources=resources,
    placements=st.lists(placements, max_size=8).map(tuple),
)


@st.composite
def gpus(draw: st.DrawFn, minor: int) -> Gpu:
    uuid = draw(uuids)
    table = tuple(draw(st.lists(profiles, max_size=4)))
    migs = tuple(
        MigDevice(
            uuid=draw(uuids),
            parent_minor=minor,
            parent_uuid=uuid,
            gi_id=draw(st.integers(0, 14)),
            ci_id=draw(st.integers(0, 7)),
            profile=draw(st.one_of(texts, st.sampled_from([p.name for p in table] or ["2g.20gb"]))),
            gi_profile_id=draw(st.integers(0, 64)),
            placement=draw(placements),
            compute_placement=draw(placements),
            full_gpu_instance=draw(st.booleans()),
            resources=draw(resources),
            gi_caps_minor=None,
            ci_caps_minor=None,
        )
        for _ in range(draw(st.integers(0, 3)))
    )
    mig_capable = draw(st.booleans())
    return Gpu(
        index=minor,
        minor=minor,
        uuid=uuid,
        product_name=draw(texts),
        brand=draw(texts),
        architecture=draw(texts),
        compute_capability=(draw(st.integers(0, 2**70)), draw(st.integers(0, 99))),
        memory_bytes=draw(st.integers(0, 2**70)),
        pci_bus_id=draw(texts),
        pcie_root=draw(st.none() | texts),
        numa_node=draw(st.none() | st.integers(-(2**70), 2**70)),
        mig_capable=mig_capable,
        mig_enabled=mig_capable and draw(st.booleans()),
        mig_profiles=table,
        mig_devices=migs,
    )


@st.composite
def plain_gpus(draw: st.DrawFn, minor: int) -> Gpu:
    """A GPU without MIG, varying only what differs between real GPUs of one node (cheap to draw)."""
    return Gpu(
        index=minor,
        minor=minor,
        uuid=draw(uuids),
        product_name=draw(st.text(max_size=80)),
        brand="Nvidia",
        architecture="Hopper",
        compute_capability=(9, 0),
        memory_bytes=draw(st.integers(0, 2**40)),
        pci_bus_id="0000:1b:00.0",
        pcie_root=None,
        numa_node=None,
        mig_capable=False,
        mig_enabled=False,
    )


@st.composite
def inventories(draw: st.DrawFn, max_gpus: int, min_gpus: int = 0, gpu: Any = gpus) -> NodeInventory:
    minors = draw(st.lists(st.integers(0, 2**31), unique=True, min_size=min_gpus, max_size=max_gpus))
    return NodeInventory(
        driver_version=draw(versions),
        cuda_driver_version=draw(versions),
        gpus=tuple(draw(gpu(minor)) for minor in minors),
    )


node_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?(\.[a-z0-9]{1,10}){0,2}\Z")


@SETTINGS
@given(inventory=inventories(max_gpus=12), partitionable=st.booleans(), node=node_names)
def test_rendered_slices_always_pass_the_upstream_limits(
    inventory: NodeInventory, partitionable: bool, node: str
) -> None:
    devices = build_devices(inventory, driver_name=DRIVER, partitionable=partitionable)
    slices = render_slices(devices, node_name=node, driver_name=DRIVER)
    assert validate_slices(slices) == []
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert names == [d.name for d in devices.devices]
    assert len(names) == len(set(names))


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(inventory=inventories(min_gpus=100, max_gpus=300, gpu=plain_gpus))
def test_hundreds_of_devices_split_into_valid_slices(inventory: NodeInventory) -> None:
    devices = build_devices(inventory, driver_name=DRIVER)
    slices = render_slices(devices, node_name="node-a", driver_name=DRIVER)
    assert validate_slices(slices) == []
    assert [len(s["spec"]["devices"]) for s in slices][:-1] == [128] * (len(slices) - 1)
    assert sum(len(s["spec"]["devices"]) for s in slices) == len(inventory.gpus)


@SETTINGS
@given(st.integers(min_value=-(2**80), max_value=2**80))
def test_quantities_parse_back_to_their_value(count: int) -> None:
    assert parse_quantity(binary_quantity(count)) == count
    assert parse_quantity(decimal_quantity(count)) == count


@SETTINGS
@given(st.text())
def test_truncation_keeps_a_valid_utf8_prefix(value: str) -> None:
    published = truncate_utf8(value)
    assert len(published.encode()) <= 64
    assert value.encode("utf-8", "replace").decode().startswith(published)
