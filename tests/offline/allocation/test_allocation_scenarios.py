"""Allocation scenarios, each checked against the scheduler's stable allocator behaviour.

Source: kubernetes/dynamic-resource-allocation structured/internal/stable/allocator_stable.go
(release-1.36): allocateOne (first solution, backtracking), allocateDevice (in use, adminAccess,
constraints, taints, counters), validateDeviceRequest ("All", missing class), selectorsMatch
(class before request selectors, lazily; CEL errors abort), matchAttributeConstraint.
"""

from __future__ import annotations

from typing import Any

from dradriver.offline.allocation import (
    DeviceClass,
    Simulation,
    parse_claim,
    parse_device_class,
    parse_slice,
    simulate,
)
from tests.offline.cel.cel_fixtures import DRIVER, gpu_device

V1 = "resource.k8s.io/v1"


def device_class(name: str = "gpu.dradriver.dev", *selectors: str) -> DeviceClass:
    return parse_device_class(
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in selectors]},
        }
    )


GPU_CLASS = device_class(
    "gpu.dradriver.dev",
    f'device.driver == "{DRIVER}"',
    f'device.attributes["{DRIVER}"].type == "gpu"',
)


def exactly(
    name: str, *selectors: str, device_class: str = "gpu.dradriver.dev", **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class, **extra}
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": body}


def claim(name: str, *requests: dict[str, Any], constraints: list[Any] | None = None, **extra: Any) -> Any:
    obj: dict[str, Any] = {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": list(requests), "constraints": constraints or []}},
        **extra,
    }
    return parse_claim(obj)


def slice_of(
    devices: list[dict[str, Any]], node: str = "node-a", name: str = "node-a-gpus", **spec: Any
) -> Any:
    return parse_slice(
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
                **spec,
            },
        }
    )


def gpus(
    count: int, prefix: str = "gpu", attributes: dict[str, list[dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    """`count` GPUs; `attributes` maps an attribute name to one value per GPU."""
    per_index = attributes or {}
    out = []
    for i in range(count):
        own = dict(gpu_device()["attributes"])
        own["uuid"] = {"string": f"GPU-{i}"}
        own["minor"] = {"int": i}
        for key, values in per_index.items():
            own[key] = values[i]
        out.append(gpu_device(f"{prefix}-{i}", attributes=own))
    return out


def run(
    claims: list[Any], slices: list[Any], classes: list[DeviceClass] | None = None, node: str | None = None
) -> Simulation:
    by_name = {c.name: c for c in (classes or [GPU_CLASS])}
    return simulate(claims, by_name, slices, node)


def allocated(sim: Simulation, claim_index: int = 0) -> list[tuple[str, str]]:
    chosen = sim.chosen
    assert chosen is not None
    return [(r.request, r.device) for r in chosen.claims[claim_index].results]


def test_exact_count_takes_the_first_matching_devices() -> None:
    sim = run([claim("c", exactly("gpu", count=2))], [slice_of(gpus(4))])
    assert allocated(sim) == [("gpu", "gpu-0"), ("gpu", "gpu-1")]


def test_count_larger_than_inventory_is_unsatisfiable_with_reason() -> None:
    sim = run([claim("c", exactly("gpu", count=5))], [slice_of(gpus(4))])
    assert not sim.satisfiable
    assert sim.nodes[0].reason == (
        "claim default/c: request gpu needs 5 device(s) of class gpu.dradriver.dev, "
        "4 of 4 match its selectors"
    )


def test_all_mode_takes_every_matching_device() -> None:
    selector = f'device.attributes["{DRIVER}"].minor % 2 == 0'
    sim = run([claim("c", exactly("gpu", selector, allocationMode="All"))], [slice_of(gpus(4))])
    assert allocated(sim) == [("gpu", "gpu-0"), ("gpu", "gpu-2")]


def test_all_mode_with_no_match_is_unsatisfiable() -> None:
    sim = run([claim("c", exactly("gpu", "false", allocationMode="All"))], [slice_of(gpus(2))])
    assert not sim.satisfiable
    assert "asks for all matching devices, but none of 2 matches" in (sim.nodes[0].reason or "")


def test_first_available_falls_back_in_order() -> None:
    big = 'device.capacity["gpu.dradriver.dev"].memory.compareTo(quantity("100Gi")) >= 0'
    request = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "big",
                "deviceClassName": "gpu.dradriver.dev",
                "selectors": [{"cel": {"expression": big}}],
            },
            {"name": "two", "deviceClassName": "gpu.dradriver.dev", "count": 2},
            {"name": "one", "deviceClassName": "gpu.dradriver.dev"},
        ],
    }
    sim = run([claim("c", request)], [slice_of(gpus(2))])
    assert allocated(sim) == [("gpu/two", "gpu-0"), ("gpu/two", "gpu-1")]
    report = sim.nodes[0].claims[0]
    assert [(r.request, r.selected, r.matching) for r in report.requests] == [
        ("gpu/big", False, 0),
        ("gpu/two", True, 2),
        ("gpu/one", False, 2),
    ]


