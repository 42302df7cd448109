"""Issue 8 figures: XID -> UNHEALTHY on the health stream, XID -> taint on the API server, idle cost.

    python -m bench.bench_health [--runs 30] [--idle-seconds 60] [--idle-repeats 2]
                                 [--k8s-bin DIR | --kubeconfig PATH]

Everything runs a real `dradriver serve` subprocess on fake GPUs (the fake-event log) and on the
C fake libnvidia-ml (events through pynvml's nvmlEventSetWait; needs `cc`). Latencies are timed
from appending the event (the fake log, or the fake NVML's FIFO) to the moment the stream
message arrives in this process / the taint is seen in the API server: a real kube-apiserver
started from --k8s-bin, or the one --kubeconfig names; without either the loopback fake from
tests/publish, whose figures are not the product's.
Idle cost: serve's own CPU time (utime + stime from /proc) over a window with nothing happening,
health monitoring on (defaults) against `enabled: false`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.common import cpu_seconds, real_api_server, summary
from dradriver import kubeletclient
from dradriver.backend.fake.health import FakeEventRecord, append_fake_event
from dradriver.health.board import Health
from tests.fakenvml.harness import CONFIG_ENV, EVENTS_ENV, EventPipe, build_library, config_text
from tests.helpers import DRIVER, ServeProcess, short_tmpdir, wait_for
from tests.publish.apiservers import TEST_DRIVER, Backend, fake_backend

FAST_RECOVERY = "quietPeriodSeconds: 0.3\nrecheckIntervalSeconds: 0.1\n"


class TimedStream:
    """The health stream, each response stamped with time.perf_counter() on arrival."""

    def __init__(self, socket: Path, service: str = kubeletclient.V1ALPHA1_HEALTH) -> None:
        self._client = kubeletclient.DRAClient(socket, health_service=service)
        self.arrivals: list[tuple[float, dict[str, int]]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self._client.watch_health(timeout=3600):
                self.arrivals.append(
                    (time.perf_counter(), {d.device.device_name: d.health for d in response.devices})
                )
        except Exception:  # closed at the end of the run
            return

    def first(self, device: str, health: Health, after: float, timeout: float = 10) -> float:
        """Arrival time of the first response after `after` with `device` at `health`."""

        def found() -> float | None:
            return next((t for t, s in list(self.arrivals) if t >= after and s.get(device) == health), None)

        wait_for(lambda: found() is not None, timeout, f"{device} {health.name} on the stream")
        stamp = found()
        assert stamp is not None
        return stamp

    def close(self) -> None:
        self._client.close()


@contextmanager
def serve(
    root: Path,
    health: str,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    driver: str = DRIVER,
    fake_gpus: str | None = "dgx-h100",
) -> Iterator[ServeProcess]:
    config = root / "health.yaml"
    config.write_text(health)
    process = ServeProcess(
        root,
        ["--health-config", str(config), "--log-format", "console", *(extra or [])],
        env,
        driver,
        fake_gpus=fake_gpus,
    ).start()
    try:
        yield process
    finally:
        process.kill()


def stream_latency_fake(
    runs: int, services: tuple[str, ...] = (kubeletclient.V1ALPHA1_HEALTH,)
) -> dict[str, list[float]]:
    """Per health service, XID -> UNHEALTHY on a stream of it; with several, all open at once."""
    samples: dict[str, list[float]] = {s: [] for s in services}
    with short_tmpdir() as root, serve(root, FAST_RECOVERY) as process:
        streams = {s: TimedStream(process.dra_socket, s) for s in services}
        state_dir = process.plugins_dir / DRIVER
        wait_for((state_dir / "health.json").exists, 20, "health.json")
        for run in range(runs + 1):  # the first run warms up
            device = f"gpu-{run % 8}"
            started = time.perf_counter()
            append_fake_event(state_dir, FakeEventRecord(device=device, xid=79, at=time.time()))
            arrived = {s: stream.first(device, Health.UNHEALTHY, started) for s, stream in streams.items()}
            for service, stream in streams.items():
                stream.first(device, Health.HEALTHY, arrived[service])
                if run:
                    samples[service].append(arrived[service] - started)
        for stream in streams.values():
            stream.close()
    return samples


def stream_latency_nvml(runs: int) -> list[float]:
    from dradriver.backend.select import open_backend

    samples = []
    with TemporaryDirectory() as tmp, short_tmpdir() as root:
        library = build_library(Path(tmp))
        config = Path(tmp) / "nvml.conf"
        config.write_text(config_text(open_backend("t4x4").discover()))
        pipe = EventPipe(Path(tmp) / "events")
        env = {"LD_LIBRARY_PATH": str(library.parent), CONFIG_ENV: str(config), EVENTS_ENV: str(pipe.path)}
        with serve(root, FAST_RECOVERY, env=env, fake_gpus=None) as process:
            stream = TimedStream(process.dra_socket)
            wait_for((process.plugins_dir / DRIVER / "health.json").exists, 20, "health.json")
            for run in range(runs + 1):
                gpu = run % 4
                started = time.perf_counter()
                pipe.send(f"xid {gpu} 79")
                arrived = stream.first(f"gpu-{gpu}", Health.UNHEALTHY, started)
                stream.first(f"gpu-{gpu}", Health.HEALTHY, arrived)
                if run:
                    samples.append(arrived - started)
            stream.close()
        pipe.close()
    return samples


def taint_latency(runs: int, kubeconfig: str | None) -> list[float]:
    samples = []
    with TemporaryDirectory() as tmp, short_tmpdir() as root:
        backend = Backend("cluster", Path(kubeconfig), Path(tmp)) if kubeconfig else fake_backend(Path(tmp))
        node = backend.make_node()
        extra = ["--kubeconfig", str(backend.kubeconfig), "--node-name", node]
        env = {"DRADRIVER_DRIVER_NAME": TEST_DRIVER}
        try:
            with serve(root, FAST_RECOVERY, extra, env, TEST_DRIVER) as process:
                state_dir = process.plugins_dir / TEST_DRIVER
                wait_for(lambda: len(backend.slices(node)) == 1, 30, "the first publish")
                wait_for((state_dir / "health.json").exists, 20, "health.json")

                def tainted(device: str) -> bool:
                    return any(
                        d["name"] == device and d.get("taints")
                        for s in backend.slices(node)
                        for d in s["spec"]["devices"]
                    )

                for run in range(runs + 1):
                    device = f"gpu-{run % 8}"
                    started = time.perf_counter()
                    append_fake_event(state_dir, FakeEventRecord(device=device, xid=79, at=time.time()))
                    wait_for(lambda d=device: tainted(d), 10, "the taint", interval=0.002)
                    seen = time.perf_counter()
                    wait_for(lambda d=device: not tainted(d), 10, "the taint to go", interval=0.01)
                    if run:
                        samples.append(seen - started)
        finally:
            backend.cleanup()
    return samples


def idle_cpu(health: str, seconds: float, nvml: bool) -> float:
    """Fraction of one core serve used over `seconds` of idleness (after a 5 s settle)."""
    from dradriver.backend.select import open_backend

    with TemporaryDirectory() as tmp, short_tmpdir() as root:
        env: dict[str, str] = {}
        pipe = None
        if nvml:
            library = build_library(Path(tmp))
            config = Path(tmp) / "nvml.conf"
            config.write_text(config_text(open_backend("dgx-h100").discover()))
            pipe = EventPipe(Path(tmp) / "events")
            env = {
                "LD_LIBRARY_PATH": str(library.parent),
                CONFIG_ENV: str(config),
                EVENTS_ENV: str(pipe.path),
            }
        with serve(root, health, env=env, fake_gpus=None if nvml else "dgx-h100") as process:
            assert process.proc is not None
            wait_for(lambda: "driver ready" in process.log(), 30, "driver ready")
            time.sleep(5)
            before = cpu_seconds(process.proc.pid)
            time.sleep(seconds)
            used = cpu_seconds(process.proc.pid) - before
        if pipe is not None:
            pipe.close()
    return used / seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--idle-repeats", type=int, default=2)
    parser.add_argument("--kubeconfig", help="a real API server for the taint figure (default: the fake)")
    parser.add_argument("--k8s-bin", type=Path, help="start a real kube-apiserver from these binaries")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.k8s_bin is not None:
            args.kubeconfig = str(stack.enter_context(real_api_server(args.k8s_bin)))
        run(args)


def run(args: argparse.Namespace) -> None:

    print(
        summary(
            "XID -> UNHEALTHY on the stream, fake GPUs (fake-event log)",
            stream_latency_fake(args.runs)[kubeletclient.V1ALPHA1_HEALTH],
        )
    )
    print(
        summary(
            "XID -> UNHEALTHY on the stream, C fake NVML (nvmlEventSetWait)", stream_latency_nvml(args.runs)
        )
    )
    server = "the API server at --kubeconfig" if args.kubeconfig else "the loopback fake API server"
    print(summary(f"XID -> taint on {server}", taint_latency(args.runs, args.kubeconfig)))
    for nvml in (False, True):
        backend = "C fake NVML" if nvml else "fake GPUs"
        on, off = [], []
        for _ in range(args.idle_repeats):  # interleaved, so load from elsewhere hits both alike
            on.append(idle_cpu("{}\n", args.idle_seconds, nvml))
            off.append(idle_cpu("enabled: false\n", args.idle_seconds, nvml))
        print(
            f"idle CPU of serve, {backend}, {args.idle_seconds:g}s windows x{args.idle_repeats}: "
            f"health on {[f'{x:.3%}' for x in on]} median {statistics.median(on):.3%}; "
            f"health off {[f'{x:.3%}' for x in off]} median {statistics.median(off):.3%}; "
            f"difference {statistics.median(on) - statistics.median(off):+.3%} of one core"
        )


if __name__ == "__main__":
    main()
