"""Issue 5 figures: prepare/unprepare latency over real gRPC to a `serve` subprocess; issue 12:
one NodePrepareResources call carrying 1,000 or 3,000 claims.

Run: .venv/bin/python -m bench.bench_prepare [--rounds 300] [--api]
     .venv/bin/python -m bench.bench_prepare --one-call 1000,3000 [--runs 7]

The plugin runs on a fake profile with 128 GPUs; every claim gets its own GPU, a CDI spec and
a checkpoint write with fsync. Claims come from a directory (the local claim source), or with
--api from the test suite's loopback fake API server (tests/publish/kubefake.py) — a fake's
figures are not the product's: bench/bench_vs_go.py measures prepare against a real
kube-apiserver, side by side with the Go reference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import summary
from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import write_gpu_profile

DRIVER = "gpu.dradriver.dev"
GPUS = 128


def claim(i: int, shared: bool = False) -> dict[str, object]:
    """Claim i on GPU i; `shared`: on GPU i % 128 with its own share (consumable capacity), so
    any number of claims fit on the node."""
    result: dict[str, object] = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "bench",
        "device": f"gpu-{i % GPUS}",
    }
    if shared:
        result["shareID"] = f"00000000-0000-4000-9000-{i:012d}"
        result["consumedCapacity"] = {"memory": "1Gi", "computePercent": "1"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "bench", "name": f"c{i}", "uid": f"00000000-0000-4000-8000-{i:012d}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


#: Claim UIDs by number: ours for the local source, the API server's own when it created them.
UIDS = {i: f"00000000-0000-4000-8000-{i:012d}" for i in range(GPUS)}


def ref(i: int) -> ClaimRef:
    return ClaimRef("bench", f"c{i}", UIDS.get(i) or f"00000000-0000-4000-8000-{i:012d}")


def start_serve(
    root: Path, kubeconfig: Path | None = None, claims: int = GPUS, cdi_dir: Path | None = None
) -> subprocess.Popen[bytes]:
    profile = write_gpu_profile(root / "profile.yaml", GPUS)
    args = [
        sys.executable, "-m", "dradriver", "serve", "--fake-gpus", str(profile), "--node-name", "bench",
        "--kubelet-registry-dir", str(root / "reg"), "--kubelet-plugins-dir", str(root / "plugins"),
        "--cdi-dir", str(cdi_dir or root / "cdi"),
    ]  # fmt: skip
    if kubeconfig is None:
        (root / "claims").mkdir()
        if claims <= GPUS:
            (root / "claims" / "claims.yaml").write_text(yaml.safe_dump_all([claim(i) for i in range(GPUS)]))
        else:  # JSON: a 3,000-claim YAML file would be over the loader's node limit
            items = [claim(i, shared=True) for i in range(claims)]
            (root / "claims" / "claims.json").write_text(json.dumps({"kind": "List", "items": items}))
            args += ["--gpu-shares", "unenforced"]  # shares counted, no MPS daemon per GPU
        args += ["--claims-dir", str(root / "claims")]
    else:
        args += ["--kubeconfig", str(kubeconfig)]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while not (root / "reg" / f"{DRIVER}-reg.sock").exists():
        time.sleep(0.01)
    return proc


def one_call(sizes: list[int], runs: int, cdi_base: str) -> None:
    """Issue 12: NodePrepareResources with N claims in one call (and the unprepare of them).
    The state directory (checkpoint) is on /tmp; the CDI directory under `cdi_base`."""
    root = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    cdi = Path(tempfile.mkdtemp(prefix="bench-cdi-", dir=cdi_base))
    proc = start_serve(root, claims=max(sizes), cdi_dir=cdi)
    try:
        with kubeletclient.DRAClient(root / "plugins" / DRIVER / "dra.sock") as client:
            client.wait_ready(30)
            assert client.prepare([ref(0)]).claims[ref(0).uid].error == ""  # driver built, file read
            client.unprepare([ref(0)])
            for size in sizes:
                refs = [ref(i) for i in range(size)]
                prepares, unprepares = [], []
                for _ in range(runs):
                    t = time.perf_counter()
                    response = client.prepare(refs, timeout=600)
                    prepares.append(time.perf_counter() - t)
                    assert all(e.error == "" for e in response.claims.values()), response
                    assert len(list(cdi.glob("*.json"))) == size
                    t = time.perf_counter()
                    response = client.unprepare(refs, timeout=600)
                    unprepares.append(time.perf_counter() - t)
                    assert all(e.error == "" for e in response.claims.values())
                print(summary(f"prepare {size} claims in one call", prepares, unit="s"))
                print(summary(f"unprepare {size} claims in one call", unprepares, unit="s"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(root)
        shutil.rmtree(cdi)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--api", action="store_true", help="claims from the loopback fake API server")
    parser.add_argument("--one-call", metavar="N,N", help="time one call with N claims instead")
    parser.add_argument("--runs", type=int, default=7, help="with --one-call: calls per size")
    parser.add_argument(
        "--cdi-base",
        default="/tmp",
        help="with --one-call: where the CDI directory is made (/dev/shm: tmpfs, as /var/run/cdi on nodes)",
    )
    opts = parser.parse_args()
    if opts.one_call:
        one_call([int(n) for n in opts.one_call.split(",")], opts.runs, opts.cdi_base)
        return
    root = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    fake = None
    kubeconfig = None
    if opts.api:
        from tests.publish.kubefake import FakeApiServer

        fake = FakeApiServer().start()
        kubeconfig = fake.write_kubeconfig(root / "kubeconfig")
        fake.create("nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench"}})
        for i in range(GPUS):
            UIDS[i] = fake.create("resourceclaims", "bench", claim(i))["metadata"]["uid"]
    source = "API server (fake)" if opts.api else "local claim source"
    proc = start_serve(root, kubeconfig)
    try:
        with kubeletclient.DRAClient(root / "plugins" / DRIVER / "dra.sock") as client:
            client.wait_ready(30)
            for i in range(20):  # warm-up: driver initialised, files cached
                assert client.prepare([ref(i)]).claims[ref(i).uid].error == ""
                client.unprepare([ref(i)])
            prepares, unprepares = [], []
            for n in range(opts.rounds):
                r = ref(n % GPUS)
                t = time.perf_counter()
                response = client.prepare([r])
                prepares.append(time.perf_counter() - t)
                assert response.claims[r.uid].error == "", response
                t = time.perf_counter()
                client.unprepare([r])
                unprepares.append(time.perf_counter() - t)
            print(summary(f"prepare, 1 claim / 1 GPU, {source}", prepares))
            print(summary("unprepare, 1 claim", unprepares))

            batches = []
            for _ in range(5):
                t = time.perf_counter()
                for i in range(100):
                    assert client.prepare([ref(i)]).claims[ref(i).uid].error == ""
                batches.append(time.perf_counter() - t)
                client.unprepare([ref(i) for i in range(100)])
            print(summary("100 claims by 100 back-to-back calls", batches, unit="s"))

            singles = []
            for _ in range(5):
                refs = [ref(i) for i in range(64)]
                t = time.perf_counter()
                response = client.prepare(refs)
                singles.append(time.perf_counter() - t)
                assert all(entry.error == "" for entry in response.claims.values())
                client.unprepare(refs)
            print(summary("64 claims in one call", singles))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        if fake is not None:
            fake.stop()
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
