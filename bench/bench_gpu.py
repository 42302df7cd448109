"""Figures on a real NVIDIA GPU (no fake anywhere): NVML discovery, and prepare/unprepare of a
whole-GPU claim and of an MPS claim through `serve` over gRPC on its unix socket.

Run on a GPU node: .venv/bin/python -m bench.bench_gpu --driver-root / [--rounds 200]
The claims come from a claim directory (no API server): what is timed is the plugin's own work,
the CDI spec and checkpoint writes with fsync included, and for MPS the host driver's
nvidia-cuda-mps-control starting and stopping a control daemon per claim.

With `--baseline-src LABEL=DIR` (an earlier build's src/: `git archive REV src | tar -x -C DIR/..`;
repeatable) that build's `serve` prepares the same whole GPU beside this one's, all taking turns
call by call, so each sees the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from bench.common import labelled_path, summary
from dradriver import kubeletclient
from dradriver.backend.select import open_backend
from dradriver.plugin.driver import ClaimRef

DRIVER = "gpu.dradriver.dev"
MPS = {
    "apiVersion": f"{DRIVER}/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}},
}


def claim(number: int, device: str, mps: bool) -> dict[str, object]:
    config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": MPS}}] if mps else []
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": "bench",
            "name": f"c{number}",
            "uid": f"00000000-0000-4000-8000-{number:012d}",
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": DRIVER, "pool": "bench", "device": device}],
                    "config": config,
                }
            }
        },
    }


def ref(number: int) -> ClaimRef:
    return ClaimRef("bench", f"c{number}", f"00000000-0000-4000-8000-{number:012d}")


def cycles(plugins: dict[str, kubeletclient.DRAClient], number: int, rounds: int, what: str) -> None:
    """`rounds` prepare/unprepare cycles of claim `number` on each plugin, taking turns."""
    prepares: dict[str, list[float]] = {name: [] for name in plugins}
    unprepares: dict[str, list[float]] = {name: [] for name in plugins}
    for _ in range(rounds):
        for name, client in plugins.items():
            started = time.perf_counter()
            response = client.prepare([ref(number)]).claims[ref(number).uid]
            prepares[name].append(time.perf_counter() - started)
            if response.error:
                raise SystemExit(f"prepare of the {what} claim failed on {name}: {response.error}")
            started = time.perf_counter()
            assert client.unprepare([ref(number)]).claims[ref(number).uid].error == ""
            unprepares[name].append(time.perf_counter() - started)
    for name in plugins:
        print(summary(f"prepare, {what} ({name})", prepares[name]))
        print(summary(f"unprepare, {what} ({name})", unprepares[name]))


@contextlib.contextmanager
def serving(
    root: Path, driver_root: Path, claims: list[dict[str, object]], src: Path | None
) -> Iterator[kubeletclient.DRAClient]:
    """`serve` (of the tree `src`, else this one) on the real GPU, its claims from a directory."""
    (root / "claims").mkdir(parents=True)
    (root / "claims" / "claims.yaml").write_text(yaml.safe_dump_all(claims))
    env = os.environ.copy()
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    serve = subprocess.Popen(
        [
            sys.executable, "-m", "dradriver", "serve", "--driver-root", str(driver_root),
            "--node-name", "bench", "--claims-dir", str(root / "claims"), "--cdi-dir", str(root / "cdi"),
            "--kubelet-registry-dir", str(root / "reg"), "--kubelet-plugins-dir", str(root / "plugins"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(root / "serve.log").open("w"),
        env=env,
    )  # fmt: skip
    try:
        with kubeletclient.DRAClient(root / "plugins" / DRIVER / "dra.sock") as client:
            client.wait_ready(60)
            yield client
    finally:
        serve.terminate()
        serve.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver-root", type=Path, default=Path("/"))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--mps-rounds", type=int, default=20)
    parser.add_argument("--discover-runs", type=int, default=30)
    parser.add_argument(
        "--baseline-src",
        type=lambda value: labelled_path(value, "DIR (an earlier build's src/)"),
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="an earlier build's src/, prepared beside this one (repeatable)",
    )
    args = parser.parse_args()

    samples = []
    for _ in range(args.discover_runs):
        started = time.perf_counter()
        library = open_backend(None, driver_root=args.driver_root)
        inventory = library.discover()
        library.close()
        samples.append(time.perf_counter() - started)
    print(summary(f"NVML discovery in process ({len(inventory.gpus)} GPUs)", samples))
    samples = []
    for _ in range(max(3, args.discover_runs // 3)):
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dradriver",
                "discover",
                "--driver-root",
                str(args.driver_root),
                "-o",
                "json",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        samples.append(time.perf_counter() - started)
    print(summary("`dradriver discover -o json`, whole command", samples))

    device = f"gpu-{inventory.gpus[0].minor}"
    whole = f"whole {inventory.gpus[0].product_name}"
    with tempfile.TemporaryDirectory(prefix="bench-gpu-", dir="/tmp") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        claims = [claim(1, device, mps=False), claim(2, device, mps=True)]
        plugins = {"this build": stack.enter_context(serving(root / "new", args.driver_root, claims, None))}
        for label, src in args.baseline_src:
            plugins[label] = stack.enter_context(serving(root / label, args.driver_root, claims[:1], src))
        cycles(plugins, 1, 3, "warm-up")
        cycles(plugins, 1, args.rounds, whole)
        cycles(
            {"this build": plugins["this build"]},
            2,
            args.mps_rounds,
            "MPS share (a control daemon per claim)",
        )


if __name__ == "__main__":
    main()
