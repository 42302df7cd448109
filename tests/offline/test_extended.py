"""Extended resources backed by DRA: the class behind each name, a pod's requests as the scheduler
turns them into its claim, the pod's total as ResourceQuota counts it, and amounts the API server
refuses (one line naming the object and field, exit 2 from the CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.offline.extended import (
    ExtendedRequest,
    ExtendedResourceError,
    pod_extended_resources,
    resource_classes,
)
from dradriver.offline.quota import IMPLICIT_PREFIX, admissions, devices_name

GPU = "nvidia.com/gpu"
CLASS = "extended-resource.gpu.dradriver.dev"
BACKED = {GPU: CLASS}


def device_class(name: str, resource: str | None = None, created: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if created is not None:
        meta["creationTimestamp"] = created
    spec = {"extendedResourceName": resource} if resource else {}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": meta, "spec": spec}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def container(
    limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "c", "resources": resources, **extra}


def test_a_class_backs_its_extended_resource_name_else_its_implicit_one() -> None:
    assert resource_classes([device_class("a", GPU), device_class("b")]) == {
        GPU: "a",
        "deviceclass.resource.kubernetes.io/b": "b",
    }


def test_of_several_classes_for_one_name_the_newest_wins_then_the_first_by_name() -> None:
    older = device_class("zeta", GPU, "2026-01-01T00:00:00Z")
    newer = device_class("omega", GPU, "2026-06-01T00:00:00Z")
    twin = device_class("alpha", GPU, "2026-06-01T00:00:00Z")
    unstamped = device_class("aaa", GPU)
    assert resource_classes([older, newer, unstamped]) == {GPU: "omega"}
    assert resource_classes([older, newer, twin, unstamped]) == {GPU: "alpha"}
    assert resource_classes([unstamped, device_class("bbb", GPU)]) == {GPU: "aaa"}


def test_requests_are_named_by_container_counting_init_containers_first_and_by_sorted_request() -> None:
    """The second %d is the resource's place among all the container's requests (cpu, memory
    and the defaults from limits too), and the claim's requests are sorted by name."""
    regular = [container({GPU: 1}, {"cpu": "1", "memory": "1Gi"}) for _ in range(10)]
    sidecar = container({GPU: "2"}, restartPolicy="Always")
    asked = pod_extended_resources(pod(*regular, init=(sidecar,)), BACKED)
    assert asked is not None
    assert asked.requests[:3] == (
        ExtendedRequest("container-0-request-0", CLASS, 2),
        ExtendedRequest("container-1-request-2", CLASS, 1),
        ExtendedRequest("container-10-request-2", CLASS, 1),
    )
    assert len(asked.requests) == 11


@pytest.mark.parametrize(
    ("init", "requests"),
    [
        # The containers after it start once it is done: it uses their devices.
        ((1,), [("container-1-request-0", 1), ("container-2-request-0", 2)]),
        ((3,), [("container-1-request-0", 1), ("container-2-request-0", 2)]),
        # What they lack is its own request...
        ((4,), [("container-0-request-0", 1), ("container-1-request-0", 1), ("container-2-request-0", 2)]),
        # ...and of several, one by one, only the largest is kept.
        ((5, 6), [("container-1-request-0", 3), ("container-2-request-0", 1), ("container-3-request-0", 2)]),
    ],
)
def test_an_init_container_reuses_the_devices_of_the_containers_after_it(
    init: tuple[int, ...], requests: list[tuple[str, int]]
) -> None:
    asked = pod_extended_resources(
        pod(container({GPU: 1}), container({GPU: 2}), init=tuple(container({GPU: n}) for n in init)), BACKED
    )
    assert asked is not None
    assert [(r.name, r.count) for r in asked.requests] == requests


def test_an_init_container_does_not_reuse_a_sidecar_that_runs_beside_it() -> None:
    """A sidecar before it is running while it runs; one after it has not started."""
    before = container({GPU: 1}, restartPolicy="Always")
    after = container({GPU: 1}, restartPolicy="Always")
    asked = pod_extended_resources(pod(init=(before, container({GPU: 1}), after)), BACKED)
    assert asked is not None
    assert [(r.name, r.count) for r in asked.requests] == [
        ("container-0-request-0", 1),
        ("container-2-request-0", 1),
    ]
    assert asked.totals == {GPU: 2}


def test_a_request_for_none_asks_for_nothing_and_an_amount_may_carry_a_suffix() -> None:
    asked = pod_extended_resources(pod(container({GPU: 0}), container({GPU: "2k"})), BACKED)
    assert asked is not None
    assert asked.requests == (ExtendedRequest("container-1-request-0", CLASS, 2000),)
    assert asked.totals == {GPU: 2000}


def test_resources_no_class_backs_are_not_read() -> None:
    asked = pod_extended_resources(pod(container({"example.com/fpga": "half"})), BACKED)
    assert asked is not None
    assert asked.requests == ()
    assert asked.totals == {}


