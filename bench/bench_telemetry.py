"""Issue 26 figures: what the device telemetry costs a node.

Run: .venv/bin/python -m bench.bench_telemetry [--nvml] [--scrapes 1000] [--idle 60] [--paced 300]

- Scrape: `serve` on a DGX A100 with MIG (8 GPUs: 2 whole, 26 MIG devices) holding 16 prepared
  claims (2 whole GPUs, 14 MIG devices), each reserved for 2 pods, with processes on every device
  (mapped to those pods through cgroup files under --proc-root): the latency of GET /metrics,
  `--scrapes` times, and the number of series.
- Render: the same reading rendered to the text format in this process, as the sampler thread
  renders each reading once (a scrape only appends the bytes), `--scrapes` times.
- CPU: the same serve and one with --telemetry-interval 0 side by side for `--idle` seconds, each
  scraped every 15 s: CPU of each, and the difference, in % of a core.
- Prepare: two serves on 128 fake GPUs, telemetry on (5 s) and off, claims from files, paced
  single-claim prepare/unprepare pairs alternating between them: p50/p99 of each.

`--nvml` reads the devices through the real NVML code path (pynvml) from the C fake NVML
(tests/fakenvml, built here; figures from its FAKE_NVML_TELEMETRY file) instead of the fake
backend. Everything is real processes, sockets and files; no API server (claims from files).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from bench.common import cpu_seconds, percentile
from dradriver import kubeletclient
from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.plugin.driver import ClaimRef
from tests.fakenvml.harness import CONFIG_ENV, build_library, config_text, write_proc
from tests.helpers import ServeProcess, free_port, short_tmpdir, write_gpu_profile

DRIVER = "gpu.dradriver.dev"
PROFILE = "dgx-a100-mig"
SCRAPE_EVERY = 15.0


def pod_uid(claim: int, pod: int) -> str:
    return f"0f3a5a54-5d9c-4d3e-9b1a-{claim:06d}{pod:06d}"


def claim_file(
    name: str, claim_uid: str, device: str, pods: list[tuple[str, str]], pool: str
) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "bench", "name": name, "uid": claim_uid},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}
            },
            "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods],
        },
    }


def scrape(port: int) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
    return time.perf_counter() - started, body


@contextlib.contextmanager
def telemetry_node(
    root: Path, nvml: bool, interval: str
) -> Iterator[tuple[ServeProcess, int, list[ClaimRef]]]:
    """serve on the MIG profile with 16 claims prepared, their pods' processes on every device."""
    inventory = open_backend(PROFILE).discover()
    devices = [
        d
        for d in build_devices(inventory, driver_name=DRIVER).devices
        if d.json["attributes"]["type"]["string"] in ("gpu", "mig")
    ]
    held = [d.name for d in devices if d.name in ("gpu-6", "gpu-7")] + [
        d.name for d in devices if "-mig-" in d.name
    ][:14]
    proc = root / "proc"
    env: dict[str, str] = {}
    args = ["--proc-root", str(proc), "--telemetry-interval", interval]
    if nvml:
        write_proc(inventory, proc)
        lib_dir = root / "lib"
        build_library(lib_dir, telemetry=True)
        (root / "nvml.conf").write_text(config_text(inventory))
        (root / "driver-root").mkdir()
        env = {
            "LD_LIBRARY_PATH": str(lib_dir),
            CONFIG_ENV: str(root / "nvml.conf"),
            "FAKE_NVML_TELEMETRY": str(root / "telemetry"),
        }
        args += ["--driver-root", str(root / "driver-root")]
    port = free_port()
    serve = ServeProcess(
        root, [*args, "--metrics-address", f"127.0.0.1:{port}"], env, fake_gpus=None if nvml else PROFILE
    )
    refs = []
    pid = 1000
    lines: list[str] = []
    figures: dict[str, object] = {}
    for number, device in enumerate(held):
        pods = [(f"pod-{number}-{p}", pod_uid(number, p)) for p in range(2)]
        uid = f"00000000-0000-4000-8000-{number:012d}"
        (serve.claims_dir / f"c{number}.json").write_text(
            json.dumps(claim_file(f"c{number}", uid, device, pods, "node-1"))
        )
        refs.append(ClaimRef("bench", f"c{number}", uid))
        processes = []
        for _, uid_of_pod in pods:
            pid += 1
            (proc / str(pid)).mkdir(parents=True, exist_ok=True)
            (proc / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-pod{uid_of_pod.replace('-', '_')}.slice/x\n"
            )
            processes.append({"pid": pid, "used_bytes": 2**30, "sm_util": 20.0})
            gpu = next(d for d in devices if d.name == device).hardware
            index = getattr(gpu, "index", None)
            if index is not None:
                lines.append(f"proc {index} {pid} {2**30} 20")
        figures[device] = {"sm_util": 40.0, "processes": processes}
        index = getattr(next(d for d in devices if d.name == device).hardware, "index", None)
        if index is not None:
            lines.append(f"util {index} 40 10")
    if nvml:
        (root / "telemetry").write_text("\n".join(lines) + "\n")
    serve.start()
    if not nvml:
        state = serve.plugins_dir / DRIVER
        (state / "fake-telemetry.json").write_text(json.dumps(figures))
    with kubeletclient.DRAClient(serve.dra_socket) as client:
        response = client.prepare(refs)
        errors = {r.name: response.claims[r.uid].error for r in refs if response.claims[r.uid].error}
        if errors:
            raise RuntimeError(f"prepare failed: {errors}")
    try:
        yield serve, port, refs
    finally:
        serve.kill()


