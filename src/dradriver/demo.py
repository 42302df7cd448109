"""`make demo`: the whole node flow on fake GPUs with no cluster, narrated.

1. `dradriver serve` starts on temporary kubelet directories with a fake DGX H100;
2. we play the kubelet: registration handshake over the real sockets, the health stream;
3. example claims from examples/claims are allocated locally by the scheduler simulator
   (the same code as `dradriver dry-run`) and written where `serve --claims-dir` reads them;
4. NodePrepareResources over gRPC, the CDI spec it wrote, `dradriver status`;
5. NodeUnprepareResources, then SIGTERM: nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from dradriver import data, kubeletclient
from dradriver.plugin.driver import ClaimRef

console = Console(highlight=False, soft_wrap=True)
DRIVER = "gpu.dradriver.dev"
NODE = "demo-node"
PROFILE = "dgx-h100"
EXAMPLES = ("single-gpu.yaml", "two-gpus.yaml", "time-slicing.yaml", "mps.yaml")


def step(title: str) -> None:
    console.print(f"\n[bold cyan]==> {title}[/]")


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"demo: serve did not create {path}")
        time.sleep(0.02)


def allocate_examples(claims_dir: Path) -> list[tuple[str, ClaimRef]]:
    """Allocate each example's claim on the fake node like the scheduler, write it allocated."""
    from dradriver.offline.allocation import parse_claim, parse_device_class, parse_slice, simulate
    from dradriver.offline.allocation.result import allocation_status
    from dradriver.slices import build_node_slices

    slices = [parse_slice(s) for s in build_node_slices(PROFILE, node_name=NODE, driver_name=DRIVER)]
    classes = {}
    for path in sorted(data.DEVICE_CLASSES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "DeviceClass":
                device_class = parse_device_class(doc)
                classes[device_class.name] = device_class
    table = Table("example", "claim", "request", "allocated device")
    allocated: list[tuple[str, ClaimRef]] = []
    taken: list[Any] = []
    for example in EXAMPLES:
        for doc in yaml.safe_load_all((data.EXAMPLE_CLAIMS / example).read_text()):
            if not doc or doc.get("kind") not in {"ResourceClaim", "ResourceClaimTemplate"}:
                continue
            spec = doc["spec"]["spec"] if doc["kind"] == "ResourceClaimTemplate" else doc["spec"]
            name = doc["metadata"]["name"] + ("-demo" if doc["kind"] == "ResourceClaimTemplate" else "")
            claim = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
                "spec": spec,
            }
            # Earlier claims hold their devices: simulate them together, as the scheduler would.
            simulation = simulate([*taken, parse_claim(claim)], classes, slices, node=NODE)
            report = simulation.nodes[0].claims[-1]
            if not report.results:
                console.print(f"{example}: not satisfiable: {report.reason}")
                continue
            claim["status"] = {"allocation": allocation_status(report, classes)}
            taken.append(parse_claim(claim))
            (claims_dir / f"{name}.yaml").write_text(yaml.safe_dump(claim))
            for result in report.results:
                table.add_row(example, name, result.request, result.device)
            allocated.append((example, ClaimRef("default", name, claim["metadata"]["uid"])))
    console.print(table)
    return allocated


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dradriver-demo-", dir="/tmp") as tmp:
        root = Path(tmp)
        registry, plugins, cdi, claims_dir = (
            root / "plugins_registry",
            root / "plugins",
            root / "cdi",
            root / "claims",
        )
        claims_dir.mkdir()
        log_path = root / "serve.log"
        args = [
            sys.executable, "-m", "dradriver", "serve", "--fake-gpus", PROFILE, "--node-name", NODE,
            "--kubelet-registry-dir", str(registry), "--kubelet-plugins-dir", str(plugins),
            "--cdi-dir", str(cdi), "--claims-dir", str(claims_dir), "--log-format", "console",
        ]  # fmt: skip
        step(f"Starting the plugin on a fake {PROFILE} (no cluster: node-only mode, claims from files)")
        console.print("$ dradriver " + " ".join(args[3:]), style="dim")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        with log_path.open("wb") as log:
            started = time.perf_counter()
            serve = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                run_flow(
                    serve, started=started, registry=registry, cdi=cdi, claims_dir=claims_dir, plugins=plugins
                )
            finally:
                if serve.poll() is None:
                    serve.kill()
        step("Plugin log")
        console.print(log_path.read_text(), markup=False)
    return 0


