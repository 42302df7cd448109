"""Issue 38 figure: a device's health change reaches a v1 stream client as fast as a v1alpha1 one.

    python -m bench.bench_health_versions [--runs 200]

One real `dradriver serve` on fake GPUs, both health streams open at once for the whole run (as
a 1.37 kubelet's v1 stream and a 1.36 kubelet's v1alpha1 one would be). Each run appends a fatal
XID to the fake-event log and times, from the append, the arrival of the first message with the
device UNHEALTHY on each stream, and the gap between the two; the device recovers (0.3 s quiet
period) before the next run. The fake-event log is polled every 0.2 s: most of a latency is that.
"""

from __future__ import annotations

import argparse
import time

from bench.bench_health import FAST_RECOVERY, TimedStream, serve
from bench.common import summary
from dradriver.backend.fake.health import FakeEventRecord, append_fake_event
from dradriver.health.board import Health
from tests.helpers import DRIVER, short_tmpdir, wait_for

VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def latencies(runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {v: [] for v in VERSIONS}
    with short_tmpdir() as root, serve(root, FAST_RECOVERY) as process:
        streams = {v: TimedStream(process.dra_socket, v) for v in VERSIONS}
        state_dir = process.plugins_dir / DRIVER
        wait_for((state_dir / "health.json").exists, 20, "health.json")
        for run in range(runs + 1):  # the first run warms up
            device = f"gpu-{run % 8}"
            started = time.perf_counter()
            append_fake_event(state_dir, FakeEventRecord(device=device, xid=79, at=time.time()))
            arrived = {v: s.first(device, Health.UNHEALTHY, started) for v, s in streams.items()}
            for version, stream in streams.items():
                stream.first(device, Health.HEALTHY, arrived[version])
                if run:
                    samples[version].append(arrived[version] - started)
        for stream in streams.values():
            stream.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    samples = latencies(args.runs)
    for version, latency in samples.items():
        print(summary(f"XID -> UNHEALTHY on the {version} stream (both open)", latency))
    gaps = [abs(a - b) for a, b in zip(*samples.values(), strict=True)]
    print(summary("the same change, gap between the two streams' arrivals", gaps))


if __name__ == "__main__":
    main()
