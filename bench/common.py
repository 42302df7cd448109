"""Small helpers for the benchmark scripts: percentiles and a results line."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.e2e.plugin import Deployment


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(name: str, samples_s: Sequence[float], unit: str = "ms") -> str:
    scale = {"ms": 1e3, "us": 1e6, "s": 1.0}[unit]
    return (
        f"{name}: n={len(samples_s)} median={statistics.median(samples_s) * scale:.3f}{unit} "
        f"p99={percentile(samples_s, 99) * scale:.3f}{unit} min={min(samples_s) * scale:.3f}{unit}"
    )


@contextlib.contextmanager
def real_api_server(k8s_bin: Path) -> Iterator[Path]:
    """A real kube-apiserver (with its etcd) from a directory of Kubernetes binaries, for as long
    as the block runs; yields its admin kubeconfig. No kubelet: the benchmarks drive the plugin."""
    from tests.e2e.cluster import ControlPlane, node_ip

    with tempfile.TemporaryDirectory(prefix="dradriver-bench-", dir="/var/tmp") as work:
        control_plane = ControlPlane(k8s_bin, Path(work), node_ip())
        try:
            control_plane.start()
            yield control_plane.admin_kubeconfig
        finally:
            control_plane.stop()


def labelled_path(value: str, what: str) -> tuple[str, Path]:
    """A `LABEL=PATH` argument (a build to run beside others); one line naming what it must be."""
    label, sep, path = value.partition("=")
    if not (label and sep and path):
        raise argparse.ArgumentTypeError(f"{value!r}: expected LABEL={what}")
    return label, Path(path)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """--bin and --release, for the benchmarks that run the plugin on a local cluster."""
    parser.add_argument("--bin", type=Path, required=True, help="directory of the Kubernetes binaries")
    parser.add_argument(
        "--release", type=Path, required=True, help="directory `make release` wrote (image and manifests)"
    )


@contextlib.contextmanager
def fake_overlay_on_local_cluster(k8s_bin: Path, release_dir: Path) -> Iterator[Deployment]:
    """A single-node cluster from these binaries (tests/e2e/cluster.py) running the release's
    `fake` overlay, for as long as the block runs; its directory is removed afterwards unless the
    block failed."""
    from tests.e2e.cluster import LocalCluster
    from tests.e2e.plugin import Deployment
    from tests.e2e.realcluster import RealCluster
    from tests.release.release import ReleaseDirectory

    work = Path(tempfile.mkdtemp(prefix="dradriver-bench-", dir="/var/tmp"))
    local = LocalCluster(k8s_bin, work)
    local.start()
    failed = True
    try:
        release = ReleaseDirectory.read(release_dir)
        local.import_image(release.archive)
        cluster = RealCluster(local.kubeconfig, local.node_name, local)
        deployment = Deployment(cluster, release, "overlays/fake")
        deployment.install()
        yield deployment
        failed = False
    finally:
        local.stop()
        # The components' logs (tens of MB a run) are worth keeping only when something failed.
        if failed:
            print(f"the local cluster's logs are in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


#: One sample of a Prometheus text exposition: (metric name, sorted label pairs) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Samples:
    """The samples of a Prometheus text exposition (comments skipped)."""
    samples: Samples = {}
    for line in text.splitlines():
        match = SAMPLE_LINE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        samples[name, tuple(sorted(LABEL.findall(labels or "")))] = float(value)
    return samples


def metric_sum(
    samples: Samples, name: str, by: Sequence[str] = (), **where: str
) -> dict[tuple[str, ...], float]:
    """Sum of `name`'s samples whose labels match `where`, grouped by the labels `by`."""
    sums: dict[tuple[str, ...], float] = {}
    for (metric, labels), value in samples.items():
        if metric != name:
            continue
        found = dict(labels)
        if all(found.get(k) == v for k, v in where.items()):
            key = tuple(found.get(label, "") for label in by)
            sums[key] = sums.get(key, 0.0) + value
    return sums


def histogram(samples: Samples, metric: str, **where: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets (upper bound, count), summed over the series matching `where`."""
    by_bound = metric_sum(samples, f"{metric}_bucket", ("le",), **where)
    return sorted((float("inf") if le == "+Inf" else float(le), n) for (le,), n in by_bound.items())


def bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """Prometheus-style quantile of cumulative buckets: linear within the bucket it falls in (the
    largest finite bound when it falls in +Inf)."""
    rank = q * buckets[-1][1]
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (
                count - previous_count
            )
        previous_bound, previous_count = bound, count
    return previous_bound


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The slope of the least-squares line through the points (xs[i], ys[i])."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a mapping (VmRSS, Threads, ...)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def rss_mb(pid: int) -> float:
    return int(proc_status(pid)["VmRSS"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
