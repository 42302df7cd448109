"""What one `serve` start costs its node: CPU and memory from spawn until its slice is published,
for two or more builds taking turns against one real API server.

Run: .venv/bin/python -m bench.bench_start --k8s-bin DIR --build new=/venv-a/bin/dradriver \\
         --build old=/venv-b/bin/dradriver [--rounds 20]

Each build is a production install (its own venv, `pip install` of the wheel, as the image has
it). One etcd + kube-apiserver from `../shared/k8s` (bench.common.real_api_server), one Node
object; per round each build in turn: `serve` on 8 fake GPUs with its own directories and the
admin kubeconfig, spawned, the client polling the slices every 20 ms until its 8 devices are
published; then the process's CPU (user + system, /proc) and resident memory are read, it is
stopped and its slice deleted. The builds alternate, so load on the machine falls on each alike.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.bench_vs_go import dradriver_argv
from bench.common import cpu_seconds, labelled_path, percentile, real_api_server, rss_mb
from dradriver.kube import load_client

NODE = "bench-start"
DRIVER = "gpu.dradriver.dev"
DEVICES = 8
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class Build:
    label: str
    executable: Path
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)


def build_arg(value: str) -> Build:
    label, executable = labelled_path(value, "PATH to a dradriver executable")
    if not executable.is_file():
        raise argparse.ArgumentTypeError(f"{value!r}: {executable} is not a dradriver executable")
    return Build(label, executable)


def one_start(build: Build, root: Path, kubeconfig: Path, published: Callable[[], bool]) -> None:
    for directory in ("reg", "plugins", "cdi"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    argv = dradriver_argv(build.executable, NODE, DRIVER, root, kubeconfig, DEVICES)
    started = time.monotonic()
    with (root / "serve.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        while not published():
            if process.poll() is not None:
                raise RuntimeError(f"{build.label}: serve exited: {(root / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.02)
        build.wall.append(time.monotonic() - started)
        build.cpu.append(cpu_seconds(process.pid))
        build.rss_mb.append(rss_mb(process.pid))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def line(name: str, samples: list[float], unit: str, scale: float = 1.0) -> str:
    values = [s * scale for s in samples]
    return (
        f"  {name}: median {statistics.median(values):.2f} {unit}, p99 {percentile(values, 99):.2f}, "
        f"min {min(values):.2f} (n={len(values)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--build", type=build_arg, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if args.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")
    work = Path(tempfile.mkdtemp(prefix="bench-start-", dir="/var/tmp"))
    with real_api_server(args.k8s_bin) as kubeconfig:
        admin = load_client(str(kubeconfig))
        assert admin is not None
        admin.request(
            "POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        )

        def published() -> bool:
            items = admin.request("GET", SLICES)["items"]
            return bool(items) and len(items[0]["spec"].get("devices") or []) == DEVICES

        print(f"load average at the start: {os.getloadavg()}", flush=True)
        for i in range(args.rounds):
            for build in args.build if i % 2 == 0 else reversed(args.build):
                one_start(build, work / f"{build.label}-{i}", kubeconfig, published)
                admin.request("DELETE", SLICES)
                while admin.request("GET", SLICES)["items"]:
                    time.sleep(0.02)
    print(f"load average at the end: {os.getloadavg()}")
    for build in args.build:
        print(f"{build.label} ({build.executable}):")
        print(line("CPU, spawn -> slice published", build.cpu, "s"))
        print(line("wall, spawn -> slice published", build.wall, "s"))
        print(line("resident memory when published", build.rss_mb, "MB"))


if __name__ == "__main__":
    main()
