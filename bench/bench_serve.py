"""Figures of `serve` itself: start to GetInfo answered, GetInfo round trip, idle RSS (issue 2),
and first ResourceSlice publish after the registration socket is up (issue 4).

Run: .venv/bin/python -m bench.bench_serve [--starts 20] [--calls 2000] [--publish-runs 20]

The publish figure uses the loopback fake API server of the test suite (tests/publish/kubefake.py):
no real kube-apiserver can be run on this machine; it answers in about a millisecond, so the
figure is serve's own cost (discovery, Kubernetes client load, node lookup, list, create).
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

import grpc

from bench.common import rss_mb, summary
from dradriver import kubeletclient
from dradriver.kubeletapi.pluginregistration import api_pb2 as reg_pb
from dradriver.kubeletapi.pluginregistration import api_pb2_grpc as reg_grpc

DRIVER = "gpu.dradriver.dev"


def first_publish_after_socket(runs: int) -> list[float]:
    from tests.publish.kubefake import FakeApiServer

    samples = []
    for _ in range(runs):
        fake = FakeApiServer().start()
        root = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
        kubeconfig = fake.write_kubeconfig(root / "kubeconfig")
        fake.create("nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench"}})
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        command = [*serve_command(root), "--kubeconfig", str(kubeconfig)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        socket_path = root / "reg" / f"{DRIVER}-reg.sock"
        while not socket_path.exists():
            time.sleep(0.001)
        up = time.perf_counter()
        while not fake.objects("resourceslices"):
            time.sleep(0.001)
        samples.append(time.perf_counter() - up)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        fake.stop()
        shutil.rmtree(root)
    return samples


def serve_command(root: Path) -> list[str]:
    script = Path(sys.executable).with_name("dradriver")
    prefix = [str(script)] if script.exists() else [sys.executable, "-m", "dradriver"]
    return [
        *prefix, "serve", "--fake-gpus", "dgx-h100", "--node-name", "bench",
        "--kubelet-registry-dir", str(root / "reg"), "--kubelet-plugins-dir", str(root / "plugins"),
        "--cdi-dir", str(root / "cdi"),
    ]  # fmt: skip


def start_to_get_info(root: Path) -> tuple[float, subprocess.Popen[bytes]]:
    """Seconds from spawning serve to the first GetInfo answer on the registration socket."""
    socket_path = root / "reg" / f"{DRIVER}-reg.sock"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        serve_command(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    while True:
        if socket_path.exists():
            try:
                with grpc.insecure_channel(f"unix://{socket_path}") as channel:
                    reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=1)
                return time.perf_counter() - started, proc
            except grpc.RpcError:
                pass
        time.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--publish-runs", type=int, default=20)
    opts = parser.parse_args()

    starts: list[float] = []
    for _ in range(opts.starts):
        root = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
        elapsed, proc = start_to_get_info(root)
        starts.append(elapsed)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(root)
    print(summary("serve start -> GetInfo answered", starts))

    root = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    _, proc = start_to_get_info(root)
    try:
        socket_path = root / "reg" / f"{DRIVER}-reg.sock"
        kubeletclient.register(socket_path)
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            for _ in range(100):  # warm-up
                stub.GetInfo(reg_pb.InfoRequest())
            samples = []
            for _ in range(opts.calls):
                t = time.perf_counter()
                stub.GetInfo(reg_pb.InfoRequest())
                samples.append(time.perf_counter() - t)
        print(summary("GetInfo round trip", samples))
        time.sleep(5)
        print(f"idle serve RSS after registration: {rss_mb(proc.pid):.1f} MB")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(root)
    print(
        summary(
            "first publish after the registration socket is up (fake API server)",
            first_publish_after_socket(opts.publish_runs),
        )
    )


if __name__ == "__main__":
    main()
