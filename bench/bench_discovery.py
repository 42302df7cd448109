"""Issue 3 figures: `dradriver slices` wall time, and in-process rendering of 1,000 devices.

    .venv/bin/python -m bench.bench_discovery [--cli-runs 30] [--render-runs 200]

Prints median and p99 of each measurement as a Markdown table (for bench/RESULTS.md).
Targets: `dradriver slices --fake-gpus dgx-a100-mig` median <= 1.0 s; rendering 1,000 devices
(device model + slices) <= 50 ms.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import yaml

from bench.common import percentile
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.discovery import NodeInventory
from dradriver.slices import render_slices, validate_slices


def _row(what: str, samples: list[float], target: str) -> str:
    median, p99 = statistics.median(samples), percentile(samples, 99)
    return f"| {what} | {len(samples)} | {median * 1000:.1f} ms | {p99 * 1000:.1f} ms | {target} |"


def _time(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm up: imports, caches
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def cli_wall_times(runs: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRADRIVER_")}
    command = [
        sys.executable,
        "-m",
        "dradriver",
        "slices",
        "--fake-gpus",
        "dgx-a100-mig",
        "--node-name",
        "n1",
    ]
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return samples


def big_inventory(tmp: Path, *, mig: bool) -> NodeInventory:
    """A fake node with 1,000 devices: 1,000 H100s, or 39 A100s with every MIG placement (1,014)."""
    profile = yaml.safe_load(
        resources.files("dradriver.backend.fake.profiles").joinpath("dgx-a100-mig.yaml").read_text()
    )
    group = profile["gpus"][0] if mig else profile["gpus"][2]
    for key in ("pciBusIds", "pcieRoots", "numaNodes"):
        group.pop(key)
    group["count"] = 39 if mig else 1000
    profile["gpus"] = [group]
    path = tmp / "big.yaml"
    path.write_text(yaml.safe_dump(profile))
    return open_backend(str(path)).discover()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cli-runs", type=int, default=30)
    parser.add_argument("--render-runs", type=int, default=200)
    args = parser.parse_args()

    rows = [
        "| measurement | runs | median | p99 | target |",
        "| --- | --- | --- | --- | --- |",
        _row(
            "`dradriver slices --fake-gpus dgx-a100-mig` (fresh process, wall)",
            cli_wall_times(args.cli_runs),
            "≤ 1.0 s",
        ),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for mig in (False, True):
            inventory = big_inventory(Path(tmp), mig=mig)
            partitionable = mig
            devices = build_devices(inventory, driver_name=DEFAULT_DRIVER_NAME, partitionable=partitionable)
            slices = render_slices(devices, node_name="n1", driver_name=DEFAULT_DRIVER_NAME)
            assert validate_slices(slices) == []
            label = f"{len(devices.devices)} devices, " + (
                "39 A100 with every MIG placement (--partitionable)" if mig else "1,000 GPUs"
            )

            def model_and_render(inv: NodeInventory = inventory, part: bool = partitionable) -> object:
                built = build_devices(inv, driver_name=DEFAULT_DRIVER_NAME, partitionable=part)
                return render_slices(built, node_name="n1", driver_name=DEFAULT_DRIVER_NAME)

            rows.append(
                _row(
                    f"render {label}: device model + slices",
                    _time(model_and_render, args.render_runs),
                    "≤ 50 ms",
                )
            )
            rows.append(
                _row(
                    f"validate {label} (`validate_slices`)",
                    _time(functools.partial(validate_slices, slices), args.render_runs),
                    "—",
                )
            )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