def wait_reading(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, body = scrape(port)
        if b'claim_name="c15"' in body:
            return
        time.sleep(0.1)
    raise RuntimeError("no reading with the claims within 30 s")


def scrape_phase(nvml: bool, scrapes: int) -> None:
    with short_tmpdir() as root, telemetry_node(root, nvml, "5") as (_serve, port, _refs):
        wait_reading(port)
        for _ in range(20):
            scrape(port)
        times = []
        body = b""
        for _ in range(scrapes):
            seconds, body = scrape(port)
            times.append(seconds)
        series = sum(
            1
            for line in body.decode().splitlines()
            if line.startswith(("dradriver_gpu_", "dradriver_pod_gpu_"))
        )
        read = [
            line
            for line in body.decode().splitlines()
            if line.startswith("dradriver_telemetry_read_duration_seconds ")
        ]
        backend = "NVML, C fake" if nvml else "fake backend"
        p50, p99 = statistics.median(times) * 1e3, percentile(times, 99) * 1e3
        print(
            f"scrape ({backend}; 8 GPUs, 16 claims, {series} device and pod series): "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(times) * 1e3:.2f} ms; "
            f"one reading of every device {float(read[0].split()[1]) * 1e3:.2f} ms",
            flush=True,
        )


def render_phase(scrapes: int) -> None:
    """8 GPUs: 2 whole, 14 of the MIG devices held, 16 claims of 2 pods each with a process per
    pod, rendered as serve's sampler renders each reading."""

    from dradriver.backend.fake.telemetry import FakeFigures, FakeProcess, FakeTelemetry, write_figures
    from dradriver.telemetry.model import Holder, PodRef, readings, targets
    from dradriver.telemetry.sampler import Snapshot, render

    devices = build_devices(open_backend(PROFILE).discover(), driver_name=DRIVER).devices
    wanted = targets(devices, [])
    held = [t for t in wanted if t.kind == "gpu"] + [t for t in wanted if t.kind == "mig"][:14]
    holders: dict[str, list[Holder]] = {}
    pids: dict[int, str] = {}
    figures = {}
    for number, target in enumerate(held):
        pods = tuple(PodRef("bench", f"pod-{number}-{p}", pod_uid(number, p)) for p in range(2))
        holders[target.device] = [Holder("bench", f"c{number}", f"uid-{number}", pods, "")]
        processes = []
        for p, pod in enumerate(pods):
            pids[2000 + 2 * number + p] = pod.uid
            processes.append(FakeProcess(pid=2000 + 2 * number + p, used_bytes=2**30, sm_util=20.0))
        figures[target.device] = FakeFigures(sm_util=40.0, processes=tuple(processes))
    with short_tmpdir() as root:
        write_figures(root / "fake-telemetry.json", figures)
        reader = FakeTelemetry(root)
        samples = reader.read(wanted)
    snapshot = Snapshot(time.time(), 0.0, readings(wanted, samples, holders, pids.get))
    assert all(r.shares for r in snapshot.readings if r.holders)
    for _ in range(20):
        render(snapshot, {})
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        render(snapshot, {})
        times.append(time.perf_counter() - started)
    print(
        f"render of one reading, once per reading (8 GPUs, 16 claims): "
        f"p50 {statistics.median(times) * 1e3:.2f} ms, p99 {percentile(times, 99) * 1e3:.2f} ms",
        flush=True,
    )


