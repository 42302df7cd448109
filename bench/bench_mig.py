"""Issue 13 figures: prepare and unprepare of a claim whose MIG device is created on demand.

Run: .venv/bin/python -m bench.bench_mig [--rounds 300]

`dradriver serve --partitionable` runs on the C fake libnvidia-ml.so.1 (tests/fakenvml), serving
the a100-mig-empty node: GPU 0 is an A100 in MIG mode without MIG devices. Each prepare goes
through real gRPC, records the intent and the GPU instance in the checkpoint (fsync), creates the
GPU instance and the compute instance through pynvml and the fake, and writes the CDI spec; each
unprepare destroys them. Rounds alternate with prepares of a whole GPU (GPU 1, MIG off) on the same
daemon, so the cost of creating the MIG device is seen under the same load. The fake answers NVML
calls in microseconds: creating a MIG device on a real GPU takes NVML far longer (not measured
here), on top of these figures.
"""

from __future__ import annotations

import argparse
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
from dradriver.backend.select import open_backend
from dradriver.plugin.driver import ClaimRef
from tests.fakenvml.harness import CONFIG_ENV, build_library, config_text, write_proc
from tests.helpers import allocated_claim, uid

DRIVER = "gpu.dradriver.dev"
#: Placements that can all exist at once on the A100 (slices 0-3 and 4-7), one claim each, and
#: the whole GPU with MIG off.
PLACEMENTS = ("gpu-0-mig-3g40gb-4", "gpu-0-mig-4g40gb-0")
WHOLE_GPU = "gpu-1"


def start_serve(root: Path) -> subprocess.Popen[bytes]:
    inventory = open_backend("a100-mig-empty").discover()
    library = build_library(root / "lib")
    (root / "nvml.conf").write_text(config_text(inventory))
    write_proc(inventory, root / "proc")
    (root / "claims").mkdir()
    claims = [
        allocated_claim(f"c{i}", uid(i), [{"request": "mig", "device": device}], pool="bench")
        for i, device in enumerate((*PLACEMENTS, WHOLE_GPU))
    ]
    (root / "claims" / "claims.yaml").write_text(yaml.safe_dump_all(claims))
    args = [
        sys.executable, "-m", "dradriver", "serve", "--partitionable", "--node-name", "bench",
        "--proc-root", str(root / "proc"), "--claims-dir", str(root / "claims"),
        "--kubelet-registry-dir", str(root / "reg"), "--kubelet-plugins-dir", str(root / "plugins"),
        "--cdi-dir", str(root / "cdi"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("DRADRIVER_")}
    env |= {
        "LD_LIBRARY_PATH": str(library.parent),
        CONFIG_ENV: str(root / "nvml.conf"),
        "FAKE_NVML_STATE": str(root / "mig-state"),
    }
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while not (root / "reg" / f"{DRIVER}-reg.sock").exists():
        time.sleep(0.01)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    opts = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    proc = start_serve(root)
    refs = [ClaimRef("default", f"c{i}", uid(i)) for i in range(len(PLACEMENTS))]
    whole = ClaimRef("default", f"c{len(PLACEMENTS)}", uid(len(PLACEMENTS)))
    try:
        with kubeletclient.DRAClient(root / "plugins" / DRIVER / "dra.sock") as client:
            client.wait_ready(30)
            for r in refs * 10:  # warm-up: driver initialised, NVML opened, files cached
                assert client.prepare([r]).claims[r.uid].error == ""
                client.unprepare([r])
            timings: dict[str, list[float]] = {"mig": [], "mig-un": [], "gpu": [], "gpu-un": []}
            for n in range(opts.rounds):
                for r, kind in ((refs[n % len(refs)], "mig"), (whole, "gpu")):
                    t = time.perf_counter()
                    response = client.prepare([r])
                    timings[kind].append(time.perf_counter() - t)
                    assert response.claims[r.uid].error == "", response
                    t = time.perf_counter()
                    assert client.unprepare([r]).claims[r.uid].error == ""
                    timings[f"{kind}-un"].append(time.perf_counter() - t)
            print(summary("prepare, 1 claim creating 1 MIG device (C fake NVML)", timings["mig"]))
            print(summary("unprepare, 1 claim destroying its MIG device", timings["mig-un"]))
            print(summary("prepare, 1 claim with a whole GPU, same daemon (baseline)", timings["gpu"]))
            print(summary("unprepare, whole GPU (baseline)", timings["gpu-un"]))
            pairs = []
            for _ in range(opts.rounds // 4):
                t = time.perf_counter()
                response = client.prepare(refs)
                pairs.append(time.perf_counter() - t)
                assert all(entry.error == "" for entry in response.claims.values()), response
                client.unprepare(refs)
            print(summary("prepare, 2 claims in one call, 3g.40gb + 4g.40gb on one GPU", pairs))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
