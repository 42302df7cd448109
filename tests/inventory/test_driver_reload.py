"""A host driver reloaded under `serve` (the GPU operator's driver manager upgrading it): `serve`
on the C fake NVML, whose driver is unloaded and then loaded again with another version. Every
device turns unhealthy while NVML answers "driver not loaded", healthy again once it initialises
again, without a restart; the prepared claim stays and the new driver version is republished."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import cast

import yaml

from dradriver import kubeletclient
from dradriver.backend.select import open_backend
from dradriver.health.board import Health
from dradriver.plugin.driver import ClaimRef
from tests.fakenvml.harness import fake_driver
from tests.helpers import HealthStream, ServeProcess, allocated_claim, short_tmpdir, uid, wait_for
from tests.inventory.test_nvml_inventory import published_names, reconfigure
from tests.robustness.common import dradriver


def all_in(stream: HealthStream, health: Health, names: set[str]) -> bool:
    return set(stream.latest) == names and {h for h, _ in stream.latest.values()} == {health}


def inventory_changes(log: str) -> list[dict[str, object]]:
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [r for r in records if r.get("event") == "inventory changed"]


def test_a_host_driver_reload_is_lived_through_without_a_restart(
    fake_nvml_library: Path, tmp_path: Path
) -> None:
    inventory = open_backend("dgx-h100").discover()
    names = published_names(inventory)
    fake = fake_driver(fake_nvml_library, tmp_path, inventory)
    config, unloaded = fake.config, fake.unloaded
    with short_tmpdir() as root:
        serve = ServeProcess(
            root,
            ["--rescan-interval", "0", "--log-format", "json", *fake.serve_args],
            fake.env,
            fake_gpus=None,
        )
        claim = allocated_claim("claim-1", uid(1), [{"request": "gpu", "device": "gpu-0"}])
        (serve.claims_dir / "claim-1.yaml").write_text(yaml.safe_dump(claim))
        ref = ClaimRef("default", "claim-1", uid(1))
        serve.start()
        stream = HealthStream(serve.dra_socket)
        try:
            wait_for(lambda: all_in(stream, Health.HEALTHY, names), 60, f"the devices ({serve.log()})")
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                first = client.prepare([ref], timeout=60)
            assert first.claims[ref.uid].error == ""

            unloaded.touch()  # the driver manager unloads the host driver
            wait_for(lambda: all_in(stream, Health.UNHEALTHY, names), 60, f"all unhealthy ({serve.log()})")
            assert "the host driver is not available" in stream.latest["gpu-0"][1]

            upgraded = dataclasses.replace(inventory, driver_version="580.82.07")
            reconfigure(config, upgraded)
            os.unlink(unloaded)  # ... and loads the new one
            wait_for(lambda: all_in(stream, Health.HEALTHY, names), 60, f"all healthy again ({serve.log()})")
            wait_for(lambda: inventory_changes(serve.log()), 60, "the rescan after the driver came back")
            # Every device's attributes changed (driverVersion): republished, none added or removed.
            (change,) = inventory_changes(serve.log())
            assert (change["added"], change["removed"]) == ([], [])
            assert set(cast(list[str], change["changed"])) == names

            with kubeletclient.DRAClient(serve.dra_socket) as client:
                again = client.prepare([ref], timeout=60)
            assert again == first  # the claim was kept
            status = dradriver("status", "--state-dir", str(serve.plugins_dir / serve.driver), "-o", "json")
            assert [c["uid"] for c in json.loads(status.stdout)["claims"]] == [ref.uid]
            assert serve.proc is not None
            assert serve.proc.poll() is None  # never restarted
        finally:
            stream.close()
            serve.kill()
            fake.events.close()
