"""Issue 40 figure: the readiness probe and scrapes while idle connections hold the metrics port.

Run: .venv/bin/python -m bench.bench_metrics_flood [--runs 10] [--idle 1000] [--probes 20]
     [--scrapes 200] [--src DIR]

A real `serve` (fake dgx-h100, node-only, claims from files, telemetry every 5 s) registered with
a stand-in kubelet so /readyz answers 200. Each run: `--scrapes` GET /metrics back to back with
nothing else open; then `--idle` TCP connections opened at once that never send a byte, and while
they are open `--probes` GET /readyz (a failure: anything but 200, a reset, or no answer within
the kubelet's 5 s) and `--scrapes` GET /metrics; then they are closed. Reported: /readyz failures
of all runs, and scrape p50/p99 without and with the idle connections (all runs pooled, and the
range of the per-run p99s).

`--src DIR` runs the serve from another source tree (e.g. `git archive <commit> src | tar -x -C DIR`
and `--src DIR/src`), for a before/after on the same machine; only flags every version has are used.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common import percentile
from dradriver import kubeletclient
from tests.helpers import free_port, open_idle_connections, short_tmpdir, wait_for

DRIVER = "gpu.dradriver.dev"
PROBE_TIMEOUT_SECONDS = 5.0  # the DaemonSet's readinessProbe timeoutSeconds


def get(port: int, path: str) -> tuple[int, float]:
    """Status (0: reset, refused or timed out) and seconds of one GET on a fresh connection."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_SECONDS)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        status = response.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.perf_counter() - started


@contextmanager
def serve(root: Path, port: int, src: Path | None) -> Iterator[subprocess.Popen[bytes]]:
    registry, plugins = root / "registry", root / "plugins"
    (root / "claims").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("DRADRIVER_")}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    argv = [
        sys.executable, "-m", "dradriver", "serve", "--fake-gpus", "dgx-h100", "--node-name", "bench",
        "--kubelet-registry-dir", str(registry), "--kubelet-plugins-dir", str(plugins),
        "--cdi-dir", str(root / "cdi"), "--claims-dir", str(root / "claims"),
        "--metrics-address", f"127.0.0.1:{port}",
    ]  # fmt: skip
    with (root / "serve.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        socket_path = registry / f"{DRIVER}-reg.sock"
        wait_for(socket_path.exists, 30, "the registration socket")
        kubeletclient.register(socket_path)
        wait_for(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz 200")
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def scrapes(port: int, count: int) -> tuple[list[float], int]:
    """Seconds of each successful GET /metrics, and how many failed."""
    results = [get(port, "/metrics") for _ in range(count)]
    return [took for status, took in results if status == 200], sum(status != 200 for status, _ in results)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--src", type=Path, help="the source tree (its src/) to run serve from")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    failures = probes = scrape_failures = 0
    quiet: list[float] = []
    flooded: list[float] = []
    p99s: dict[str, list[float]] = {"quiet": [], "flooded": []}
    port = free_port()
    with short_tmpdir() as root, serve(root, port, args.src):
        for _ in range(args.runs):
            run_quiet, failed_quiet = scrapes(port, args.scrapes)
            idle = open_idle_connections(port, args.idle)
            try:
                statuses = [get(port, "/readyz")[0] for _ in range(args.probes)]
                run_flooded, failed_flooded = scrapes(port, args.scrapes)
            finally:
                for conn in idle:
                    conn.close()
            probes += len(statuses)
            failures += sum(status != 200 for status in statuses)
            scrape_failures += failed_quiet + failed_flooded
            quiet += run_quiet
            flooded += run_flooded
            for key, run in (("quiet", run_quiet), ("flooded", run_flooded)):
                if run:
                    p99s[key].append(percentile(run, 99))

    def ms(samples: list[float], q: float) -> float | None:
        return round(percentile(samples, q) * 1e3, 2) if samples else None

    print(
        json.dumps(
            {
                "runs": args.runs,
                "idle_connections": args.idle,
                "readyz_failures": f"{failures} of {probes}",
                "scrape_failures": scrape_failures,
                "scrape_ms_quiet": {"p50": ms(quiet, 50), "p99": ms(quiet, 99), "n": len(quiet)},
                "scrape_ms_with_idle": {"p50": ms(flooded, 50), "p99": ms(flooded, 99), "n": len(flooded)},
                "per_run_p99_ms": {
                    k: [round(min(v) * 1e3, 2), round(max(v) * 1e3, 2)] if v else None
                    for k, v in p99s.items()
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
