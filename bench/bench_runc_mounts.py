"""What the host driver's bind mounts of a claim's CDI spec cost the container runtime: `runc run`
of a trivial container whose OCI spec carries those mounts, against the same container without them.

Run as root where runc is installed (the runtime containerd starts the pods with):

    .venv/bin/python -m bench.bench_runc_mounts --rounds 40

The mounts are the ones `dradriver.prepare.hostdriver.driver_mounts` gives a host driver root that
has every compute library and tool (files of a few bytes: a bind mount's cost does not depend on
the file's size), with the options the spec gives them; the container (static busybox `true`,
read-only root) starts, runs and is deleted by `runc run`. The variants take turns round by round.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import summary
from dradriver.prepare.cdi import Mount
from dradriver.prepare.hostdriver import BINARIES, COMPUTE_LIBRARIES, driver_mounts

VERSION = "580.159.04"
LIB_DIR = "usr/lib/x86_64-linux-gnu"


def host_driver(root: Path) -> None:
    """A driver root as the NVIDIA installer leaves one: versioned libraries, their SONAME links."""
    libs = root / LIB_DIR
    libs.mkdir(parents=True)
    for library in COMPUTE_LIBRARIES:
        (libs / f"{library}.so.{VERSION}").write_bytes(b"\x7fELF")
        (libs / f"{library}.so.1").symlink_to(f"{library}.so.{VERSION}")
    (root / "usr/bin").mkdir(parents=True)
    for binary in BINARIES:
        (root / "usr/bin" / binary).write_bytes(b"\x7fELF")
        (root / "usr/bin" / binary).chmod(0o755)


def bundle(path: Path, busybox: Path, mounts: list[Mount]) -> Path:
    (path / "rootfs/bin").mkdir(parents=True)
    shutil.copy(busybox, path / "rootfs/bin/busybox")
    subprocess.run(["runc", "spec"], cwd=path, check=True)
    spec = json.loads((path / "config.json").read_text())
    spec["process"] |= {"terminal": False, "args": ["/bin/busybox", "true"]}
    spec["root"]["readonly"] = True
    spec["mounts"] += [
        {"destination": m.container_path, "type": "bind", "source": m.host_path, "options": list(m.options)}
        for m in mounts
    ]
    (path / "config.json").write_text(json.dumps(spec))
    return path


def run_once(path: Path, name: str) -> float:
    started = time.perf_counter()
    subprocess.run(["runc", "run", "--bundle", str(path), name], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--busybox", type=Path, default=Path(shutil.which("busybox") or "/bin/busybox"))
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runc-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        host_driver(work / "driver")
        every = driver_mounts(work / "driver", work / "driver", VERSION, "x86_64")
        sonames = [m for m in every if VERSION not in Path(m.container_path).name]
        variants = {
            "no mounts": [],
            f"SONAMEs only ({len(sonames)})": sonames,
            f"the spec's ({len(every)})": every,
        }
        bundles = {
            label: bundle(work / str(i), opts.busybox, m) for i, (label, m) in enumerate(variants.items())
        }
        times: dict[str, list[float]] = {label: [] for label in bundles}
        for n in range(opts.rounds + 1):
            order = list(bundles.items())
            for label, path in order[n % len(order) :] + order[: n % len(order)]:
                seconds = run_once(path, f"bench-{n}-{path.name}")
                if n:  # the first round warms up
                    times[label].append(seconds)
        for label, samples in times.items():
            print(summary(f"runc run, {label}", samples))
        base = statistics.median(times["no mounts"])
        for label, mounts in variants.items():
            if mounts:
                extra = statistics.median(times[label]) - base
                print(f"{label}: +{extra * 1e3:.2f} ms, {extra / len(mounts) * 1e6:.0f} us per mount")


if __name__ == "__main__":
    main()