def test_match_attribute_keeps_devices_on_one_pcie_root() -> None:
    roots = [{"string": r} for r in ("pci0", "pci1", "pci1", "pci0")]
    devices = gpus(4, attributes={"resource.kubernetes.io/pcieRoot": roots})
    constraint = [{"matchAttribute": "resource.kubernetes.io/pcieRoot", "requests": ["a", "b"]}]
    # Request a can only use gpu-1 (root pci1), so b must skip gpu-0 (pci0) and take gpu-2.
    a = exactly("a", f'device.attributes["{DRIVER}"].uuid == "GPU-1"')
    sim = run([claim("c", a, exactly("b"), constraints=constraint)], [slice_of(devices)])
    assert allocated(sim) == [("a", "gpu-1"), ("b", "gpu-2")]


def test_match_attribute_without_a_common_value_is_unsatisfiable() -> None:
    roots = [{"string": r} for r in ("pci0", "pci1")]
    devices = gpus(2, attributes={"resource.kubernetes.io/pcieRoot": roots})
    constraint = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    sim = run([claim("c", exactly("gpu", count=2), constraints=constraint)], [slice_of(devices)])
    assert not sim.satisfiable
    assert "constraints (matchAttribute resource.kubernetes.io/pcieRoot)" in (sim.nodes[0].reason or "")


def test_match_attribute_on_the_driver_domain_finds_bare_names() -> None:
    # lookupAttribute: "<driver>/productName" also finds the bare name "productName".
    constraint = [{"matchAttribute": f"{DRIVER}/productName"}]
    sim = run([claim("c", exactly("gpu", count=2), constraints=constraint)], [slice_of(gpus(2))])
    assert allocated(sim) == [("gpu", "gpu-0"), ("gpu", "gpu-1")]


def test_devices_are_not_reused_across_claims() -> None:
    claims = [claim("first", exactly("gpu", count=2)), claim("second", exactly("gpu", count=2))]
    sim = run(claims, [slice_of(gpus(3))])
    assert not sim.satisfiable
    assert sim.nodes[0].reason == (
        "claim default/second fits on its own, but not together with default/first: devices cannot be shared "
        "between claims"
    )


def test_devices_are_not_reused_across_requests() -> None:
    sim = run([claim("c", exactly("a"), exactly("b"))], [slice_of(gpus(2))])
    assert allocated(sim) == [("a", "gpu-0"), ("b", "gpu-1")]
    sim = run([claim("c", exactly("a"), exactly("b"))], [slice_of(gpus(1))])
    assert not sim.satisfiable
    assert "not enough distinct ones for all requests together" in (sim.nodes[0].reason or "")


def test_admin_access_may_use_devices_of_other_claims_but_not_its_own() -> None:
    claims = [claim("workload", exactly("gpu")), claim("monitor", exactly("gpu", adminAccess=True))]
    sim = run(claims, [slice_of(gpus(1))])
    assert allocated(sim, 1) == [("gpu", "gpu-0")]
    assert sim.chosen is not None
    assert sim.chosen.claims[1].results[0].admin_access is True
    # Within one claim, an admin request cannot take a device its own claim already holds.
    same = claim("c", exactly("gpu"), exactly("admin", adminAccess=True))
    assert not run([same], [slice_of(gpus(1))]).satisfiable


