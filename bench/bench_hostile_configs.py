"""Issue 40 figure: hostile opaque configs are answered in milliseconds, liveness throughout.

    .venv/bin/python -m bench.bench_hostile_configs [--runs 100]

A real `serve` on fake GPUs (claims from files) is sent, one NodePrepareResources call per
claim, claims whose opaque config is hostile: huge exponents, huge mantissas, long strings, deep
nesting (the cases of tests/robustness/test_hostile_configs.py). Every run's config differs from
the others' (a varied device key), so each is checked for the first time; a last round repeats
them all (the cached error). Meanwhile `dradriver healthcheck`, the liveness probe, runs in a
loop. Prints median and p99 answer times per case and the probes' results, for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from bench.common import percentile
from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import ServeProcess, allocated_claim, healthcheck, opaque, short_tmpdir, uid, wait_for
from tests.robustness.test_hostile_configs import HOSTILE


def varied(parameters: dict[str, Any], run: int) -> dict[str, Any]:
    """The config with a device key of its own, so that no two runs share a cached result."""
    copy: dict[str, Any] = json.loads(json.dumps(parameters))
    sharing = copy.get("sharing")
    if isinstance(sharing, dict):
        mps = sharing.setdefault("mps", {}) if sharing.get("strategy") == "MPS" else sharing
        if "perDevicePinnedMemoryLimit" in mps and len(mps["perDevicePinnedMemoryLimit"]) > 1:
            mps["perDevicePinnedMemoryLimit"][f"gpu-run-{run}"] = "1Gi"
        elif sharing.get("strategy") == "MPS":
            mps.setdefault("perDevicePinnedMemoryLimit", {})[f"gpu-run-{run}"] = "1Gi"
        else:
            sharing[f"run{run}"] = {}
    else:
        copy[f"run{run}"] = 1
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    with short_tmpdir() as root:
        serve = ServeProcess(root).start()
        try:
            refs: dict[str, list[ClaimRef]] = {}
            n = 0
            for case, (parameters, _) in HOSTILE.items():
                for run in range(args.runs):
                    n += 1
                    claim = allocated_claim(
                        f"c{n}",
                        uid(n),
                        [{"request": "gpu", "device": "gpu-0"}],
                        config=[opaque(varied(parameters, run))],
                    )
                    (serve.claims_dir / f"c{n}.json").write_text(json.dumps(claim))
                    refs.setdefault(case, []).append(ClaimRef("default", f"c{n}", uid(n)))
            probes: list[tuple[int, float]] = []
            done = threading.Event()

            def probe() -> None:
                while not done.is_set():
                    start = time.perf_counter()
                    result = healthcheck(serve)
                    probes.append((result.returncode, time.perf_counter() - start))

            with kubeletclient.DRAClient(serve.dra_socket) as client:
                # The first fetch reads every claim file; not what is measured.
                client.prepare([refs["deep"][0]], timeout=600)
                prober = threading.Thread(target=probe)
                prober.start()
                wait_for(lambda: len(probes) > 0, 60, "a first probe")
                print("| case | first check median | p99 | max | cached retry median |")
                print("| --- | --- | --- | --- | --- |")
                for case, case_refs in refs.items():
                    first: list[float] = []
                    again: list[float] = []
                    for samples in (first, again):
                        for ref in case_refs[1:] if samples is first else case_refs[1:11]:
                            start = time.perf_counter()
                            error = client.prepare([ref], timeout=60).claims[ref.uid].error
                            samples.append(time.perf_counter() - start)
                            assert error, ref
                    print(
                        f"| {case} | {statistics.median(first) * 1e3:.1f} ms "
                        f"| {percentile(first, 99) * 1e3:.1f} ms | {max(first) * 1e3:.1f} ms "
                        f"| {statistics.median(again) * 1e3:.1f} ms |"
                    )
                done.set()
                prober.join()
            failed = sum(1 for code, _ in probes if code != 0)
            slowest = max(seconds for _, seconds in probes)
            print(
                f"\nliveness probes during the runs: {len(probes)}, failed: {failed}, slowest {slowest:.2f} s"
            )
        finally:
            serve.kill()


if __name__ == "__main__":
    main()
