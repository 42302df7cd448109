"""The live inventory end to end: a real `serve` on a fake GPU profile file that the test rewrites
while it runs, its slices in an API server (the fake always, a real one when configured), its
health stream and its DRA socket."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dradriver import kubeletclient
from dradriver.health.board import Health
from dradriver.plugin.driver import ClaimRef
from tests.helpers import (
    HealthStream,
    ServeProcess,
    allocated_claim,
    short_tmpdir,
    uid,
    wait_for,
    write_gpu_profile,
)
from tests.publish.apiservers import TEST_DRIVER, Backend


def rewrite(profile: Path, count: int, driver_version: str = "570.124.06") -> None:
    """Replace the profile atomically (as a ConfigMap update does): write aside, then rename."""
    aside = write_gpu_profile(profile.with_name(f".{profile.name}.new"), count)
    document = yaml.safe_load(aside.read_text())
    document["driverVersion"] = driver_version
    aside.write_text(yaml.safe_dump(document))
    os.replace(aside, profile)


def published(backend: Backend, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in backend.slices(node) for d in s["spec"].get("devices", [])}


def taints(backend: Backend, node: str, device: str) -> list[tuple[str, str, str]]:
    found = published(backend, node).get(device, {}).get("taints") or []
    return [(t["key"], t["value"], t["effect"]) for t in found]


@contextmanager
def serving(backend: Backend, node: str, count: int) -> Iterator[tuple[ServeProcess, Path, HealthStream]]:
    with short_tmpdir() as root:
        profile = root / "gpus.yaml"
        rewrite(profile, count)
        serve = ServeProcess(
            root,
            ["--kubeconfig", str(backend.kubeconfig), "--node-name", node, "--rescan-interval", "0"],
            {"DRADRIVER_DRIVER_NAME": TEST_DRIVER},
            TEST_DRIVER,
            fake_gpus=str(profile),
        ).start()
        stream = HealthStream(serve.dra_socket)
        try:
            wait_for(lambda: len(published(backend, node)) == count, 20, f"the first slices ({serve.log()})")
            yield serve, profile, stream
        finally:
            stream.close()
            serve.kill()


def claim_on(serve: ServeProcess, node: str, n: int, device: str) -> ClaimRef:
    serve.claims_dir.mkdir(exist_ok=True)
    claim = allocated_claim(
        f"claim-{n}", uid(n), [{"request": "gpu", "device": device}], pool=node, driver=TEST_DRIVER
    )
    (serve.claims_dir / f"claim-{n}.yaml").write_text(yaml.safe_dump(claim))
    return ClaimRef("default", f"claim-{n}", uid(n))


def test_profile_changes_are_published_and_a_vanished_prepared_gpu_stays_until_unprepared(
    backend: Backend,
) -> None:
    node = backend.make_node()
    with (
        serving(backend, node, 2) as (serve, profile, stream),
        kubeletclient.DRAClient(serve.dra_socket) as dra,
    ):
        held = claim_on(serve, node, 1, "gpu-1")
        assert dra.prepare([held]).claims[held.uid].error == ""

        rewrite(profile, 3)  # a GPU appears
        wait_for(lambda: sorted(published(backend, node)) == ["gpu-0", "gpu-1", "gpu-2"], 10, "gpu-2")
        wait_for(lambda: "gpu-2" in stream.latest, 10, "gpu-2 on the health stream")

        rewrite(profile, 1)  # gpu-2 (idle) and gpu-1 (prepared) disappear
        wait_for(lambda: "gpu-2" not in published(backend, node), 10, f"gpu-2 to go ({serve.log()})")
        assert sorted(published(backend, node)) == ["gpu-0", "gpu-1"]
        message = stream.wait("gpu-1", Health.UNHEALTHY)
        assert "is no longer on the node; kept until its claim is unprepared" in message
        wait_for(lambda: taints(backend, node, "gpu-1") != [], 10, "gpu-1's taint")
        assert taints(backend, node, "gpu-1") == [(f"{TEST_DRIVER}/unhealthy", "device-gone", "NoSchedule")]
        assert stream.latest["gpu-0"][0] == Health.HEALTHY

        # Nothing new is prepared on hardware that is gone.
        late = claim_on(serve, node, 2, "gpu-2")
        assert "which this node does not have" in dra.prepare([late]).claims[late.uid].error

        assert dra.unprepare([held]).claims[held.uid].error == ""
        wait_for(lambda: sorted(published(backend, node)) == ["gpu-0"], 10, "gpu-1 to go once unprepared")
        wait_for(lambda: "gpu-1" not in stream.latest, 10, "gpu-1 off the health stream")


def test_a_host_driver_upgrade_is_republished(backend: Backend) -> None:
    node = backend.make_node()
    with serving(backend, node, 2) as (serve, profile, _):
        rewrite(profile, 2, driver_version="575.51.3")
        wait_for(
            lambda: (
                {d["attributes"]["driverVersion"]["version"] for d in published(backend, node).values()}
                == {"575.51.3"}
            ),
            10,
            f"the new driver version ({serve.log()})",
        )
        assert "inventory changed" in serve.log()


def test_a_half_written_profile_keeps_what_is_published(backend: Backend) -> None:
    node = backend.make_node()
    with serving(backend, node, 2) as (serve, profile, _):
        profile.write_text("gpus: [")  # not YAML: the scan fails, the slices stay
        wait_for(lambda: "rescanning the node's devices failed" in serve.log(), 10, "the failed rescan")
        assert sorted(published(backend, node)) == ["gpu-0", "gpu-1"]
        rewrite(profile, 3)
        wait_for(lambda: len(published(backend, node)) == 3, 10, "the next good profile")
