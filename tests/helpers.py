"""Test harness shared by the suites: short temp dirs and a real `dradriver serve` subprocess."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import yaml

from dradriver import kubeletclient
from dradriver.health.board import Health
from dradriver.plugin.server import PluginPaths

DRIVER = "gpu.dradriver.dev"


@contextmanager
def short_tmpdir() -> Iterator[Path]:
    """A temp dir under /tmp with a short name: unix socket paths must stay within 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts: reap your own children)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate: object, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class ServeProcess:
    """`python -m dradriver serve` on temporary kubelet dirs, as a kubelet would see it."""

    def __init__(
        self,
        root: Path,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        driver: str = DRIVER,
        *,
        claims_from_files: bool = True,
        fake_gpus: str | None = "dgx-h100",
        pod_uid: str = "",
    ) -> None:
        self.root = root
        self.registry_dir = root / "plugins_registry"
        self.plugins_dir = root / "plugins"
        self.cdi_dir = root / "cdi"
        self.claims_dir = root / "claims"
        self.driver = driver
        self.args = [
            "--kubelet-registry-dir",
            str(self.registry_dir),
            "--kubelet-plugins-dir",
            str(self.plugins_dir),
            "--cdi-dir",
            str(self.cdi_dir),
            "--node-name",
            "node-1",
            # The node-wide lock's directory: the host's in production, one per test "node" here.
            "--node-lock-dir",
            str(root / "node-lock"),
            *(["--fake-gpus", fake_gpus] if fake_gpus else []),
            *(["--claims-dir", str(self.claims_dir)] if claims_from_files else []),
            *(["--pod-uid", pod_uid] if pod_uid else []),
            # On NVML, device nodes missing on the "host" are made here, never in this machine's /dev.
            *(["--host-dev", str(root / "dev")] if fake_gpus is None else []),
            *extra_args,
        ]
        # Node-only unless a test says otherwise: no kubeconfig, no stray DRADRIVER_* settings.
        inherited = {
            k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("DRADRIVER_")
        }
        self.env = inherited | {"PYTHONUNBUFFERED": "1"} | (env or {})
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = root / (f"serve-{pod_uid}.log" if pod_uid else "serve.log")
        self.paths = PluginPaths.for_driver(driver, self.plugins_dir, self.registry_dir, pod_uid)
        if claims_from_files:
            self.claims_dir.mkdir(exist_ok=True)

    @property
    def registration_socket(self) -> Path:
        return self.paths.registration_socket

    @property
    def dra_socket(self) -> Path:
        return self.paths.dra_socket

    @property
    def lock_file(self) -> Path:
        return self.paths.lock_file

    def start(self, wait: bool = True, *, umask: int = -1) -> ServeProcess:
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dradriver", "serve", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            text=True,
            umask=umask,
        )
        if wait:
            wait_for(self.registration_socket.exists, 20, f"{self.registration_socket} (log: {self.log()})")
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def healthcheck(serve: ServeProcess, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dradriver",
            "healthcheck",
            "--kubelet-plugins-dir",
            str(serve.plugins_dir),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@contextmanager
def running_serve(
    extra_args: Sequence[str] = (), env: dict[str, str] | None = None, driver: str = DRIVER
) -> Iterator[ServeProcess]:
    with short_tmpdir() as root:
        serve = ServeProcess(root, extra_args, env, driver).start()
        try:
            yield serve
        finally:
            serve.kill()


def allocated_claim(
    name: str,
    uid: str,
    results: Sequence[dict[str, object]],
    *,
    namespace: str = "default",
    config: Sequence[dict[str, object]] = (),
    pool: str = "node-1",
    driver: str = DRIVER,
) -> dict[str, object]:
    """A resource.k8s.io/v1 ResourceClaim as the scheduler leaves it: allocated, results filled
    in, reserved for the pod it was allocated for.

    Each result needs at least `request` and `device`; driver and pool default to ours.
    """
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": _requests_for(results)}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": driver, "pool": pool} | dict(r) for r in results],
                    "config": list(config),
                }
            },
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": f"pod-{uid}"}],
        },
    }


