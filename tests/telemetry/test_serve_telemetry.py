"""`serve`'s device telemetry end to end: a real serve process on fake GPUs, claims from an API
server (the loopback fake, and the real one of `make e2e`), prepared over the DRA socket; the
fake backend's figures set with `dradriver fake-event`; /metrics scraped over HTTP; `dradriver
top` run as a command; idle claims reported as Events through the API server."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from dradriver import kubeletclient
from dradriver.health import HEALTH_FILE
from dradriver.plugin.driver import ClaimRef
from tests.helpers import ServeProcess, allocated_claim, free_port, http_get, short_tmpdir, uid, wait_for
from tests.publish.apiservers import TEST_DRIVER, Backend, create_allocated_claim
from tests.publish.test_serve_cluster import serve_on


def make_pod(backend: Backend, name: str) -> tuple[str, str]:
    """A Pod bound to the test's node (no kubelet runs there: it stays Pending), so a real
    cluster's resourceclaim controller keeps the reservation for it; its name and UID."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": backend.nodes[-1], "containers": [{"name": "app", "image": "busybox:1.37"}]},
    }
    created = backend.direct.request("POST", "/api/v1/namespaces/default/pods", body=pod)
    backend.pods.append(name)
    return name, str(created["metadata"]["uid"])


def claim_for(backend: Backend, name: str, device: str, pods: list[tuple[str, str]]) -> ClaimRef:
    claim: dict[str, Any] = allocated_claim(
        name, uid(0), [{"request": "gpu", "device": device}], pool=backend.nodes[-1], driver=TEST_DRIVER
    )
    del claim["metadata"]["uid"]
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in pods]
    created = create_allocated_claim(backend, claim)
    return ClaimRef("default", name, created["metadata"]["uid"])


def in_pod(proc: Path, pid: int, pod_uid: str) -> None:
    """A process of that pod, as its cgroup file says (systemd cgroup driver, cgroup v2)."""
    (proc / str(pid)).mkdir(parents=True)
    slice_name = f"kubepods-besteffort-pod{pod_uid.replace('-', '_')}.slice"
    (proc / str(pid) / "cgroup").write_text(f"0::/kubepods.slice/{slice_name}/cri-containerd-1.scope\n")


def samples(port: int, *names: str) -> list[Any]:
    """The samples of `names` in one scrape."""
    status, text = http_get(port, "/metrics")
    assert status == 200
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name in names]


def values(port: int, names: Sequence[str], **labels: str) -> dict[str, float]:
    """The first value of each of `names` with `labels`, from one scrape (a reading between two
    scrapes would move the series apart); a series not there is left out."""
    found: dict[str, float] = {}
    for s in samples(port, *names):
        if labels.items() <= s.labels.items():
            found.setdefault(s.name, s.value)
    return found


def value(port: int, name: str, **labels: str) -> float | None:
    return values(port, (name,), **labels).get(name)