def test_class_selectors_and_request_selectors_both_apply() -> None:
    devices = gpus(2)
    devices[0]["attributes"]["type"] = {"string": "mig"}
    request = exactly("gpu", f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA")')
    sim = run([claim("c", request)], [slice_of(devices)])
    assert allocated(sim) == [("gpu", "gpu-1")]
    outcomes = sim.nodes[0].claims[0].requests[0].devices[0].selectors
    assert [(o.source, o.outcome) for o in outcomes] == [
        ("class gpu.dradriver.dev", "true"),
        ("class gpu.dradriver.dev", "false"),
        ("request", "skipped"),
    ]


def test_cel_runtime_error_fails_allocation_like_the_scheduler() -> None:
    sim = run([claim("c", exactly("gpu", f'device.attributes["{DRIVER}"].nope == 1'))], [slice_of(gpus(2))])
    assert not sim.satisfiable
    assert sim.nodes[0].error == "claim default/c: selector #0: CEL runtime error: no such key: nope"


def test_selectors_are_evaluated_lazily_as_in_the_scheduler() -> None:
    # Only gpu-1 lacks the attribute; the scheduler stops at gpu-0 and never evaluates gpu-1.
    devices = gpus(2)
    del devices[1]["attributes"]["migCapable"]
    sim = run([claim("c", exactly("gpu", f'device.attributes["{DRIVER}"].migCapable'))], [slice_of(devices)])
    assert allocated(sim) == [("gpu", "gpu-0")]
    verdict = sim.nodes[0].claims[0].requests[0].devices[1]
    assert verdict.error == "claim default/c: selector #0: CEL runtime error: no such key: migCapable"


def test_already_allocated_claims_hold_their_devices() -> None:
    status = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]
            }
        }
    }
    claims = [claim("old", exactly("gpu"), status=status), claim("new", exactly("gpu"))]
    sim = run(claims, [slice_of(gpus(2))])
    assert sim.chosen is not None
    assert sim.chosen.claims[0].preallocated
    assert allocated(sim, 1) == [("gpu", "gpu-1")]


def test_v1beta1_shapes_are_accepted() -> None:
    beta_claim = parse_claim(
        {
            "apiVersion": "resource.k8s.io/v1beta1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "default"},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.dradriver.dev"}]}}
            },
        }
    )
    beta_slice = parse_slice(
        {
            "apiVersion": "resource.k8s.io/v1beta1",
            "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-9", "basic": {k: v for k, v in gpu_device().items() if k != "name"}}
                ],
            },
        }
    )
    assert allocated(run([beta_claim], [beta_slice])) == [("gpu", "gpu-9")]


def test_taints_need_a_toleration() -> None:
    devices = gpus(1)
    devices[0]["taints"] = [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]
    assert not run([claim("c", exactly("gpu"))], [slice_of(devices)]).satisfiable
    tolerant = exactly("gpu", tolerations=[{"key": "maintenance", "operator": "Exists"}])
    assert allocated(run([claim("c", tolerant)], [slice_of(devices)])) == [("gpu", "gpu-0")]


def test_shared_counters_limit_partitions() -> None:
    mig = [
        {
            "name": f"gpu-0-mig-{i}",
            "attributes": {"type": {"string": "gpu"}},
            "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}],
        }
        for i in range(3)
    ]
    counters = [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]
    sl = slice_of(mig, sharedCounters=counters)
    assert allocated(run([claim("c", exactly("gpu", count=2))], [sl])) == [
        ("gpu", "gpu-0-mig-0"),
        ("gpu", "gpu-0-mig-1"),
    ]
    assert not run([claim("c", exactly("gpu", count=3))], [sl]).satisfiable


def test_missing_device_class_is_an_error() -> None:
    sim = run([claim("c", exactly("gpu", device_class="nope"))], [slice_of(gpus(1))])
    assert sim.nodes[0].error == (
        "claim default/c, request gpu: could not retrieve device class nope: "
        'deviceclass.resource.k8s.io "nope" not found'
    )


def test_every_node_is_tried_and_the_first_fit_chosen() -> None:
    slices = [slice_of(gpus(2), "node-a", "a"), slice_of(gpus(4), "node-b", "b")]
    sim = run([claim("c", exactly("gpu", count=3))], slices)
    assert [(n.node, n.satisfiable) for n in sim.nodes] == [("node-a", False), ("node-b", True)]
    assert sim.chosen is not None
    assert sim.chosen.node == "node-b"


