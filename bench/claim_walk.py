"""Issue 36: a claim's walk from NodePrepareResources to its CDI file, counted.

Run (repository root): `.venv/bin/python -m bench.claim_walk` (add `--src DIR` to count another
checkout's `src/`, e.g. a `git worktree` of an older commit).

One node-only `serve` on the fake `dgx-h100` profile runs in this process (`Daemon`, its claims
from a directory), and one single-GPU claim is prepared over its real gRPC socket. A profiler
notes every dradriver function the call runs on the gRPC server's thread; when the CDI file is
written, the in-project frames on the stack are the walk's hops. Printed: the hops (functions on
the stack from the gRPC handler to the write, and the files they are in), and every dradriver
function and file the call ran, with the lines of `src/dradriver/prepare/` and of every module
`serve` imports.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _walk(src: Path) -> dict[str, Any]:
    sys.path.insert(0, str(src))
    from dradriver import kubeletclient
    from dradriver.cli import main as cli
    from dradriver.plugin.driver import ClaimRef
    from dradriver.plugin.server import PluginPaths
    from dradriver.prepare import cdi

    root = Path(tempfile.mkdtemp(prefix="walk-"))
    uid = "00000000-0000-4000-8000-000000000036"
    (root / "claims").mkdir()
    (root / "claims" / "walk.json").write_text(json.dumps(_claim(uid)))
    package = str(src / "dradriver")
    seen: dict[str, set[str]] = {}
    hops: list[tuple[str, str]] = []
    active = threading.Event()
    write = cdi.CdiDirectory.write_many

    calls: set[int] = set()  # the threads running the call now

    def profiler(frame: types.FrameType, event: str, _: object) -> None:
        if not active.is_set() or not frame.f_code.co_filename.startswith(package):
            return
        if frame.f_code.co_name == "NodePrepareResources":
            (calls.add if event == "call" else calls.discard)(threading.get_ident())
        if event != "call" or threading.get_ident() not in calls:
            return
        where = frame.f_code.co_filename[len(package) + 1 :]
        seen.setdefault(where, set()).add(frame.f_code.co_qualname)
        if frame.f_code is write.__code__ and not hops:
            hops.extend(_stack(frame, package))

    paths = PluginPaths.for_driver("gpu.dradriver.dev", root / "plugins", root / "registry")
    answers: list[Any] = []

    def kubelet() -> None:
        try:
            deadline = time.monotonic() + 30
            while not paths.registration_socket.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            kubeletclient.register(paths.registration_socket)
            with kubeletclient.DRAClient(paths.dra_socket) as client:
                client.wait_ready(30)
                active.set()
                answers.append(client.prepare([ClaimRef("default", "walk", uid)]))
                active.clear()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.setprofile(profiler)  # every thread started from now on: the gRPC server's
    threading.Thread(target=kubelet, daemon=True).start()
    cli(
        [
            "serve",
            "--kubelet-registry-dir", str(root / "registry"),
            "--kubelet-plugins-dir", str(root / "plugins"),
            "--cdi-dir", str(root / "cdi"),
            "--state-dir", str(root / "state"),
            "--claims-dir", str(root / "claims"),
            "--node-name", "node-1",
            "--fake-gpus", "dgx-h100",
        ]
    )  # fmt: skip
    threading.setprofile(None)  # type: ignore[arg-type,unused-ignore]
    assert answers, "no answer"
    assert not answers[0].claims[uid].error, answers
    imported = {
        m.__file__
        for m in list(sys.modules.values())
        if getattr(m, "__file__", None) and str(m.__file__).startswith(package)
    }
    return {
        "hops": [f"{qualname} ({where})" for qualname, where in hops],
        "hop_count": len(hops) - 1,
        "hop_files": sorted({where for _, where in hops}),
        "functions": sum(len(v) for v in seen.values()),
        "files": sorted(seen),
        "prepare_lines": _lines((src / "dradriver" / "prepare").rglob("*.py")),
        "serve_lines": _lines(Path(str(f)) for f in imported),
    }


def _claim(uid: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": "gpu.dradriver.dev", "pool": "node-1", "device": "gpu-0"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "walk", "namespace": "default", "uid": uid},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}]}
        },
        "status": {
            "allocation": {"devices": {"results": [result], "config": []}},
            "reservedFor": [{"resource": "pods", "name": "walk-pod", "uid": "pod-walk"}],
        },
    }


def _stack(frame: types.FrameType | None, package: str) -> list[tuple[str, str]]:
    """The in-project frames from the gRPC handler to `frame`, outermost first."""
    out: list[tuple[str, str]] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(package):
            out.append((frame.f_code.co_qualname, name[len(package) + 1 :]))
        frame = frame.f_back
    return out[::-1]


def _lines(paths: Iterator[Path] | Any) -> int:
    return sum(len(Path(p).read_text().splitlines()) for p in paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=Path("src"), help="the checkout's src/ to count")
    args = parser.parse_args()
    print(json.dumps(_walk(args.src.resolve()), indent=2))


if __name__ == "__main__":
    main()