def cpu_phase(nvml: bool, idle: float) -> None:
    with contextlib.ExitStack() as stack:
        nodes = {}
        for label, interval in (("on", "5"), ("off", "0")):
            root = stack.enter_context(short_tmpdir())
            serve, port, _ = stack.enter_context(telemetry_node(root, nvml, interval))
            nodes[label] = (serve, port)
        wait_reading(nodes["on"][1])
        pids = {label: serve.proc.pid for label, (serve, _) in nodes.items() if serve.proc is not None}
        before = {label: cpu_seconds(pid) for label, pid in pids.items()}
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < idle:
            for _, port in nodes.values():
                scrape(port)
            time.sleep(min(SCRAPE_EVERY, max(0.0, idle - elapsed)))
        used = {label: (cpu_seconds(pid) - before[label]) / idle * 100 for label, pid in pids.items()}
        own = max(0.0, used["on"] - used["off"])
        print(
            f"CPU over {idle:.0f} s, a scrape every {SCRAPE_EVERY:.0f} s: telemetry on {used['on']:.2f} %, "
            f"off {used['off']:.2f} % of a core; telemetry's own {own:.2f} %",
            flush=True,
        )


def prepare_phase(paced: int) -> None:
    with contextlib.ExitStack() as stack:
        clients = {}
        refs: dict[str, list[ClaimRef]] = {}
        for label, interval in (("on", "5"), ("off", "0")):
            root = stack.enter_context(short_tmpdir())
            profile = write_gpu_profile(root / "profile.yaml", 128)
            port = free_port()
            serve = ServeProcess(
                root,
                ["--telemetry-interval", interval, "--metrics-address", f"127.0.0.1:{port}"],
                fake_gpus=str(profile),
            )
            refs[label] = []
            for i in range(128):
                uid = f"00000000-0000-4000-8000-{i:012d}"
                (serve.claims_dir / f"c{i}.json").write_text(
                    json.dumps(claim_file(f"c{i}", uid, f"gpu-{i}", [(f"p{i}", pod_uid(i, 0))], "node-1"))
                )
                refs[label].append(ClaimRef("bench", f"c{i}", uid))
            serve.start()
            stack.callback(serve.kill)
            client = stack.enter_context(kubeletclient.DRAClient(serve.dra_socket))
            client.wait_ready(30)
            clients[label] = client
        times: dict[str, list[float]] = {"on": [], "off": []}
        for n in range(paced):
            for label in ("on", "off") if n % 2 == 0 else ("off", "on"):
                ref = refs[label][n % 128]
                time.sleep(0.02)
                started = time.perf_counter()
                response = clients[label].prepare([ref])
                times[label].append(time.perf_counter() - started)
                assert response.claims[ref.uid].error == "", response.claims[ref.uid].error
                clients[label].unprepare([ref])
        for label, samples in times.items():
            print(
                f"prepare, telemetry {label}: p50 {statistics.median(samples) * 1e3:.3f} ms, "
                f"p99 {percentile(samples, 99) * 1e3:.3f} ms (n={len(samples)})",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvml", action="store_true", help="read through pynvml from the C fake NVML")
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--paced", type=int, default=300)
    opts = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {sys.version.split()[0]}", flush=True)
    scrape_phase(opts.nvml, opts.scrapes)
    render_phase(opts.scrapes)
    cpu_phase(opts.nvml, opts.idle)
    if opts.paced:
        prepare_phase(opts.paced)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
