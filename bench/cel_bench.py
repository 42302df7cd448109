"""Issue 6 figures: CEL selector evaluation, compilation, and `dradriver dry-run` wall time.

Run: `.venv/bin/python bench/cel_bench.py` (prints a markdown table; `--quick` for a smoke run).
Plain timing over many runs with time.perf_counter; medians and 99th percentiles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dradriver.offline.cel import clear_cache, compile_selector, to_cel_device

DRIVER = "gpu.dradriver.dev"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'

SELECTORS = {
    "driver + productName prefix": (
        f'device.driver == "{DRIVER}" && {A}.productName.startsWith("NVIDIA H100")'
    ),
    "memory >= 40Gi (quantity)": f'{C}.memory.compareTo(quantity("40Gi")) >= 0',
    "type + driverVersion (semver)": (
        f'{A}.type == "gpu" && {A}.driverVersion.isGreaterThan(semver("550.0.0"))'
    ),
    "cel.bind, 3 attributes": f"cel.bind(a, {A}, a.computeMajor >= 9 && a.migCapable && !a.migEnabled)",
}


def device(index: int) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{index:08x}-0000-1111-2222-333344445555"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "computeMajor": {"int": 9},
            "computeMinor": {"int": 0},
            "driverVersion": {"version": "550.54.15"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "minor": {"int": index % 8},
            "migCapable": {"bool": True},
            "migEnabled": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{index % 256:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{index % 4:02x}"},
            "numaNode": {"int": index % 2},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def measure(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def bench_selectors(runs: int) -> list[tuple[str, float, float]]:
    cel_device = to_cel_device(device(0), DRIVER)
    rows = []
    for name, expression in SELECTORS.items():
        selector = compile_selector(expression)
        assert selector.matches(cel_device, DRIVER)

        def once(compiled: Any = selector) -> None:
            compiled.matches(cel_device, DRIVER)

        median, p99 = measure(once, runs)
        rows.append((f"evaluate: {name}", median, p99))
    median, p99 = measure(lambda: to_cel_device(device(0), DRIVER), runs)
    rows.append(("build a device's CEL value (once per device)", median, p99))
    return rows


def bench_compile(runs: int) -> list[tuple[str, float, float]]:
    compile_selector("true")  # build the parser once ("warm")
    rows = []
    for name, expression in SELECTORS.items():

        def cold(e: str = expression) -> None:
            clear_cache()
            compile_selector(e)

        median, p99 = measure(cold, runs)
        rows.append((f"compile (cache miss): {name}", median, p99))
    expression = next(iter(SELECTORS.values()))
    median, p99 = measure(lambda: compile_selector(expression), runs * 10)
    rows.append(("compile (cache hit)", median, p99))
    return rows


def write_inputs(directory: Path, devices: int) -> list[str]:
    per_slice = 128
    slices = []
    count = (devices + per_slice - 1) // per_slice
    for n in range(count):
        slices.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"node-a-gpus-{n}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": "node-a",
                    "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": count},
                    "devices": [device(i) for i in range(n * per_slice, min(devices, (n + 1) * per_slice))],
                },
            }
        )
    (directory / "slices.yaml").write_text(yaml.safe_dump_all(slices, sort_keys=False))
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    (directory / "class.yaml").write_text(yaml.safe_dump(device_class))
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "two-selectors", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "count": 2,
                            "selectors": [
                                {"cel": {"expression": f'{A}.productName.startsWith("NVIDIA H100")'}},
                                {"cel": {"expression": f'{C}.memory.compareTo(quantity("40Gi")) >= 0'}},
                            ],
                        },
                    }
                ]
            }
        },
    }
    (directory / "claim.yaml").write_text(yaml.safe_dump(claim))
    return [
        sys.executable,
        "-m",
        "dradriver",
        "dry-run",
        "--claim",
        str(directory / "claim.yaml"),
        "--class",
        str(directory / "class.yaml"),
        "--slices",
        str(directory / "slices.yaml"),
    ]


def bench_dry_run(runs: int, devices: int) -> list[tuple[str, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        command = write_inputs(Path(tmp), devices)
        for output in ("table", "json"):
            argv = [*command, "-o", output]
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            assert result.returncode == 0, result.stderr
            if output == "json":
                assert json.loads(result.stdout)["satisfiable"] is True

            def once(command_line: list[str] = argv) -> None:
                subprocess.run(command_line, capture_output=True, check=True)

            median, p99 = measure(once, runs)
            rows.append((f"`dradriver dry-run` wall, {devices} devices, -o {output}", median, p99))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few runs, to check the script works")
    args = parser.parse_args(argv)
    runs = 50 if args.quick else 5000
    rows = bench_selectors(runs) + bench_compile(20 if args.quick else 300)
    rows += bench_dry_run(2 if args.quick else 15, 1000)
    print("| figure | median | p99 |\n| --- | --- | --- |")
    for name, median, p99 in rows:
        unit, scale = ("ms", 1e3) if median > 1e-3 else ("µs", 1e6)
        if median > 0.5:
            unit, scale = ("s", 1.0)
        print(f"| {name} | {median * scale:.3g} {unit} | {p99 * scale:.3g} {unit} |")


if __name__ == "__main__":
    main()
