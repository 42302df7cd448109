"""Issue 36: where the time of one prepare and one unprepare goes, stage by stage, in `serve`.

Run (repository root; --dradriver-python is the interpreter of a production install, default
this one):

    .venv/bin/python -m bench.prepare_stages --k8s-bin /var/tmp/dradriver-k8s-bin [--calls 800]

One etcd + kube-apiserver (as bench_vs_go) and one `serve` on 128 fake GPUs, its CDI and
device-metadata directories on a tmpfs and its checkpoint on disk, as on a node; the same
client as bench_vs_go sends paced NodePrepareResources / NodeUnprepareResources (--pace-ms
apart, --batch claims a call). `serve` runs with its stages wrapped in `time.perf_counter` (about
1 µs a stage), and writes each stage's samples when it ends. Printed: the client's p50 and each
stage's p50, nested as they call each other (a stage run once per claim, such as the GET, has
--batch samples per call, and with --batch several run at once).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (label, module, owner class or None for a module function, attribute), outermost first;
#: the label's indent is its nesting.
STAGES: list[tuple[str, str, str | None, str]] = [
    ("prepare: the gRPC handler", "dradriver.plugin.dra", "_DRAPluginAdapter", "NodePrepareResources"),
    ("  fetching every claim (GETs and decoding)", "dradriver.prepare.fetch", "ClaimFetcher", "fetch_all"),
    ("  the claim's GET", "dradriver.kube.client", "KubeClient", "get_resource_claim"),
    ("  decoding it", "dradriver.prepare.fetch", None, "decode_claim"),
    ("  Preparer.run", "dradriver.prepare.preparer", "Preparer", "run"),
    ("    plan", "dradriver.prepare.preparer", "Preparer", "_plan_all"),
    ("    reserve", "dradriver.prepare.preparer", "Preparer", "_reserve"),
    (
        "    the steps (MIG, shares, sharing, metadata, spec)",
        "dradriver.prepare.preparer",
        "Preparer",
        "_run_steps",
    ),
    ("    device metadata file", "dradriver.prepare.metadata_files", "MetadataFiles", "write_many"),
    ("    CDI spec file", "dradriver.prepare.cdi", "CdiDirectory", "write_many"),
    ("    the checkpoint save", "dradriver.prepare.ledger", "Ledger", "persist"),
    ("    the log line", "dradriver.prepare.preparer", None, "_log_prepared"),
    ("unprepare: the gRPC handler", "dradriver.plugin.dra", "_DRAPluginAdapter", "NodeUnprepareResources"),
    ("  Unpreparer.run", "dradriver.prepare.unprepare", "Unpreparer", "run"),
    ("    set the spec aside", "dradriver.prepare.cdi", "CdiDirectory", "set_aside"),
    ("    the record forgotten: the checkpoint save", "dradriver.prepare.ledger", "Ledger", "forget"),
    ("    device metadata removed", "dradriver.prepare.metadata_files", "MetadataFiles", "remove"),
    ("checkpoint file writes (both)", "dradriver.prepare.checkpoint", None, "write_atomically"),
]


def serve_wrapped(samples_file: Path, argv: list[str]) -> int:
    """`dradriver serve` with STAGES timed; the samples go to `samples_file` at exit."""
    import importlib

    samples: dict[str, list[float]] = {label: [] for label, *_ in STAGES}

    def timed(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                samples[label].append(time.perf_counter() - started)

        return wrapper

    for label, module_name, owner_name, attribute in STAGES:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        setattr(owner, attribute, timed(label, getattr(owner, attribute)))
    atexit.register(lambda: samples_file.write_text(json.dumps(samples)))
    from dradriver.cli import main as cli

    return cli(argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k8s-bin", type=Path, default=os.environ.get("DRADRIVER_E2E_BIN"))
    parser.add_argument("--dradriver-python", type=Path, default=Path(sys.executable))
    parser.add_argument("--calls", type=int, default=800, help="paced prepare/unprepare pairs")
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=1, help="claims per call (bench_vs_go's batch: 64)")
    parser.add_argument("--serve-wrapped", type=Path, help=argparse.SUPPRESS)  # the plugin's side
    opts, rest = parser.parse_known_args()
    if opts.serve_wrapped is not None:
        sys.exit(serve_wrapped(opts.serve_wrapped, rest))
    if opts.k8s_bin is None:
        parser.error("--k8s-bin (or DRADRIVER_E2E_BIN) is required")
    drive(opts)


def drive(opts: argparse.Namespace) -> None:
    from bench import bench_vs_go as vs
    from bench.common import percentile
    from dradriver import kubeletclient
    from tests.e2e.cluster import ControlPlane, node_ip

    samples_file = Path(tempfile.mkstemp(prefix="prepare-stages-", suffix=".json")[1])
    repo = Path(__file__).resolve().parent.parent

    def argv(root: Path, kubeconfig: Path, devices: int) -> list[str]:
        serve = vs.dradriver_argv(Path("dradriver"), vs.NODE, plugin.driver, root, kubeconfig, devices)
        wrapper = [
            str(opts.dradriver_python),
            "-m",
            "bench.prepare_stages",
            "--serve-wrapped",
            str(samples_file),
        ]
        return [*wrapper, *serve[1:]]

    plugin = vs.Plugin("dradriver", "gpu.dradriver.dev", "dr", argv)
    launch_opts = argparse.Namespace(cdi_on_disk=False)
    with tempfile.TemporaryDirectory(prefix="prepare-stages-", dir="/var/tmp") as work:
        plane = ControlPlane(opts.k8s_bin, Path(work), advertise_address=node_ip())
        try:
            plane.start()
            _, kubeconfigs, claims = vs.api_server_for(plane, [plugin])
            os.environ["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(repo), os.environ.get("PYTHONPATH")])
            )
            prepares, unprepares = [], []
            with vs.launch(plugin, kubeconfigs["dr"], vs.PREPARE_DEVICES, launch_opts) as running:
                vs.get_info_answered(running)
                kubeletclient.register(running.registration)
                with kubeletclient.DRAClient(running.dra) as client:
                    client.wait_ready(30)
                    refs = claims["dr"]
                    for n in range(opts.calls + 20):  # the first 20: warm-up
                        batch = [refs[(n * opts.batch + i) % len(refs)] for i in range(opts.batch)]
                        time.sleep(opts.pace_ms / 1000)
                        started = time.perf_counter()
                        vs.prepared(client.prepare(batch), batch)
                        prepared_at = time.perf_counter()
                        client.unprepare(batch)
                        if n >= 20:
                            prepares.append(prepared_at - started)
                            unprepares.append(time.perf_counter() - prepared_at)
        finally:
            plane.stop()
    stages: dict[str, list[float]] = json.loads(samples_file.read_text())
    samples_file.unlink()
    print(f"{'stage':60s} {'n':>6s} {'p50 ms':>8s} {'p99 ms':>8s}")
    rows = [("prepare: the client's call", prepares), ("unprepare: the client's call", unprepares)]
    for label, values in [*rows, *stages.items()]:
        with contextlib.suppress(statistics.StatisticsError):
            print(
                f"{label:60s} {len(values):6d} {statistics.median(values) * 1e3:8.3f} "
                f"{percentile(values, 99) * 1e3:8.3f}"
            )


if __name__ == "__main__":
    main()
