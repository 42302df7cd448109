"""Issue 24: prepare of a whole GPU with the CDI edits that reach every image, beside the same
prepare as it was before them, on one real kube-apiserver.

Run (repository root, after `make .venv/.installed`):

    git archive dee7242 src | tar -x -C /tmp/baseline
    .venv/bin/python -m bench.bench_cuda_edits --k8s-bin DIR --baseline-src /tmp/baseline/src

Both plugins run `serve` on NVML (the C fake libnvidia-ml of tests/fakenvml, 128 GPUs), with a
driver root laid out as the NVIDIA installer leaves one: every compute library of
`dradriver.prepare.hostdriver` under its versioned name with its SONAME link, nvidia-smi and
nvidia-debugdump. So each spec carries the mounts of the host driver's files, and the new build
also checks (and the first time makes) the host's device nodes; the baseline is the source tree
given (an earlier commit), on the same interpreter. The claims, the API server, the client and
the pacing are bench/bench_vs_go.py's (its prepare phase, reused as is).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.bench_vs_go import (
    NODE,
    PREPARE_DEVICES,
    Figures,
    Plugin,
    alternate,
    api_server_for,
    prepare_phase,
)
from dradriver.backend.select import open_backend
from dradriver.prepare.hostdriver import BINARIES, COMPUTE_LIBRARIES
from tests.e2e.cluster import ControlPlane, node_ip
from tests.fakenvml import cuda
from tests.fakenvml.harness import build_library, config_text, write_proc
from tests.helpers import write_gpu_profile

LIB_DIR = "usr/lib/x86_64-linux-gnu"


def driver_root(root: Path) -> tuple[Path, Path]:
    """A host driver tree serving PREPARE_DEVICES fake GPUs, and its /proc files."""
    inventory = open_backend(str(write_gpu_profile(root / "profile.yaml", PREPARE_DEVICES))).discover()
    version = inventory.driver_version
    libs = root / "driver" / LIB_DIR
    libs.mkdir(parents=True)
    nvml = build_library(root / "build", max_gpus=128)
    fakes = cuda.build(root / "build" / "cuda")
    for library in COMPUTE_LIBRARIES:
        source = nvml if library == "libnvidia-ml" else fakes.libcuda
        shutil.copy(source, libs / f"{library}.so.{version}")
        (libs / f"{library}.so.1").symlink_to(f"{library}.so.{version}")
    (libs / "fake-nvml.conf").write_text(config_text(inventory))
    (root / "driver/usr/bin").mkdir(parents=True)
    for binary in BINARIES:
        shutil.copy(fakes.nvidia_smi, root / "driver/usr/bin" / binary)
    write_proc(inventory, root / "proc")
    return root / "driver", root / "proc"


def plugin(label: str, driver: str, prefix: str, command: list[str], extra: list[str]) -> Plugin:
    def argv(root: Path, kubeconfig: Path, _devices: int) -> list[str]:
        return [
            *command, "serve", "--node-name", NODE, "--driver-name", driver,
            "--kubelet-registry-dir", str(root / "reg"), "--kubelet-plugins-dir", str(root / "plugins"),
            "--cdi-dir", str(root / "cdi"), "--kubeconfig", str(kubeconfig), *extra,
        ]  # fmt: skip

    return Plugin(label, driver, prefix, argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--baseline-src", type=Path, required=True, help="an earlier build's src/ directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paced", type=int, default=300, help="paced prepare/unprepare pairs per round")
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each batch figure per round")
    opts = parser.parse_args()
    opts.cdi_on_disk = False
    if opts.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")

    work = Path(tempfile.mkdtemp(prefix="bench-cuda-edits-", dir="/var/tmp"))
    plane = ControlPlane(opts.k8s_bin, work / "plane", advertise_address=node_ip())
    try:
        root, proc = driver_root(work)
        common = ["--driver-root", str(root), "--proc-root", str(proc)]
        (work / "host-dev").mkdir()
        baseline_python = ["env", f"PYTHONPATH={opts.baseline_src}", sys.executable, "-m", "dradriver"]
        plugins = [
            plugin("today (baseline)", "gpu-baseline.dradriver.dev", "base", baseline_python, common),
            plugin(
                "every image (this build)",
                "gpu.dradriver.dev",
                "new",
                [sys.executable, "-m", "dradriver"],
                [*common, "--host-dev", str(work / "host-dev")],
            ),
        ]
        plane.start()
        _, kubeconfigs, claims = api_server_for(plane, plugins)
        results: dict[str, list[Figures]] = {p.prefix: [] for p in plugins}
        for n in range(opts.rounds):
            load = os.getloadavg()[0]
            figures = {p.prefix: Figures() for p in plugins}
            prepare_phase(alternate(plugins, n), kubeconfigs, claims, opts, figures)
            for p in plugins:
                results[p.prefix].append(figures[p.prefix])
                values = ", ".join(f"{k}={v * 1e3:.3f}ms" for k, v in figures[p.prefix].values.items())
                print(
                    f"round {n + 1} (load {load:.2f}→{os.getloadavg()[0]:.2f}) {p.label}: {values}",
                    flush=True,
                )
        print()
        for key in ("prepare_p50", "prepare_p99", "unprepare_p50", "back_to_back_100", "one_call_64"):
            cells = []
            for p in plugins:
                rounds = [f.values[key] * 1e3 for f in results[p.prefix]]
                cells.append(
                    f"{p.label} {statistics.median(rounds):.3f} ms ({min(rounds):.3f} to {max(rounds):.3f})"
                )
            print(f"{key}: " + " | ".join(cells))
    finally:
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
