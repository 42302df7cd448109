"""Issue 38: what device metadata costs a prepare, in process, without gRPC or an API server.

Run (repository root):

    .venv/bin/python -m bench.bench_metadata --calls 2000

Two GpuDrivers on the `dgx-h100` fake profile, one with device metadata and one without, every
directory (state, CDI, metadata) on /dev/shm as /var/run is on a node, prepare one whole-GPU
claim read from a file and unprepare it, the two drivers taking turns call by call (so load on
the machine falls on both alike). Prints each one's prepare p50 and p90 and the difference:
the CPU the metadata adds (describe the devices, encode and write the file, record it).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import structlog

from bench.common import percentile
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.gpu_driver import GpuDriver
from tests.helpers import allocated_claim, uid
from tests.prepare.node import Node

GPUS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="prepares per driver")
    opts = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    runs: dict[bool, tuple[GpuDriver, list[ClaimRef], list[float]]] = {}
    for metadata in (True, False):
        node = Node(Path(tempfile.mkdtemp(dir="/dev/shm")), "dgx-h100", device_metadata=metadata)
        claims = [
            node.add(allocated_claim(f"c{i}", uid(i), [{"request": "gpu", "device": f"gpu-{i}"}]))
            for i in range(GPUS)
        ]
        runs[metadata] = (node.driver(), claims, [])
    for n in range(opts.calls):
        for metadata in (True, False) if n % 2 else (False, True):
            driver, claims, samples = runs[metadata]
            ref = claims[n % GPUS]
            started = time.perf_counter()
            assert driver.prepare([ref])[ref.uid].error == ""
            samples.append(time.perf_counter() - started)
            driver.unprepare([ref])
    medians = {}
    for metadata, (_, _, samples) in runs.items():
        medians[metadata] = statistics.median(samples)
        label, p90 = "on" if metadata else "off", percentile(samples, 90)
        print(f"metadata {label}: prepare p50 {medians[metadata] * 1e3:.3f} ms, p90 {p90 * 1e3:.3f} ms")
    print(f"difference of the p50s: {(medians[True] - medians[False]) * 1e3:+.3f} ms")


if __name__ == "__main__":
    main()