def test_incomplete_pool_is_skipped_with_a_warning() -> None:
    sl = slice_of(gpus(1), pool={"name": "node-a", "generation": 1, "resourceSliceCount": 2})
    sim = run([claim("c", exactly("gpu"))], [sl])
    assert not sim.satisfiable
    assert any("is incomplete: 1 of 2 slices" in w for w in sim.nodes[0].warnings)


def test_allocation_is_deterministic() -> None:
    # Slices of a pool are ordered by name, whatever order they were read in.
    pool = {"name": "node-a", "generation": 1, "resourceSliceCount": 2}
    slices = [
        slice_of(gpus(3, "b"), name="b-slice", pool=pool),
        slice_of(gpus(3, "a"), name="a-slice", pool=pool),
    ]
    expected = [("gpu", "a-0"), ("gpu", "a-1")]
    assert allocated(run([claim("c", exactly("gpu", count=2))], slices)) == expected
    assert allocated(run([claim("c", exactly("gpu", count=2))], slices[::-1])) == expected


def test_a_thousand_claims_allocate_without_recursion() -> None:
    """One frame per allocated device lives on an explicit stack, not Python's (issues 12, 14)."""
    claims = [claim(f"c{i}", exactly("gpu")) for i in range(1000)]
    pools = [{"name": f"pool-{s}", "generation": 1, "resourceSliceCount": 1} for s in range(8)]
    slices = [slice_of(gpus(125, prefix=f"s{s}"), name=f"node-a-{s}", pool=pools[s]) for s in range(8)]
    sim = run(claims, slices)
    assert sim.satisfiable
    taken = {r.device for report in sim.nodes[0].claims for r in report.results}
    assert len(taken) == 1000


def test_distinct_attribute_takes_devices_with_different_values() -> None:
    numa = [{"int": n} for n in (0, 0, 1, 1)]
    constraint = [{"distinctAttribute": f"{DRIVER}/numaNode", "requests": ["gpu"]}]
    sim = run(
        [claim("c", exactly("gpu", count=2), constraints=constraint)],
        [slice_of(gpus(4, attributes={"numaNode": numa}))],
    )
    assert allocated(sim) == [("gpu", "gpu-0"), ("gpu", "gpu-2")]


def test_distinct_attribute_unsatisfiable_when_values_repeat() -> None:
    numa = [{"int": 0}] * 4
    constraint = [{"distinctAttribute": f"{DRIVER}/numaNode"}]
    sim = run(
        [claim("c", exactly("gpu", count=2), constraints=constraint)],
        [slice_of(gpus(4, attributes={"numaNode": numa}))],
    )
    assert not sim.satisfiable


# -- consumable capacity (DRAConsumableCapacity, on by default in 1.36) ------------------------------
# Expected values are what dra-oracle (the 1.36.2 allocator) answers for the same objects.

RANGE_POLICY = {"default": "10Gi", "validRange": {"min": "10Gi", "max": "40Gi", "step": "10Gi"}}


def shared_gpus(count: int, policy: dict[str, Any] | None = RANGE_POLICY) -> list[dict[str, Any]]:
    devices = gpus(count)
    for device in devices:
        device["allowMultipleAllocations"] = True
        if policy is not None:
            device["capacity"]["memory"]["requestPolicy"] = policy
    return devices


def memory(amount: str, name: str = "memory") -> dict[str, Any]:
    return {"capacity": {"requests": {name: amount}}}


def consumed(sim: Simulation, claim_index: int = 0) -> list[tuple[str, str, str | None]]:
    chosen = sim.chosen
    assert chosen is not None
    return [
        (r.request, r.device, dict(r.consumed_capacity).get("memory"))
        for r in chosen.claims[claim_index].results
    ]


def test_a_shared_device_serves_several_requests_rounded_up_by_its_policy() -> None:
    sim = run(
        [claim("c", exactly("a", **memory("15Gi")), exactly("b", **memory("25Gi")))],
        [slice_of(shared_gpus(1))],
    )
    assert consumed(sim) == [("a", "gpu-0", "20Gi"), ("b", "gpu-0", "30Gi")]
    assert sim.chosen is not None
    share_ids = [r.share_id for r in sim.chosen.claims[0].results]
    assert None not in share_ids
    assert len(set(share_ids)) == 2


