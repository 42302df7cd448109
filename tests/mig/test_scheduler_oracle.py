"""Partitionable layouts through the real Kubernetes 1.36 allocator and through `dry-run`'s
simulator: the same verdict and the same devices, pod after pod, with earlier allocations held.

Targeted at MIG placements (the general differential suite covers everything else): the pair
3g.40gb + 4g.40gb lands on one GPU, a claim that cannot fit any more is refused by both, a whole
GPU in MIG mode is never offered, operator-made MIG devices block what they overlap, and random
sequences of MIG claims on empty and partly used GPUs agree step by step.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.offline.allocation import parse_claim, parse_device_class, parse_slice, simulate
from dradriver.slices import build_node_slices
from tests.deploy.manifests import DEVICECLASSES
from tests.helpers import write_gpu_profile
from tests.mig.oracle import Oracle, oracle_binary

DRIVER = "gpu.dradriver.dev"
NODE = "node-1"
Json = dict[str, Any]


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    real = Oracle(oracle_binary())
    yield real
    real.close()


def device_classes() -> list[Json]:
    return [yaml.safe_load((DEVICECLASSES / name).read_text()) for name in ("gpu.yaml", "mig.yaml")]


def claim(name: str, *requests: tuple[str, str, int], same_gpu: bool = False) -> Json:
    """A claim with requests (name, MIG profile or "gpu", count)."""
    spec_requests = []
    for request, profile, count in requests:
        exactly: Json = {
            "deviceClassName": "gpu.dradriver.dev" if profile == "gpu" else "mig.gpu.dradriver.dev"
        }
        exactly["count"] = count
        if profile != "gpu":
            exactly["selectors"] = [
                {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}
            ]
        spec_requests.append({"name": request, "exactly": exactly})
    devices: Json = {"requests": spec_requests}
    if same_gpu:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/parentUUID"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": devices},
    }


def named(slices: list[Json]) -> list[Json]:
    """Slices as the API server stores them: generateName turned into a name."""
    return [{**s, "metadata": {"name": s["metadata"]["generateName"] + "x"}} for s in slices]


class Scheduler:
    """Claims scheduled one at a time, like pods: each sees the allocations made before it."""

    def __init__(self, oracle: Oracle, slices: list[Json]) -> None:
        self.oracle = oracle
        self.slices = named(slices)
        self.classes = device_classes()
        self.allocated: list[Json] = []

    def schedule(self, new: Json) -> list[str] | None:
        """The devices both allocators give `new`, or None when both refuse; fails if they differ."""
        real = self.oracle.allocate(
            node=NODE, classes=self.classes, slices=self.slices, claims=[new], allocated=self.allocated
        )
        assert "error" not in real, real
        ours = self._simulate(new)
        if real.get("unsatisfiable"):
            assert ours is None, f"{new['metadata']['name']}: the scheduler refuses, dry-run gives {ours}"
            return None
        [result] = real["results"]
        devices = [r["device"] for r in result["allocation"]["devices"]["results"]]
        assert ours == devices, f"{new['metadata']['name']}: the scheduler gives {devices}, dry-run {ours}"
        self.allocated.append({**new, "status": {"allocation": result["allocation"]}})
        return devices

    def _simulate(self, new: Json) -> list[str] | None:
        claims = [parse_claim(c) for c in [*self.allocated, new]]
        classes = {c.name: c for c in map(parse_device_class, self.classes)}
        report = simulate(claims, classes, [parse_slice(s) for s in self.slices], node=NODE).nodes[0]
        if not report.satisfiable:
            return None
        return [d.device for d in report.claims[-1].results]


def slices_of(profile: str) -> list[Json]:
    return build_node_slices(profile, node_name=NODE, driver_name=DRIVER, partitionable=True)


def test_3g_and_4g_share_an_empty_gpu_and_a_third_claim_stays_pending(oracle: Oracle) -> None:
    scheduler = Scheduler(oracle, slices_of("a100-mig-empty"))
    assert scheduler.schedule(claim("a", ("mig", "3g.40gb", 1))) == ["gpu-0-mig-3g40gb-4"]
    assert scheduler.schedule(claim("b", ("mig", "4g.40gb", 1))) == ["gpu-0-mig-4g40gb-0"]
    assert scheduler.schedule(claim("c", ("mig", "1g.10gb", 1))) is None
    # The whole GPU in MIG mode is never offered: a GPU claim gets the MIG-off one, then nothing.
    assert scheduler.schedule(claim("d", ("gpu", "gpu", 1))) == ["gpu-1"]
    assert scheduler.schedule(claim("e", ("gpu", "gpu", 1))) is None


def test_the_pair_in_one_claim_on_one_gpu(oracle: Oracle) -> None:
    pair = claim("pair", ("small", "3g.40gb", 1), ("large", "4g.40gb", 1), same_gpu=True)
    scheduler = Scheduler(oracle, slices_of("a100-mig-empty"))
    assert scheduler.schedule(pair) == ["gpu-0-mig-3g40gb-4", "gpu-0-mig-4g40gb-0"]
    # On dgx-a100-mig every MIG-enabled GPU is full of operator-made devices: no room for the pair.
    full = Scheduler(oracle, slices_of("dgx-a100-mig"))
    assert full.schedule(pair) is None
    assert full.schedule(claim("one", ("mig", "1g.10gb", 1))) == ["gpu-0-mig-1g10gb-6"]  # as it is


def test_operator_made_devices_block_the_placements_they_overlap(oracle: Oracle) -> None:
    """`mixed` GPU 3 holds 2g.10gb@0, 1g.5gb@2 and 3g.20gb@4: only slice 3 is free."""
    scheduler = Scheduler(oracle, slices_of("mixed"))
    assert scheduler.schedule(claim("a", ("mig", "1g.10gb", 1))) is None
    assert scheduler.schedule(claim("b", ("mig", "1g.5gb", 2))) == ["gpu-3-mig-1g5gb-2", "gpu-3-mig-1g5gb-3"]
    assert scheduler.schedule(claim("c", ("mig", "1g.5gb+me", 1))) is None


def random_claims(rng: random.Random, profiles: Sequence[str], count: int) -> Iterator[Json]:
    for i in range(count):
        wanted = [
            (f"r{j}", rng.choice(profiles), rng.choice((1, 1, 2))) for j in range(rng.choice((1, 1, 2)))
        ]
        yield claim(f"c{i}", *wanted, same_gpu=len(wanted) > 1 and rng.random() < 0.5)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_claim_sequences_agree_with_the_scheduler(oracle: Oracle, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    h100s = write_gpu_profile(tmp_path / "h100-mig.yaml", 2, mig_empty=True)
    for profile, names in (
        (str(h100s), ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("mixed", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "7g.40gb", "gpu"]),
        ("a100-mig-empty", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "gpu"]),
    ):
        scheduler = Scheduler(oracle, slices_of(profile))
        outcomes = [scheduler.schedule(c) is not None for c in random_claims(rng, names, 25)]
        assert any(outcomes), profile
        assert not all(outcomes), profile


@pytest.mark.parametrize(("capacity", "satisfiable"), [("4", False), ("5", True)])
def test_a_device_refused_by_a_constraint_keeps_its_counters_as_in_the_scheduler(
    oracle: Oracle, capacity: str, satisfiable: bool
) -> None:
    """Kubernetes 1.36's allocator does not give back the counters of a candidate that a
    matchAttribute constraint rejects (allocateDevice returns before deallocating); the search
    then runs out of counters early. dry-run must refuse what the scheduler refuses."""

    def device(name: str, parent: str) -> Json:
        return {
            "name": name,
            "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": parent}},
            "consumesCounters": [{"counterSet": "set", "counters": {"units": {"value": "1"}}}],
        }

    pool = {"name": NODE, "generation": 1, "resourceSliceCount": 2}
    typed = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
    slices = [
        {
            **typed,
            "metadata": {"name": "a"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": pool,
                "devices": [device("m0", "p1"), device("m1", "p2"), device("m2", "p2")],
            },
        },
        {
            **typed,
            "metadata": {"name": "b"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": pool,
                "sharedCounters": [{"name": "set", "counters": {"units": {"value": capacity}}}],
            },
        },
    ]
    two = {"deviceClassName": "mig.gpu.dradriver.dev"}
    pair = claim("pair")
    pair["spec"]["devices"] = {
        "requests": [{"name": "a", "exactly": two}, {"name": "b", "exactly": two}],
        "constraints": [{"matchAttribute": f"{DRIVER}/parentUUID"}],
    }
    scheduler = Scheduler(oracle, [])
    scheduler.slices = slices
    assert (scheduler.schedule(pair) is not None) is satisfiable
