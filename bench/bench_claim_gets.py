"""Issue 36: what a claim's GET costs the node's CPU, through dradriver's API client.

Run (repository root; --baseline-python is the interpreter of another install, e.g. an older tree,
measured in the same run, round by round in turn):

    .venv/bin/python -m bench.bench_claim_gets --k8s-bin /var/tmp/dradriver-k8s-bin \\
        [--dradriver-python <install>/bin/python] [--baseline-python <install>/bin/python]

One etcd + kube-apiserver (as bench_vs_go) holding 128 allocated ResourceClaims; each round, each
install's `KubeClient` (its own process, its own user) GETs 64 of them 30 times one after the
other and 30 times with 8 in flight (as a 64-claim prepare does). Printed per install: the
median wall time and the median CPU time of the client's process for the 64 GETs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: GETs of one batch, and batches of each kind per round.
BATCH = 64
REPEATS = 30
IN_FLIGHT = 8


def measure(kubeconfig: str, namespace: str, names: list[str]) -> dict[str, list[float]]:
    """The client's side (run in the install measured): wall and CPU seconds of each batch."""
    from dradriver.kube import load_client

    client = load_client(kubeconfig)
    assert client is not None
    pool = ThreadPoolExecutor(IN_FLIGHT)
    out: dict[str, list[float]] = {}

    def get(name: str) -> object:
        return client.get_resource_claim(namespace, name)

    for name in names[:8]:  # connections up, code warm
        get(name)
    for kind in ("one after the other", f"{IN_FLIGHT} in flight"):
        walls, cpus = out.setdefault(f"{kind} wall", []), out.setdefault(f"{kind} cpu", [])
        for _ in range(REPEATS):
            cpu, wall = time.process_time(), time.perf_counter()
            if kind == "one after the other":
                for name in names:
                    get(name)
            else:
                list(pool.map(get, names))
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            time.sleep(0.02)  # paced, as the kubelet's calls are
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--dradriver-python", type=Path, default=Path(sys.executable))
    parser.add_argument("--baseline-python", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)  # the client's side
    opts = parser.parse_args()
    if opts.measure:
        kubeconfig, namespace, names = opts.measure
        print(json.dumps(measure(kubeconfig, namespace, names.split(","))))
        return
    if opts.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")
    drive(opts)


def drive(opts: argparse.Namespace) -> None:
    from bench import bench_vs_go as vs
    from tests.e2e.cluster import ControlPlane, node_ip

    installs = {"dradriver": opts.dradriver_python}
    if opts.baseline_python:
        installs["baseline"] = opts.baseline_python
    plugin = vs.Plugin("dradriver", "gpu.dradriver.dev", "dr", lambda *_: [])
    results: dict[str, dict[str, list[float]]] = {name: {} for name in installs}
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="claim-gets-", dir="/var/tmp") as work:
        plane = ControlPlane(opts.k8s_bin, Path(work), advertise_address=node_ip())
        try:
            plane.start()
            _, kubeconfigs, claims = vs.api_server_for(plane, [plugin])
            names = ",".join(ref.name for ref in claims["dr"][:BATCH])
            for _ in range(opts.rounds):
                for name, python in installs.items():
                    done = subprocess.run(
                        [str(python), "-m", "bench.bench_claim_gets", "--measure",
                         str(kubeconfigs["dr"]), vs.NAMESPACE, names],
                        cwd=repo, capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    for key, values in json.loads(done.stdout).items():
                        results[name].setdefault(key, []).extend(values)
        finally:
            plane.stop()
    print(f"{BATCH} GETs of a claim, medians of {opts.rounds} rounds x {REPEATS} batches (ms)")
    keys = list(next(iter(results.values())))
    print(f"| {'':32s} | " + " | ".join(f"{k:>28s}" for k in keys) + " |")
    for name, values in results.items():
        cells = " | ".join(f"{statistics.median(values[k]) * 1e3:28.1f}" for k in keys)
        print(f"| {name + ' (' + str(installs[name]) + ')':32.32s} | {cells} |")


if __name__ == "__main__":
    main()