def test_a_claims_load_shows_in_its_series_split_per_pod_and_an_idle_claim_gets_events(
    backend: Backend, tmp_path: Path
) -> None:
    node = backend.make_node()
    pod_a, pod_b, pod_c = (make_pod(backend, f"pod-{x}") for x in "abc")
    port = free_port()
    proc = tmp_path / "proc"
    in_pod(proc, 1001, pod_a[1])
    in_pod(proc, 1002, pod_b[1])
    with short_tmpdir() as root:
        serve = serve_on(
            backend,
            root,
            node,
            "--metrics-address",
            f"127.0.0.1:{port}",
            "--telemetry-interval",
            "0.2",
            "--proc-root",
            str(proc),
            "--idle-threshold",
            "10",
            "--idle-window",
            "1",
        )
        try:
            # gpu-1 is busy before its claim is prepared: only "idle" may ever be reported idle
            state_dir = serve.plugins_dir / TEST_DRIVER
            wait_for((state_dir / HEALTH_FILE).exists, 15, "the health report fake-event checks devices in")
            subprocess.run(
                [
                    sys.executable, "-m", "dradriver", "fake-event", "--state-dir", str(state_dir),
                    "--device", "gpu-1", "--utilization", "80",
                    "--process", "1001:10Gi:50", "--process", "1002:2Gi:30", "--process", "4242:1Gi:5",
                ],
                check=True,
                capture_output=True,
            )  # fmt: skip
            busy = claim_for(backend, "busy", "gpu-1", [pod_a, pod_b])
            idle = claim_for(backend, "idle", "gpu-2", [pod_c])
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                response = client.prepare([busy, idle])
                assert [response.claims[r.uid].error for r in (busy, idle)] == ["", ""]
            sm = "dradriver_gpu_sm_utilization_ratio"
            wait_for(
                lambda: value(port, sm, device="gpu-1", claim_name="busy") == 0.8,
                10,
                f"gpu-1's load under its claim (log: {serve.log()})",
            )
            (series,) = [s for s in samples(port, sm) if s.labels["device"] == "gpu-1"]
            assert series.labels | {} == {
                "device": "gpu-1",
                "uuid": series.labels["gpu_uuid"],
                "gpu_uuid": series.labels["uuid"],
                "claim_namespace": "default",
                "claim_name": "busy",
                "claim_uid": busy.uid,
                "pods": "default/pod-a,default/pod-b",
                "sharing": "",
            }
            # 4242 is in no pod of the claim: left out of the split, counted in the device's memory
            assert value(port, "dradriver_gpu_framebuffer_used_bytes", device="gpu-1") == 13 * 1024**3
            pod_sm = "dradriver_pod_gpu_sm_utilization_ratio"
            assert value(port, pod_sm, pod="pod-a", claim_name="busy") == 0.5
            assert value(port, pod_sm, pod="pod-b", claim_name="busy") == 0.3
            assert value(port, "dradriver_pod_gpu_framebuffer_used_bytes", pod="pod-a") == 10 * 1024**3
            assert value(port, "dradriver_gpu_sm_utilization_ratio", device="gpu-5", claim_name="") == 0

            top = subprocess.run(
                [sys.executable, "-m", "dradriver", "top", "--metrics-address", f"127.0.0.1:{port}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            lines = top.splitlines()
            assert all(len(line) <= 80 for line in lines)
            (row,) = [line for line in lines if line.startswith("gpu-1 ")]
            assert row.split()[1:] == ["80%", "13.0/80G", "70W", "35C", "default/busy"]
            following = lines[lines.index(row) + 1 : lines.index(row) + 3]
            assert [line.split() for line in following] == [
                ["50%", "10.0G", "└", "pod", "default/pod-a"],
                ["30%", "2.0G", "└", "pod", "default/pod-b"],
            ]

            ours = {busy.uid, idle.uid, pod_a[1], pod_b[1], pod_c[1]}  # a real cluster has others'

            def idle_events() -> list[tuple[str, str]]:
                events = backend.direct.request("GET", "/api/v1/namespaces/default/events")["items"]
                return sorted(
                    (e["involvedObject"]["kind"], e["involvedObject"]["name"])
                    for e in events
                    if e.get("reason") == "GPUIdle" and e["involvedObject"].get("uid") in ours
                )

            wait_for(lambda: idle_events() == [("Pod", "pod-c"), ("ResourceClaim", "idle")], 15, "Events")
            # The Events are sent as the reading is taken, before /metrics serves it.
            wait_for(
                lambda: (value(port, "dradriver_claim_idle_seconds", claim_name="idle") or 0) >= 1,
                10,
                "the idle seconds",
            )
            assert value(port, "dradriver_claim_idle_seconds", claim_name="busy") is None
            assert "claim idle" in serve.log()
        finally:
            serve.kill()


def test_without_tenant_labels_metrics_name_no_claim_pod_or_namespace() -> None:
    """`DRADRIVER_METRICS_TENANT_LABELS=false` (the flag's variable): a prepared claim's device
    is reported, under no claim, pod or namespace name."""
    port = free_port()
    claim = allocated_claim(
        "secret-claim", uid(7), [{"request": "gpu", "device": "gpu-0"}], namespace="team-x"
    )
    args = ["--metrics-address", f"127.0.0.1:{port}", "--telemetry-interval", "0.2"]
    with short_tmpdir() as root:
        serve = ServeProcess(root, args, env={"DRADRIVER_METRICS_TENANT_LABELS": "false"})
        (serve.claims_dir / "secret-claim.yaml").write_text(yaml.safe_dump(claim))
        serve.start()
        try:
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                ref = ClaimRef("team-x", "secret-claim", uid(7))
                assert client.prepare([ref]).claims[ref.uid].error == ""
            prepared_at = time.time()
            wait_for(
                lambda: (value(port, "dradriver_telemetry_timestamp_seconds") or 0) > prepared_at,
                10,
                f"a reading after the prepare (log: {serve.log()})",
            )
            (gpu0,) = [
                s
                for s in samples(port, "dradriver_gpu_sm_utilization_ratio")
                if s.labels["device"] == "gpu-0"
            ]
            assert set(gpu0.labels) == {"device", "uuid", "gpu_uuid", "sharing"}
            text = http_get(port, "/metrics")[1]
            assert "secret-claim" not in text
            assert "team-x" not in text
            assert uid(7) not in text
        finally:
            serve.kill()


def test_a_claims_cost_counters_carry_on_across_a_serve_killed_and_restarted() -> None:
    """Allocated device-seconds run from the claim's prepare time in the checkpoint; busy ones
    are written to the state directory before they are served: neither goes back after `kill -9`."""
    port = free_port()
    claim = allocated_claim("train", uid(8), [{"request": "gpu", "device": "gpu-0"}], namespace="ml")
    args = ["--metrics-address", f"127.0.0.1:{port}", "--telemetry-interval", "0.2"]
    allocated, busy = (
        "dradriver_gpu_allocated_device_seconds_total",
        "dradriver_gpu_busy_device_seconds_total",
    )
    with short_tmpdir() as root:
        serve = ServeProcess(root, args)
        (serve.claims_dir / "train.yaml").write_text(yaml.safe_dump(claim))
        serve.start()
        try:
            state_dir = serve.plugins_dir / serve.driver
            wait_for((state_dir / HEALTH_FILE).exists, 15, "the health report fake-event checks devices in")
            subprocess.run(
                [sys.executable, "-m", "dradriver", "fake-event", "--state-dir", str(state_dir),
                 "--device", "gpu-0", "--utilization", "100"],
                check=True,
                capture_output=True,
            )  # fmt: skip
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                ref = ClaimRef("ml", "train", uid(8))
                assert client.prepare([ref]).claims[ref.uid].error == ""
            wait_for(
                lambda: (value(port, busy, claim_name="train") or 0) > 0,
                10,
                f"busy time (log: {serve.log()})",
            )
            before = values(port, (allocated, busy), claim_name="train")
            assert value(port, "dradriver_gpu_allocated_devices", claim_name="train") == 1
            assert before[busy] <= before[allocated]
            serve.kill()
            restarted = time.time()
            serve.start(wait=False)
            wait_for(
                lambda: (
                    http_get(port, "/metrics")[0] == 200
                    and (value(port, "dradriver_telemetry_timestamp_seconds") or 0) > restarted
                ),
                20,
                f"a reading of the restarted serve (log: {serve.log()})",
            )
            after = values(port, (allocated, busy), claim_name="train")
            assert after[allocated] > before[allocated]
            assert after[busy] >= before[busy] > 0
        finally:
            serve.kill()
