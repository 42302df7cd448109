"""Issue 12 figures: loading the largest input files the safe loader accepts.

    .venv/bin/python -m bench.bench_inputs [--runs 15]

Each file is as large as the limits allow (dradriver.files.parse: YAML 2 MiB and 250,000
values, JSON 8 MiB and 1,000,000 values), in three shapes: realistic ResourceSlices (what
`kubectl get resourceslices -o yaml` gives, the biggest input people feed dry-run), and the two
worst cases per byte for the YAML builder (a flow list of zeros, a map of distinct keys).
Prints median and p99 load time (`load_documents`, read + parse) and the peak of Python memory
while loading (tracemalloc), as a Markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.common import percentile
from dradriver.files import load_documents
from dradriver.files.parse import JSON_LIMITS, YAML_LIMITS


def _slice(index: int) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{d}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "uuid": {"string": f"GPU-{index:08x}-{d:04x}-4000-8000-000000000000"},
                "driverVersion": {"version": "570.124.6"},
                "index": {"int": d},
                "migCapable": {"bool": True},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for d in range(8)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"node-{index}-gpu.dradriver.dev-abcde", "uid": f"uid-{index}"},
        "spec": {
            "driver": "gpu.dradriver.dev",
            "nodeName": f"node-{index}",
            "pool": {"name": f"node-{index}", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _largest(render: Callable[[int], str], max_bytes: int, max_values: int, per_item: int) -> str:
    """The largest `render(n)` the loader accepts (n items of about `per_item` values)."""
    low, high = 1, max_values // per_item + 1
    while low < high:
        middle = (low + high + 1) // 2
        if _accepted(render(middle), max_bytes):
            low = middle
        else:
            high = middle - 1
    return render(low)


def _accepted(text: str, max_bytes: int) -> bool:
    from dradriver.files.parse import ParseError, looks_like_json, parse_json, parse_yaml

    if len(text.encode()) > max_bytes:
        return False
    try:
        parse_json(text) if looks_like_json(text) else parse_yaml(text)
    except ParseError:
        return False  # over the value limit
    return True


def files(directory: Path) -> dict[str, Path]:
    yaml_slices = _largest(
        lambda n: yaml.safe_dump_all([_slice(i) for i in range(n)]),
        YAML_LIMITS.max_bytes,
        YAML_LIMITS.max_nodes,
        130,
    )
    json_slices = _largest(
        lambda n: json.dumps({"kind": "List", "items": [_slice(i) for i in range(n)]}),
        JSON_LIMITS.max_bytes,
        JSON_LIMITS.max_nodes,
        130,
    )
    zeros = "[" + ",".join(["0"] * (YAML_LIMITS.max_nodes - 1)) + "]\n"
    keys = "".join(f"key-{i}: v\n" for i in range(YAML_LIMITS.max_nodes // 2 - 1))
    out = {}
    for name, text in (
        ("ResourceSlices, YAML", yaml_slices),
        ("flow list of zeros, YAML", zeros),
        ("map of distinct keys, YAML", keys),
        ("ResourceSlices, JSON", json_slices),
    ):
        path = directory / (
            name.replace(", ", ".").replace(" ", "-") + (".json" if "JSON" in name else ".yaml")
        )
        path.write_text(text)
        out[name] = path
    return out


def measure(path: Path, runs: int) -> tuple[list[float], float]:
    load_documents(path)  # warm-up: imports, page cache
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        load_documents(path)
        samples.append(time.perf_counter() - start)
    tracemalloc.start()
    load_documents(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return samples, peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    rows = [
        "| file (at the limits) | size | runs | median | p99 | peak memory | target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in files(Path(tmp)).items():
            samples, peak_mb = measure(path, args.runs)
            target = "≤ 1 s, ≤ 100 MB" if "YAML" in name else "—"
            rows.append(
                f"| {name} | {path.stat().st_size / 2**20:.2f} MiB | {len(samples)} | "
                f"{statistics.median(samples):.3f} s | {percentile(samples, 99):.3f} s | "
                f"{peak_mb:.0f} MB | {target} |"
            )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
