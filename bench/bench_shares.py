"""Issue 29 figures: a share's prepare against a whole GPU's, and 16 shares in random order.

Run: .venv/bin/python -m bench.bench_shares [--k8s-bin DIR] [--rounds 200]

One real etcd + kube-apiserver (bench.common.real_api_server, $DRADRIVER_E2E_BIN); `serve` on a
profile of 16 fake H100s with `--gpu-shares mps:0` (GPU 0 shared, the others whole), its claims
fetched from the API server (the admin's kubeconfig), driven over its DRA socket as the kubelet
does, one claim per call. The MPS daemon is the stand-in (`dradriver.backend.fake.mps_standin`), a
real process started and stopped as on a node.

- whole: prepare (p50, p99) of a claim for gpu-1, unprepared after each;
- share: prepare of a 20Gi share of gpu-0 while another share keeps the GPU's daemon running;
- first share: prepare of the GPU's only share (it starts the daemon), and its unprepare (it
  stops the daemon);
- 16 shares of gpu-0 prepared and unprepared in random order, --cycles times: every share
  prepared, one daemon (the same pid) throughout each cycle, the daemon gone after the last
  unprepare, and no file left under the state directory's shares/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_vs_go import NODE, allocated_claim, node_and_namespace
from bench.common import real_api_server, summary
from dradriver import kubeletclient
from dradriver.backend.fake.mps_standin import STATE_FILE
from dradriver.kube import KubeClient
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.gpu_share_daemons import SHARES_DIRECTORY
from tests.helpers import process_alive, write_gpu_profile

DRIVER = "gpu.dradriver.dev"
GPUS = 16
SHARE = {"memory": "20Gi", "computePercent": "25"}
SMALL_SHARE = {"memory": "4Gi", "computePercent": "6"}


def create_claim(admin: KubeClient, name: str, device: str, share: dict[str, str] | None) -> ClaimRef:
    """A ResourceClaim allocated as the scheduler would: the device, or a share of it."""
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if share is not None:
        exactly["capacity"] = {"requests": share}
        result["consumedCapacity"] = share
    return allocated_claim(admin, name, exactly, result, share=share is not None)


def timed(call: Any, ref: ClaimRef) -> float:
    started = time.perf_counter()
    response = call([ref])
    elapsed = time.perf_counter() - started
    error = response.claims[ref.uid].error
    assert not error, error
    return elapsed


def daemon_pids(state: Path) -> set[int]:
    """The pids of the stand-in daemons running under the state directory's shares/."""
    return {json.loads(p.read_text())["pid"] for p in (state / SHARES_DIRECTORY).rglob(STATE_FILE)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--first-rounds", type=int, default=30)
    parser.add_argument("--cycles", type=int, default=5)
    opts = parser.parse_args()
    if opts.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")
    root = Path(tempfile.mkdtemp(prefix="bench-shares-", dir="/tmp"))
    try:
        with real_api_server(opts.k8s_bin) as kubeconfig:
            admin = node_and_namespace(kubeconfig)
            run(admin, kubeconfig, root, opts)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(admin: KubeClient, kubeconfig: Path, root: Path, opts: argparse.Namespace) -> None:
    whole = create_claim(admin, "whole", "gpu-1", None)
    keeper = create_claim(admin, "keeper", "gpu-0", SMALL_SHARE)
    share = create_claim(admin, "share", "gpu-0", SHARE)
    sixteen = [create_claim(admin, f"s{i}", "gpu-0", SMALL_SHARE) for i in range(16)]
    for directory in ("reg", "plugins"):
        (root / directory).mkdir()
    state = root / "plugins" / DRIVER
    profile = write_gpu_profile(root / "profile.yaml", GPUS)
    argv = [
        sys.executable, "-m", "dradriver", "serve", "--fake-gpus", str(profile), "--node-name", NODE,
        "--kubelet-registry-dir", str(root / "reg"), "--kubelet-plugins-dir", str(root / "plugins"),
        "--cdi-dir", str(root / "cdi"), "--kubeconfig", str(kubeconfig), "--gpu-shares", "mps:0",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    with (root / "serve.log").open("wb") as log:
        serve = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        with kubeletclient.DRAClient(state / "dra.sock") as client:
            client.wait_ready(60)
            timed(client.prepare, whole)  # the driver is built, the first GET made
            timed(client.unprepare, whole)
            first, first_down = [], []
            for _ in range(opts.first_rounds):
                first.append(timed(client.prepare, share))
                first_down.append(timed(client.unprepare, share))
            timed(client.prepare, keeper)
            whole_up, share_up = [], []
            for _ in range(opts.rounds):
                whole_up.append(timed(client.prepare, whole))
                timed(client.unprepare, whole)
                share_up.append(timed(client.prepare, share))
                timed(client.unprepare, share)
            timed(client.unprepare, keeper)
            assert daemon_pids(state) == set()
            print(summary("whole GPU prepare", whole_up))
            print(summary("share prepare (daemon running)", share_up))
            print(summary("first share prepare (daemon start)", first))
            print(summary("last share unprepare (daemon stop)", first_down))
            print(f"share/whole p50: {statistics.median(share_up) / statistics.median(whole_up):.2f}")
            rng = random.Random(29)
            for cycle in range(opts.cycles):
                order = sixteen[:]
                rng.shuffle(order)
                pids: set[int] = set()
                for ref in order:
                    timed(client.prepare, ref)
                    pids |= daemon_pids(state)
                rng.shuffle(order)
                for ref in order:
                    timed(client.unprepare, ref)
                left = sorted(
                    str(p.relative_to(state)) for p in (state / SHARES_DIRECTORY).rglob("*") if p.is_file()
                )
                assert len(pids) == 1, f"cycle {cycle}: daemons {pids}"
                assert not any(process_alive(p) for p in pids), f"cycle {cycle}: daemon still running"
                assert left == [], f"cycle {cycle}: left {left}"
                pid = pids.pop()
                print(
                    f"16 shares, cycle {cycle + 1}: all prepared, 1 daemon (pid {pid}), stopped, 0 files left"
                )
    finally:
        serve.terminate()
        serve.wait(30)


if __name__ == "__main__":
    main()
