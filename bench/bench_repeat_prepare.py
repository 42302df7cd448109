"""Issue 28: what verifying the specs costs a repeated prepare.

Run (repository root, after `make .venv/.installed`):

    .venv/bin/python -m bench.bench_repeat_prepare --k8s-bin DIR [--runs 15]

`--k8s-bin` is a directory with etcd and kube-apiserver (default $DRADRIVER_E2E_BIN; `make e2e`
unpacks ../shared/k8s there): one real kube-apiserver (tests/e2e/cluster.py `ControlPlane`) holds
64 allocated ResourceClaims, and `dradriver serve` (fake GPUs, 128 devices; checkpoint on disk
under its plugins directory, CDI specs on a tmpfs like /var/run/cdi) fetches each claim from it,
driven over its DRA socket by the kubelet's side of the protocol (dradriver.kubeletclient).

Each run times, for the same 64 claims in one NodePrepareResources call:
- first: nothing prepared (plan, specs written, one checkpoint write);
- repeated: all prepared (each spec read and compared with the recorded one, nothing written);
- repeated after every spec was deleted: all 64 rewritten;
then unprepares them. Figures are medians over runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from bench.bench_vs_go import (
    PREPARE_DEVICES,
    create_claims,
    dradriver_plugin,
    get_info_answered,
    launch,
    node_and_namespace,
    prepared,
)
from bench.common import real_api_server, summary
from dradriver import kubeletclient

CLAIMS = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--dradriver", type=Path, default=Path(shutil.which("dradriver") or "dradriver"))
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--cdi-on-disk", action="store_true", help="CDI specs on disk instead of a tmpfs")
    opts = parser.parse_args()
    if opts.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")
    load_before = os.getloadavg()
    with real_api_server(opts.k8s_bin) as kubeconfig:
        admin = node_and_namespace(kubeconfig)
        plugin = dradriver_plugin(opts.dradriver)
        refs = create_claims(admin, plugin, CLAIMS)
        first: list[float] = []
        repeated: list[float] = []
        rewritten: list[float] = []
        with launch(plugin, kubeconfig, PREPARE_DEVICES, opts) as running:
            get_info_answered(running)
            kubeletclient.register(running.registration)
            with kubeletclient.DRAClient(running.dra) as client:
                client.wait_ready(30)
                for ref in refs[:8]:  # warm-up: driver initialised, connection open
                    prepared(client.prepare([ref]), [ref])
                    client.unprepare([ref])
                cdi = running.root / "cdi"
                for _ in range(opts.runs):
                    for samples in (first, repeated):
                        started = time.perf_counter()
                        response = client.prepare(refs)
                        samples.append(time.perf_counter() - started)
                        prepared(response, refs)
                    specs = sorted(cdi.glob("*.json"))
                    assert len(specs) == CLAIMS, specs
                    for spec in specs:
                        spec.unlink()
                    started = time.perf_counter()
                    response = client.prepare(refs)
                    rewritten.append(time.perf_counter() - started)
                    prepared(response, refs)
                    assert len(list(cdi.glob("*.json"))) == CLAIMS
                    client.unprepare(refs)
    load_after = os.getloadavg()
    print(summary(f"first prepare, {CLAIMS} claims in one call", first))
    print(summary(f"repeated prepare, {CLAIMS} prepared claims, specs verified", repeated))
    print(summary(f"repeated prepare, {CLAIMS} specs deleted and rewritten", rewritten))
    print(f"repeated / first (medians): {statistics.median(repeated) / statistics.median(first):.2f}")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")


if __name__ == "__main__":
    main()