def run_flow(
    serve: subprocess.Popen[bytes],
    *,
    started: float,
    registry: Path,
    cdi: Path,
    claims_dir: Path,
    plugins: Path,
) -> None:
    reg_socket = registry / f"{DRIVER}-reg.sock"
    wait_for_file(reg_socket, serve)
    console.print(f"registration socket up after {time.perf_counter() - started:.2f}s: {reg_socket}")

    step("Kubelet 1.37: registration handshake (GetInfo, then NotifyRegistrationStatus)")
    registration = kubeletclient.register(reg_socket, kubelet_minor=37)
    console.print(f"driver name:        {registration.driver_name}")
    console.print(f"DRA endpoint:       {registration.endpoint}")
    console.print(f"supported services: {', '.join(registration.supported_versions)}")
    console.print(
        f"kubelet picked:     [bold]{registration.service}[/], [bold]{registration.health_service}[/]"
    )
    health = registration.health_service
    assert health is not None, "the driver advertises its health services"

    with kubeletclient.DRAClient(registration.endpoint, registration.service, health) as client:
        step(f"Kubelet: subscribe to the health stream ({health})")
        stream = iter(client.watch_health(timeout=60))
        first = next(stream)
        names = {1: "HEALTHY", 2: "UNHEALTHY"}
        console.print(
            ", ".join(f"{d.device.device_name}={names.get(d.health, 'UNKNOWN')}" for d in first.devices)
        )

        step("Scheduler (simulated locally): allocate example claims from examples/claims")
        allocated = allocate_examples(claims_dir)

        step("Kubelet: NodePrepareResources for every allocated claim, in one call")
        response = client.prepare([ref for _, ref in allocated])
        for example, ref in allocated:
            entry = response.claims[ref.uid]
            if entry.error:
                console.print(f"[red]{ref.name}[/] ({example}): error: {entry.error}")
                continue
            for device in entry.devices:
                console.print(
                    f"[green]{ref.name}[/] ({example}): {device.device_name} for requests "
                    f"{list(device.request_names) or 'all'} -> {', '.join(device.cdi_device_ids)}"
                )

        shown = next((ref for _, ref in allocated if not response.claims[ref.uid].error), None)
        if shown is not None:
            spec_file = cdi / f"k8s.{DRIVER}-claim_{shown.uid}.json"
            step(f"The CDI spec the container runtime will apply: {spec_file.name}")
            console.print(Syntax(json.dumps(json.loads(spec_file.read_text()), indent=2), "json"))

        step("dradriver status (read from the checkpoint)")
        subprocess.run(
            [sys.executable, "-m", "dradriver", "status", "--kubelet-plugins-dir", str(plugins)],
            check=False,
            env={**os.environ, "COLUMNS": "150"},
        )

        step("A GPU fails: `dradriver fake-event --device gpu-7 --xid 79` (GPU has fallen off the bus)")
        subprocess.run(
            [sys.executable, "-m", "dradriver", "fake-event", "--kubelet-plugins-dir", str(plugins),
             "--device", "gpu-7", "--xid", "79"],
            check=True,
        )  # fmt: skip
        for update in stream:
            broken = [d for d in update.devices if d.health == 2]
            if broken:
                for device in broken:
                    console.print(f"health stream: {device.device.device_name} UNHEALTHY: {device.message}")
                break

        step("Kubelet: NodeUnprepareResources for the same claims")
        unprepared = client.unprepare([ref for _, ref in allocated])
        console.print(
            f"errors: {[e.error for e in unprepared.claims.values() if e.error] or 'none'}; "
            f"CDI specs left: {sorted(p.name for p in cdi.glob('*.json')) or 'none'}"
        )

    step("Stopping the plugin with SIGTERM")
    serve.send_signal(signal.SIGTERM)
    code = serve.wait(30)
    left = sorted(p.name for p in (registry.parent).rglob("*.sock"))
    console.print(f"exit code {code}; sockets left behind: {left or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