def test_a_request_without_an_amount_consumes_the_policy_default_or_everything() -> None:
    sim = run([claim("a", exactly("gpu")), claim("b", exactly("gpu"))], [slice_of(shared_gpus(1))])
    assert consumed(sim, 0) == consumed(sim, 1) == [("gpu", "gpu-0", "10Gi")]
    # Without a policy every allocation takes the whole capacity: the device is not shared.
    sim = run([claim("a", exactly("gpu")), claim("b", exactly("gpu"))], [slice_of(shared_gpus(1, None))])
    assert not sim.satisfiable


def test_shares_that_do_not_fit_what_is_left_move_to_the_next_device() -> None:
    claims = [claim(f"c{i}", exactly("gpu", **memory("40Gi"))) for i in range(3)]
    sim = run(claims, [slice_of(shared_gpus(2))])
    assert [consumed(sim, i)[0][1] for i in range(3)] == ["gpu-0", "gpu-0", "gpu-1"]


def test_amounts_outside_the_policy_or_the_device_are_not_allocated() -> None:
    values = {"default": "10Gi", "validValues": ["10Gi", "30Gi"]}
    sim = run([claim("c", exactly("gpu", **memory("12Gi")))], [slice_of(shared_gpus(1, values))])
    assert consumed(sim) == [("gpu", "gpu-0", "30Gi")]
    for amount in ("41Gi", "90Gi"):
        sim = run([claim("c", exactly("gpu", **memory(amount)))], [slice_of(shared_gpus(1))])
        assert not sim.satisfiable, amount
    sim = run([claim("c", exactly("gpu", **memory("40Gi")))], [slice_of(shared_gpus(1, values))])
    assert not sim.satisfiable


def test_capacity_requests_match_names_exactly_and_apply_to_unshared_devices() -> None:
    for name in ("bandwidth", f"{DRIVER}/memory"):
        sim = run([claim("c", exactly("gpu", **memory("1Gi", name)))], [slice_of(shared_gpus(1))])
        assert not sim.satisfiable, name
    sim = run([claim("c", exactly("gpu", **memory("90Gi")))], [slice_of(gpus(1))])
    assert not sim.satisfiable
    sim = run([claim("c", exactly("gpu", **memory("70Gi")))], [slice_of(gpus(1))])
    assert sim.chosen is not None
    result = sim.chosen.claims[0].results[0]
    assert (result.device, result.share_id, result.consumed_capacity) == ("gpu-0", None, ())


def test_shares_held_by_allocated_claims_count() -> None:
    held: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
    held |= {"shareID": "0b5e52b4-1f62-4f4a-9d5e-3c1b0f7f9a10", "consumedCapacity": {"memory": "70Gi"}}
    status = {"allocation": {"devices": {"results": [held]}}}
    claims = [claim("old", exactly("gpu"), status=status), claim("new", exactly("gpu", **memory("20Gi")))]
    sim = run(claims, [slice_of(shared_gpus(2))])
    assert consumed(sim, 1) == [("gpu", "gpu-1", "20Gi")]
    claims[1] = claim("new", exactly("gpu", **memory("10Gi")))
    assert consumed(run(claims, [slice_of(shared_gpus(2))]), 1) == [("gpu", "gpu-0", "10Gi")]


def test_the_allocation_status_carries_share_ids_and_consumed_capacity() -> None:
    from dradriver.offline.allocation.result import allocation_status

    sim = run([claim("c", exactly("gpu", **memory("15Gi")))], [slice_of(shared_gpus(1))])
    assert sim.chosen is not None
    status = allocation_status(sim.chosen.claims[0], {GPU_CLASS.name: GPU_CLASS})
    (result,) = status["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": "20Gi"}
    assert result["shareID"] == sim.chosen.claims[0].results[0].share_id


def test_a_capacity_shortfall_is_explained() -> None:
    sim = run([claim("c", exactly("gpu", **memory("90Gi")))], [slice_of(shared_gpus(1))])
    assert sim.nodes[0].reason is not None
    assert "request gpu has enough matching devices, but their capacity cannot serve" in sim.nodes[0].reason
