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

from bench.bench_health import stream_latency_fake
from bench.common import summary
from dradriver import kubeletclient

VERSIONS = tuple(kubeletclient.KUBELET_HEALTH_SERVICES)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    samples = stream_latency_fake(args.runs, VERSIONS)
    for version, latency in samples.items():
        print(summary(f"XID -> UNHEALTHY on the {version} stream (both open)", latency))
    gaps = [abs(a - b) for a, b in zip(*samples.values(), strict=True)]
    print(summary("the same change, gap between the two streams' arrivals", gaps))


if __name__ == "__main__":
    main()
