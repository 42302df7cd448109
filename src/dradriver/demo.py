"""`make demo`: the node flow on fake GPUs with no cluster, narrated.

Starts `dradriver serve` on temporary kubelet directories, plays the kubelet's part over the real
sockets (registration handshake, DRA calls, the health stream) and shows what happens at each step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from dradriver import kubeletclient

console = Console(highlight=False)
DRIVER = "gpu.dradriver.dev"


def step(title: str) -> None:
    console.print(f"\n[bold cyan]==> {title}[/]")


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"demo: serve did not create {path}")
        time.sleep(0.02)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dradriver-demo-", dir="/tmp") as tmp:
        root = Path(tmp)
        registry, plugins, cdi = root / "plugins_registry", root / "plugins", root / "cdi"
        log_path = root / "serve.log"
        args = [
            sys.executable, "-m", "dradriver", "serve", "--fake-gpus", "dgx-h100", "--node-name", "demo-node",
            "--kubelet-registry-dir", str(registry), "--kubelet-plugins-dir", str(plugins),
            "--cdi-dir", str(cdi), "--log-format", "console",
        ]  # fmt: skip
        step("Starting the plugin on fake GPUs (no cluster: node-only mode)")
        console.print("$ dradriver " + " ".join(args[3:]), style="dim")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        with log_path.open("wb") as log:
            started = time.perf_counter()
            serve = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                reg_socket = registry / f"{DRIVER}-reg.sock"
                wait_for_file(reg_socket, serve)
                console.print(
                    f"registration socket up after {time.perf_counter() - started:.2f}s: {reg_socket}"
                )

                step("Kubelet: registration handshake (GetInfo, then NotifyRegistrationStatus)")
                registration = kubeletclient.register(reg_socket)
                console.print(f"driver name:        {registration.driver_name}")
                console.print(f"DRA endpoint:       {registration.endpoint}")
                console.print(f"supported services: {', '.join(registration.supported_versions)}")
                console.print(f"kubelet picked:     [bold]{registration.service}[/]")

                with kubeletclient.DRAClient(registration.endpoint, registration.service) as client:
                    step("Kubelet: subscribe to the health stream (v1alpha1.DRAResourceHealth)")
                    first = next(iter(client.watch_health(timeout=10)))
                    console.print(f"{len(first.devices)} devices reported")
                    for device in first.devices:
                        console.print(
                            f"  {device.device.pool_name}/{device.device.device_name}: health={device.health}"
                        )

                    step("Kubelet: NodePrepareResources with no claims")
                    console.print(f"response claims: {dict(client.prepare([]).claims)}")

                step("Stopping the plugin with SIGTERM")
                serve.send_signal(signal.SIGTERM)
                code = serve.wait(30)
                left = sorted(str(p.relative_to(root)) for p in root.rglob("*.sock"))
                console.print(f"exit code {code}; sockets left behind: {left or 'none'}")
            finally:
                if serve.poll() is None:
                    serve.kill()
        step("Plugin log")
        console.print(log_path.read_text(), markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
