"""The live inventory through NVML: `serve` on the C fake NVML while the node's MIG layout is
changed behind its back (as `nvidia-smi mig` or mig-parted would), picked up from NVML's MIG
config event, or by the periodic rescan where there is no event."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.discovery import NodeInventory
from tests.fakenvml.harness import CONFIG_ENV, EVENTS_ENV, EventPipe, config_text
from tests.helpers import DRIVER, HealthStream, ServeProcess, short_tmpdir, wait_for


def published_names(inventory: NodeInventory) -> set[str]:
    return {d.name for d in build_devices(inventory, driver_name=DRIVER).devices}


def one_mig_device_destroyed(inventory: NodeInventory) -> NodeInventory:
    first = inventory.gpus[0]
    return dataclasses.replace(
        inventory,
        gpus=(dataclasses.replace(first, mig_devices=first.mig_devices[1:]), *inventory.gpus[1:]),
    )


def reconfigure(config: Path, inventory: NodeInventory) -> None:
    aside = config.with_name(".nvml.conf.new")
    aside.write_text(config_text(inventory))
    os.replace(aside, config)


@contextmanager
def serving_on_nvml(
    library: Path, tmp_path: Path, inventory: NodeInventory, rescan: str
) -> Iterator[tuple[Path, EventPipe, HealthStream, ServeProcess]]:
    config = tmp_path / "nvml.conf"
    config.write_text(config_text(inventory))
    events = EventPipe(tmp_path / "nvml-events")
    env = {"LD_LIBRARY_PATH": str(library.parent), CONFIG_ENV: str(config), EVENTS_ENV: str(events.path)}
    with short_tmpdir() as root:
        serve = ServeProcess(root, ["--rescan-interval", rescan], env, fake_gpus=None).start()
        stream = HealthStream(serve.dra_socket)
        try:
            wait_for(
                lambda: set(stream.latest) == published_names(inventory), 20, f"the devices ({serve.log()})"
            )
            wait_for(lambda: "driver ready" in serve.log(), 20, "the driver")
            yield config, events, stream, serve
        finally:
            stream.close()
            serve.kill()
            events.close()


def test_a_mig_layout_change_is_picked_up_from_the_nvml_event(
    fake_nvml_library: Path, tmp_path: Path
) -> None:
    inventory = open_backend("dgx-a100-mig").discover()
    changed = one_mig_device_destroyed(inventory)
    with serving_on_nvml(fake_nvml_library, tmp_path, inventory, rescan="0") as (
        config,
        events,
        stream,
        serve,
    ):
        reconfigure(config, changed)
        events.send("mig 0")  # nvmlEventMigConfigChange on GPU 0
        wait_for(
            lambda: set(stream.latest) == published_names(changed), 10, f"the new MIG layout ({serve.log()})"
        )
        assert "MIG configuration changed" in serve.log()
        # And back: a MIG device created outside the driver appears the same way.
        reconfigure(config, inventory)
        events.send("mig 0")
        wait_for(lambda: set(stream.latest) == published_names(inventory), 10, "the MIG device back")


def test_without_an_event_the_periodic_rescan_finds_the_change(
    fake_nvml_library: Path, tmp_path: Path
) -> None:
    inventory = open_backend("dgx-a100-mig").discover()
    changed = one_mig_device_destroyed(inventory)
    with serving_on_nvml(fake_nvml_library, tmp_path, inventory, rescan="1") as (config, _, stream, serve):
        reconfigure(config, changed)
        wait_for(
            lambda: set(stream.latest) == published_names(changed),
            10,
            f"the rescan to see it ({serve.log()})",
        )
        assert "MIG configuration changed" not in serve.log()