def test_an_object_without_a_pod_spec_has_nothing_to_ask() -> None:
    assert pod_extended_resources({"kind": "ConfigMap"}, BACKED) is None


@pytest.mark.parametrize(
    ("init", "regular", "total"),
    [
        ((), (1, 2), 3),  # the containers run together
        ((4,), (1, 2), 4),  # an init container runs alone, before them
        ((1,), (1, 2), 3),
        (("sidecar:1", 2), (1,), 3),  # a sidecar runs beside the init container after it
        (("sidecar:1",), (1, 1), 3),  # and beside the containers
        ((2, "sidecar:3"), (1,), 4),  # not beside the init container before it
    ],
)
def test_the_pod_total_is_what_resource_quota_counts(
    init: tuple[int | str, ...], regular: tuple[int, ...], total: int
) -> None:
    inits = tuple(
        container({GPU: int(str(n).removeprefix("sidecar:"))}, restartPolicy="Always")
        if str(n).startswith("sidecar:")
        else container({GPU: n})
        for n in init
    )
    asked = pod_extended_resources(pod(*(container({GPU: n}) for n in regular), init=inits), BACKED)
    assert asked is not None
    assert asked.totals == {GPU: total}


@pytest.mark.parametrize(
    ("resources", "field", "message"),
    [
        ({"limits": {GPU: "1.5"}}, f"limits[{GPU}]", "'1.5': must be an integer"),
        ({"limits": {GPU: -1}}, f"limits[{GPU}]", "'-1': must be greater than or equal to 0"),
        ({"limits": {GPU: "lots"}}, f"limits[{GPU}]", "'lots': quantities must match"),
        ({"limits": {GPU: [1]}}, f"limits[{GPU}]", "must be a quantity such as 1, not list"),
        ({"requests": {GPU: 1}}, f"limits[{GPU}]", "must be set"),
        ({"limits": {GPU: 2}, "requests": {GPU: 1}}, f"requests[{GPU}]", "must be equal to its limit of 2"),
    ],
)
def test_an_amount_the_api_server_refuses_is_one_error_naming_the_object_and_field(
    resources: dict[str, Any], field: str, message: str
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "a"}, {"name": "b", "resources": resources}]}}
        },
    }
    with pytest.raises(ExtendedResourceError) as caught:
        pod_extended_resources(deployment, BACKED)
    prefix = f"Deployment team-a/train: spec.template.spec.containers[1].resources.{field}: "
    assert str(caught.value).startswith(prefix + message), str(caught.value)


def test_quota_counts_the_pod_total_and_the_claim_s_devices() -> None:
    """A sidecar of 1 GPU and an init container of 2 before a container of 1: the pod asks
    requests.nvidia.com/gpu 3 at most at once (the init container beside the sidecar); the
    scheduler's claim holds 3 devices: the sidecar's, the container's, and the one the init
    container needs beyond the container's."""
    sidecar = container({GPU: 1}, restartPolicy="Always")
    workload = pod(container({GPU: 1}), init=(sidecar, container({GPU: 2})))
    planned = admissions([], [(workload, pod_extended_resources(workload, BACKED))], {CLASS: GPU})
    assert [(a.kind, a.name, a.usage) for a in planned] == [
        ("Pod", "p", {f"requests.{GPU}": 3}),
        (
            "ResourceClaim",
            "p-extended-resources",
            {
                "count/resourceclaims.resource.k8s.io": 1,
                devices_name(CLASS): 3,
                IMPLICIT_PREFIX + CLASS: 3,
            },
        ),
    ]


def write(tmp_path: Path, *objects: dict[str, Any]) -> str:
    path = tmp_path / "input.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return str(path)


def test_dry_run_refuses_a_bad_amount_with_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write(tmp_path, device_class(CLASS, GPU), pod(container({GPU: "1.5"})))
    assert main(["dry-run", "--claim", manifest, "--fake-gpus", "dgx-h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"dradriver dry-run: error: {manifest}:2: Pod team-a/p: spec.containers[0].resources.limits[{GPU}]: "
        "'1.5': must be an integer (a number of devices)"
    ]


def test_dry_run_builds_the_scheduler_s_claim_from_init_and_regular_containers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write(
        tmp_path,
        device_class(CLASS, GPU),
        pod(container({GPU: 1}, {"cpu": "1"}), init=(container({GPU: 2}),)),
    )
    assert main(["dry-run", "--claim", manifest, "--fake-gpus", "dgx-h100", "-o", "json"]) == 0
    (claim,) = json.loads(capsys.readouterr().out)["nodes"][0]["claims"]
    assert claim["name"] == "p-extended-resources"
    # The init container is container 0 and needs one GPU beyond the regular one's, whose GPU
    # comes after its cpu request.
    assert [(r["name"], r["deviceClassName"], r["count"]) for r in claim["requests"]] == [
        ("container-0-request-0", CLASS, 1),
        ("container-1-request-1", CLASS, 1),
    ]