def _requests_for(results: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """The spec requests the results name (the API server checks that they exist)."""
    requests: dict[str, dict[str, object]] = {}
    for result in results:
        base, _, sub = str(result["request"]).partition("/")
        request = requests.setdefault(base, {"name": base})
        if sub:
            alternatives = request.setdefault("firstAvailable", [])
            assert isinstance(alternatives, list)
            if all(a["name"] != sub for a in alternatives):
                alternatives.append({"name": sub, "deviceClassName": DRIVER})
        else:
            exactly = request.setdefault("exactly", {"deviceClassName": DRIVER, "count": 0})
            assert isinstance(exactly, dict)
            exactly["count"] += 1
            if result.get("adminAccess"):
                exactly["adminAccess"] = True
    return list(requests.values())


def opaque(
    parameters: dict[str, object], *, requests: Sequence[str] = (), source: str = "FromClaim"
) -> dict[str, object]:
    entry: dict[str, object] = {"source": source, "opaque": {"driver": DRIVER, "parameters": parameters}}
    if requests:
        entry["requests"] = list(requests)
    return entry


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


DeviceStates = dict[str, tuple[int, str]]


class HealthStream:
    """The kubelet's NodeWatchResources stream, read in a thread; `latest` is the last full list."""

    def __init__(self, socket: Path, service: str = kubeletclient.V1ALPHA1_HEALTH) -> None:
        self._client = kubeletclient.DRAClient(socket, health_service=service)
        self.responses: list[DeviceStates] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._client.watch_health(timeout=300):
                self.responses.append({d.device.device_name: (d.health, d.message) for d in response.devices})
        except grpc.RpcError:
            pass  # closed by the test

    @property
    def latest(self) -> DeviceStates:
        return self.responses[-1] if self.responses else {}

    def wait(self, device: str, health: Health, timeout: float = 15, *, since: int | None = None) -> str:
        """Wait for `device` to reach `health` on the stream; returns its message. With `since` (a
        count of responses, `len(responses)` taken earlier), any later response counts, not only
        the latest: a rescan may already have replaced it."""
        what = f"{device} {health.name}"
        if since is None:
            wait_for(lambda: self.latest.get(device, (None,))[0] == health, timeout, what)
            return self.latest[device][1]
        found: list[str] = []

        def seen() -> bool:
            found[:] = [r[device][1] for r in self.responses[since:] if r.get(device, (None,))[0] == health]
            return bool(found)

        wait_for(seen, timeout, what)
        return found[0]

    def close(self) -> None:
        self._client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str) -> tuple[int, str]:
    """Status and body of GET http://127.0.0.1:<port><path>; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), str(resp.read().decode())
    except urllib.error.HTTPError as err:
        return err.code, str(err.read().decode())
    except (urllib.error.URLError, OSError) as err:  # refused, or reset before an answer
        return 0, str(err)


def scrape(port: int) -> str:
    """The /metrics page, checked to be in the Prometheus text format."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(resp.read().decode())


def write_gpu_profile(
    path: Path, count: int, product: str = "NVIDIA H100 80GB HBM3", *, mig_empty: bool = False
) -> Path:
    """A fake GPU profile file of `count` identical GPUs (H100 by default, or a Tesla T4).

    `mig_empty`: H100s in MIG mode without MIG devices, for --partitionable to create them.
    """
    hopper = product.startswith("NVIDIA H100")
    gpu: dict[str, object] = {
        "productName": product,
        "count": count,
        "architecture": "Hopper" if hopper else "Turing",
        "computeCapability": "9.0" if hopper else "7.5",
        "memoryMiB": 81559 if hopper else 15360,
    }
    if mig_empty:
        assert hopper, "only the H100 has a MIG profile table here"
        gpu["mig"] = {"table": "h100-80gb", "enabled": True}
    path.write_text(
        yaml.safe_dump({"driverVersion": "570.124.06", "cudaDriverVersion": "12.8", "gpus": [gpu]})
    )
    return path


def open_idle_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections that send nothing, all opened at once (within milliseconds)."""
    conns = []
    for _ in range(count):
        conn = socket.socket()
        conn.setblocking(False)
        conn.connect_ex(("127.0.0.1", port))
        conns.append(conn)
    with selectors.DefaultSelector() as selector:
        for conn in conns:
            selector.register(conn, selectors.EVENT_WRITE)
        connected = 0
        while connected < count:
            events = selector.select(timeout=10)
            assert events, f"{connected} of {count} idle connections made"
            for key, _ in events:
                selector.unregister(key.fileobj)
                connected += 1
    return conns
