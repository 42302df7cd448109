"""Issue 28: a host driver reloaded under `serve` — how long until its devices are healthy again.

Run (repository root, after `make .venv/.installed`; needs a C compiler for the fake NVML):

    .venv/bin/python -m bench.bench_driver_reload [--rounds 10]

`serve` runs on the C fake NVML (tests/fakenvml: the real NVML code path, pynvml over ctypes)
serving the dgx-h100 profile's 8 GPUs, with one prepared claim per GPU, and is watched through
the kubelet's health stream on its DRA socket. Each round the host driver is unloaded (every NVML
call answers "driver not loaded"), the stream waits for every device to turn unhealthy, the
driver comes back with another version (after --outage seconds: serve's attempts to initialise
NVML again back off up to 4 s apart), and the time from then until the stream reports every
device healthy again is taken. The prepared claims are counted in the checkpoint (`dradriver
status`) before the first round and after the last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from dradriver import kubeletclient
from dradriver.backend.select import open_backend
from dradriver.health.board import Health
from dradriver.plugin.driver import ClaimRef
from tests.fakenvml.harness import build_library, fake_driver
from tests.helpers import HealthStream, ServeProcess, allocated_claim, short_tmpdir, uid
from tests.inventory.test_nvml_inventory import published_names, reconfigure
from tests.robustness.common import dradriver

#: The two driver versions the rounds alternate between.
VERSIONS = ("570.124.06", "580.82.07")


def wait_all(stream: HealthStream, health: Health, names: set[str], timeout: float = 60) -> float:
    """Poll the stream (every millisecond) until every device has `health`; the time it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = stream.latest
        if set(latest) == names and {h for h, _ in latest.values()} == {health}:
            return time.monotonic()
        time.sleep(0.001)
    raise TimeoutError(f"not every device {health.name} within {timeout}s")


def prepared_claims(serve: ServeProcess) -> int:
    status = dradriver("status", "--state-dir", str(serve.plugins_dir / serve.driver), "-o", "json")
    return len(json.loads(status.stdout)["claims"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--outage",
        type=float,
        default=0.0,
        help="seconds the driver stays unloaded (a driver upgrade takes minutes)",
    )
    opts = parser.parse_args()
    inventory = open_backend("dgx-h100").discover()
    names = published_names(inventory)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-reload-") as work, short_tmpdir() as root:
        tmp = Path(work)
        fake = fake_driver(build_library(tmp / "lib"), tmp, inventory)
        config, unloaded = fake.config, fake.unloaded
        serve = ServeProcess(root, ["--rescan-interval", "0", *fake.serve_args], fake.env, fake_gpus=None)
        refs = []
        for gpu in range(len(inventory.gpus)):
            claim = allocated_claim(f"claim-{gpu}", uid(gpu), [{"request": "gpu", "device": f"gpu-{gpu}"}])
            (serve.claims_dir / f"claim-{gpu}.yaml").write_text(yaml.safe_dump(claim))
            refs.append(ClaimRef("default", f"claim-{gpu}", uid(gpu)))
        serve.start()
        stream = HealthStream(serve.dra_socket)
        try:
            wait_all(stream, Health.HEALTHY, names)
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                response = client.prepare(refs, timeout=60)
            assert all(entry.error == "" for entry in response.claims.values()), response
            before = prepared_claims(serve)
            seconds = []
            for n in range(opts.rounds):
                unloaded.touch()
                wait_all(stream, Health.UNHEALTHY, names)
                time.sleep(opts.outage)  # serve's attempts to initialise NVML back off meanwhile
                reconfigure(config, dataclasses.replace(inventory, driver_version=VERSIONS[n % 2]))
                back = time.monotonic()
                os.unlink(unloaded)
                seconds.append(wait_all(stream, Health.HEALTHY, names) - back)
                print(f"round {n + 1}: healthy again after {seconds[-1]:.3f} s", flush=True)
            after = prepared_claims(serve)
            assert serve.proc is not None
            restarted = serve.proc.poll() is not None
        finally:
            stream.close()
            serve.kill()
            fake.events.close()
    load_after = os.getloadavg()
    print(
        f"devices healthy again after the host driver came back: n={len(seconds)} "
        f"median={statistics.median(seconds):.3f}s max={max(seconds):.3f}s min={min(seconds):.3f}s"
    )
    print(f"prepared claims before {before}, after {after} (lost: {before - after})")
    print(f"serve restarted: {restarted}")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")


if __name__ == "__main__":
    main()
