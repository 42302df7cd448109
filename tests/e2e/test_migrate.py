"""NVIDIA's GPU and MIG specs and device-plugin workloads, through `dradriver migrate`, on the
real cluster with the `fake` DaemonSet on the profile each row of tests/offline/migrate/cases.yaml names.

Per row: `dradriver migrate <spec>` (the CLI's entry point) and `kubectl apply` of its output; the pods
reach exactly the phases the row names (Pending ones unschedulable with the scheduler's "cannot
allocate all claims"); inside every running container are the device nodes, env and mounts its
claims' CDI specs promise; a finished container printed its devices' variables; MPS claims show
the stand-in control daemon's settings (inside the containers, or on the node where the
containers need a real GPU and exit); `needsGpu` rows, whose CUDA or nvidia-smi commands fail on
fake GPUs, have every pod's claims allocated and reserved for it and its containers created with
the CDI devices. After deletion the node has unprepared everything. Refused specs fail with the
reason migrate reports and apply nothing.

The images the specs name are local stand-ins (tests/e2e/standins.py): nothing is pulled here.

`make e2e` runs the rows of CI_ROWS (each says what it adds; the whole table takes several
minutes more than the e2e budget allows); DRADRIVER_E2E_MIGRATE_ALL=1 runs every row.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dradriver.backend.fake.mps_standin import STATE_FILE
from dradriver.cli import main
from dradriver.prepare.sharing_settings import MPS_PIPE_IN_CONTAINER, mps_directory
from tests.e2e.plugin import DRIVER, STATE_DIR, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.standins import import_standins
from tests.e2e.workloads import (
    ClaimHistory,
    ContainerDevices,
    Json,
    check_container,
    check_log,
    claim_history,
    claim_names,
    claims_of,
    events_for,
    pods_of,
    promised,
    promised_by_specs,
    unschedulable,
    wait_unprepared,
)
from tests.offline.migrate.table import FIXTURES, Case, cases, row_id

ALL_ENV = "DRADRIVER_E2E_MIGRATE_ALL"

#: The rows `make e2e` runs, by row id, and what each adds: every kind of translation, every fake
#: profile, MPS, MIG, the device plugin's resources and GFD's labels, unsatisfiable rows.
CI_ROWS = {
    "nvidia/tests/bats/specs/gpu-mps@dgx-h100": "mpsConfig -> mps: the stand-in daemon's settings "
    "inside both containers",
    "nvidia/tests/bats/specs/gpu-cel-nomatch@dgx-h100": "a CEL selector on NVIDIA's attribute domain, "
    "Pending as NVIDIA intends",
    "nvidia/demo/specs/extended-resources/gpu-full@dgx-h100": "nvidia.com/gpu limits in NVIDIA's demo, "
    "needsGpu (a CUDA sample that exits at once)",
    "device-plugin/gpu-2@dgx-h100": "the device plugin's nvidia.com/gpu: 2, in a Job",
    "device-plugin/gfd-product@dgx-h100": "GFD's product label as a productName selector, a Deployment",
    "nvidia/demo/specs/quickstart/v1/gpu-test4@dgx-a100-40gb-mig": "A100-40GB MIG profiles as "
    "selectors, matchAttribute parentUUID",
    "nvidia/demo/specs/quickstart/v1/gpu-test5@dgx-a100-40gb-mig": "timeSlicingConfig and mpsConfig "
    "in one claim, needsGpu: prepared, the MPS daemon's settings on the node",
    "nvidia/demo/specs/quickstart/v1beta1/gpu-test6@dgx-a100-40gb-mig": "resource.k8s.io/v1beta1 -> v1, "
    "productName regex, NVIDIA's index as minor: two replicas Running, two Pending",
    "device-plugin/mig-1g-10gb@dgx-a100-mig": "the device plugin's nvidia.com/mig-1g.10gb: 1 as a MIG "
    "request (its capability device listed), beside an init container",
    "device-plugin/gfd-memory-family@dgx-a100-mig": "GFD memory (Gt), family and compute capability",
    "nvidia/tests/bats/specs/gpu-multiple-mig@dgx-h100-mig": "H100 MIG layout, capacity selectors on "
    "two MIG devices",
    "nvidia/demo/specs/extended-resources/mig-1g-12gb@dgx-h100-mig": "a migrated DeviceClass with "
    "extendedResourceName: Pending",
    "device-plugin/gfd-memory-family@t4x4": "the same GFD selectors on T4s (15360 MiB, Turing): Pending",
    "device-plugin/gfd-any-of@mixed": "ORed GFD node selector terms as one CEL selector: Pending",
}
#: The fake overlay's own profile first, then each profile once.
PROFILE_ORDER = ["dgx-h100", "dgx-a100-40gb-mig", "dgx-a100-mig", "dgx-h100-mig", "t4x4", "mixed"]
#: The MPS pinned-memory limits of the specs, as the control daemon is told them.
PINNED_LIMITS = {"10Gi": "10240M"}
UNSATISFIABLE = "cannot allocate all claims"


def runs(every_row: bool) -> list[Case]:
    """The rows to run (the CI rows, or every row), those of one profile (with its serve flags)
    together: the profiles of PROFILE_ORDER first, in its order, then the others by name."""

    def order(row: Case) -> tuple[int, str]:
        profile = row["profile"]
        return (PROFILE_ORDER.index(profile) if profile in PROFILE_ORDER else len(PROFILE_ORDER), profile)

    chosen = [r for r in cases() if r["expected"] != "migrate-error" and (every_row or row_id(r) in CI_ROWS)]
    return sorted(chosen, key=order)


RUNS = runs(bool(os.environ.get(ALL_ENV)))
REFUSED = [r for r in cases() if r["expected"] == "migrate-error"]


def test_every_row_of_the_table_can_be_run() -> None:
    every = runs(every_row=True)
    assert len(every) == len([r for r in cases() if r["expected"] != "migrate-error"])
    profiles = [r["profile"] for r in every]
    assert profiles[0] == PROFILE_ORDER[0]  # the fake overlay's own profile first
    # A profile's rows are run together: the cluster's node is set up once for each.
    assert len(list(itertools.groupby(profiles))) == len(set(profiles))


def test_every_ci_row_is_in_the_table() -> None:
    ids = {row_id(r) for r in cases() if r["expected"] != "migrate-error"}
    assert set(CI_ROWS) <= ids, f"CI_ROWS names rows cases.yaml lacks: {set(CI_ROWS) - ids}"
    assert {r["profile"] for r in cases() if row_id(r) in CI_ROWS} == set(PROFILE_ORDER)


@dataclass(frozen=True)
class Migrated:
    code: int
    stdout: str
    stderr: str


@functools.cache
def _migrate(spec: str) -> Migrated:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["migrate", str(FIXTURES / spec)])
    return Migrated(code, out.getvalue(), err.getvalue())


def migrate(row: Case) -> Migrated:
    """`dradriver migrate <spec>` (the CLI's entry point, in this process: a row's output is
    needed twice, for its images and to apply it)."""
    return _migrate(row["spec"])


@pytest.fixture(scope="module")
def standin_images(real_cluster: RealCluster) -> None:
    """The images of the rows that run, as local stand-ins (an existing cluster pulls them)."""
    if real_cluster.local is None:
        return
    references = set()
    for row in RUNS:
        for doc in yaml.safe_load_all(migrate(row).stdout):
            references |= {c["image"] for c in _containers(doc)}
    import_standins(real_cluster.local, references)


def _containers(doc: Json | None) -> list[Json]:
    if not doc or doc.get("kind") not in {"Pod", "Job", "Deployment"}:
        return []
    spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.cluster
@pytest.mark.parametrize("row", REFUSED, ids=row_id)
def test_refused_spec_names_the_reason_and_applies_nothing(real_cluster: RealCluster, row: Case) -> None:
    done = migrate(row)
    assert done.code == 2, done.stderr
    assert row["reason"] in done.stderr
    applied = real_cluster.kubectl("apply", "-f", "-", stdin=done.stdout, check=False)
    assert applied.returncode != 0, applied.stdout
    assert "no objects passed to apply" in applied.stderr


@pytest.mark.cluster
@pytest.mark.parametrize("row", RUNS, ids=row_id)
def test_migrated_spec_runs_on_its_profile(
    real_cluster: RealCluster,
    fake_deployment: Deployment,
    standin_images: None,
    row: Case,
    tmp_path: Path,
) -> None:
    done = migrate(row)
    assert done.code == 0, done.stderr
    path = tmp_path / "migrated.yaml"
    path.write_text(done.stdout)
    documents = [d for d in yaml.safe_load_all(done.stdout) if d]
    fake_deployment.use_profile(row["profile"])
    expected = Counter[str](row["pods"])
    mps_claims: set[str] = set()
    try:
        if row.get("needsGpu"):
            with claim_history(real_cluster) as history:
                _apply(real_cluster, path, documents)
                pods = _wait_created(real_cluster, documents, expected.total())
                for pod in pods:
                    _check_reserved(history, pod)
        elif expected["Succeeded"]:
            # A finished pod's CDI specs are gone before it can be looked at: keep copies.
            with fake_deployment.recording_cdi() as recorder:
                _apply(real_cluster, path, documents)
                pods = _wait_phases(real_cluster, documents, expected)
                specs = recorder.specs()
            _check_pods(real_cluster, fake_deployment, pods, specs)
        else:
            _apply(real_cluster, path, documents)
            pods = _wait_phases(real_cluster, documents, expected)
            _check_pods(real_cluster, fake_deployment, pods, [])
        real_cluster.kubectl("get", "-f", str(path))  # every object is there
        if _has_mps(documents):
            mps_claims = _check_mps(real_cluster, fake_deployment, pods, inside=not row.get("needsGpu"))
    finally:
        _delete(real_cluster, path, documents)
    wait(lambda: not pods_of(real_cluster, documents, terminating=True), 60, f"{row_id(row)}: pods gone")
    wait_unprepared(fake_deployment)
    left = fake_deployment.exec("sh", "-c", f"ls -1 {STATE_DIR}/mps 2>/dev/null || true").split()
    assert not mps_claims & set(left), f"MPS directories left behind: {mps_claims & set(left)}"


def _describe(cluster: RealCluster, pods: list[Json]) -> str:
    lines = []
    for pod in pods:
        status = pod.get("status", {})
        states = [next(iter(s.get("state", {})), "?") for s in status.get("containerStatuses", [])]
        events = [f"{e['reason']}: {e['message']}" for e in events_for(cluster, pod)][-3:]
        lines.append(f"{pod['metadata']['name']}: {status.get('phase')} {states} {events}")
    return "; ".join(lines) or "no pods"


def _category(pod: Json) -> str | None:
    """The phase the table names for a settled pod; None while it is still on its way."""
    phase = pod.get("status", {}).get("phase")
    if phase == "Pending":
        return "Pending" if unschedulable(pod) else None
    return str(phase)


def _wait_phases(cluster: RealCluster, documents: list[Json], expected: Counter[str]) -> list[Json]:
    def settled() -> tuple[list[Json]] | None:  # a tuple: true also when no pod is expected
        pods = pods_of(cluster, documents)
        return (pods,) if Counter(_category(p) for p in pods) == expected else None

    try:
        found: tuple[list[Json]] = wait(settled, 120, f"pods {dict(expected)}", interval=0.3)
    except AssertionError as err:
        raise AssertionError(f"{err}; pods: {_describe(cluster, pods_of(cluster, documents))}") from None
    return found[0]


def _created(pod: Json) -> bool:
    """Every container was created by the runtime (with its CDI devices): past ContainerCreating."""
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return len(statuses) == len(pod["spec"]["containers"]) and all(s.get("containerID") for s in statuses)


def _wait_created(cluster: RealCluster, documents: list[Json], count: int) -> list[Json]:
    def created() -> list[Json] | None:
        pods = [p for p in pods_of(cluster, documents) if _created(p)]
        return pods if len(pods) >= count else None

    try:
        pods: list[Json] = wait(created, 120, f"{count} pod(s) past ContainerCreating", interval=0.3)
    except AssertionError as err:
        raise AssertionError(f"{err}; pods: {_describe(cluster, pods_of(cluster, documents))}") from None
    return pods


def _check_reserved(history: ClaimHistory, pod: Json) -> None:
    meta = pod["metadata"]
    names = claims_of(pod)
    assert names, f"{meta['name']}: no ResourceClaim"
    for name in names:
        wait(
            lambda name=name: history.reserved(meta["namespace"], name, meta["uid"]),
            30,
            f"claim {meta['namespace']}/{name} allocated and reserved for pod {meta['name']}",
        )


def _check_pods(cluster: RealCluster, deployment: Deployment, pods: list[Json], specs: list[Json]) -> None:
    """Pending pods: the scheduler's reason; running ones: their devices inside; finished ones:
    one CDI spec per claim while they ran, and what they printed of their devices."""
    for pod in pods:
        if _category(pod) == "Pending":
            message = next(c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
            assert UNSATISFIABLE in message, message

    def check_running(pod: Json) -> None:
        for promise in promised(cluster, deployment, pod):
            check_container(cluster, promise)

    # Pods at once: each check is a few kubectl calls that mostly wait on the node.
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(check_running, [p for p in pods if _category(p) == "Running"]))
    finished = [p for p in pods if _category(p) == "Succeeded"]
    if not finished:
        return
    prepared = {
        (p["metadata"]["namespace"], name) for p in pods if _category(p) != "Pending" for name in claims_of(p)
    }
    assert len(specs) == len(prepared), f"{len(specs)} CDI specs recorded for claims {sorted(prepared)}"
    for pod in finished:
        commands = {
            c["name"]: " ".join([*c.get("command", []), *c.get("args", [])])
            for c in pod["spec"]["containers"]
        }
        for promise in promised_by_specs(pod, specs):
            command = commands[promise.container]
            if "ls -l /dev/nvidia*" in command:
                check_log(cluster, promise)
            if "ls -l /dev/nvidia-caps" in command:
                _check_listed_caps(cluster, promise)
            if "DRADRIVER" in command:
                _check_printed_devices(cluster, promise)


def _check_printed_devices(cluster: RealCluster, promise: ContainerDevices) -> None:
    """The DRADRIVER_DEVICE_* variables a container printed are exactly those its devices promise."""
    log = cluster.kubectl("-n", promise.namespace, "logs", promise.pod, "-c", promise.container).stdout
    printed = dict(
        line.partition("=")[::2] for line in log.splitlines() if line.startswith("DRADRIVER_DEVICE_")
    )
    wanted = {k: v for k, v in promise.env.items() if k.startswith("DRADRIVER_DEVICE_")}
    assert wanted, f"{promise.pod}/{promise.container}: no device variable promised"
    assert printed == wanted, f"{promise.pod}/{promise.container} printed {printed}, promised {wanted}"


_LS_CAP = re.compile(r"^c\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(nvidia-cap\d+)$")


def _check_listed_caps(cluster: RealCluster, promise: ContainerDevices) -> None:
    """`ls -l /dev/nvidia-caps` in the container listed exactly the MIG capability devices promised."""
    log = cluster.kubectl("-n", promise.namespace, "logs", promise.pod, "-c", promise.container).stdout
    listed = {
        f"/dev/nvidia-caps/{m[3]}": (int(m[1]), int(m[2])) for m in map(_LS_CAP.match, log.splitlines()) if m
    }
    wanted = {k: v for k, v in promise.device_nodes.items() if k.startswith("/dev/nvidia-caps/")}
    assert wanted, f"{promise.pod}/{promise.container}: no MIG capability device promised"
    assert listed == wanted, f"{promise.pod}/{promise.container} listed {listed}, promised {wanted}"


def _check_mps(cluster: RealCluster, deployment: Deployment, pods: list[Json], inside: bool) -> set[str]:
    """For every claim with an MPS config: the stand-in daemon has the claim's MPS GPUs and the
    settings of the config, seen through the pipe directory in each container that uses the
    claim (`inside`), else in the node's state directory. Returns the MPS claims' UIDs."""
    uuids = {
        d["name"]: d["attributes"]["uuid"]["string"]
        for s in deployment.slices()
        for d in s["spec"].get("devices", [])
    }
    checked: set[str] = set()
    for pod in pods:
        if _category(pod) == "Pending":
            continue
        namespace = pod["metadata"]["namespace"]
        pod_claims = claim_names(pod)
        for name in claims_of(pod):
            claim = cluster.get_json("resourceclaim", "-n", namespace, name)
            mps = _mps_config(claim)
            if mps is None:
                continue
            requests, settings = mps
            results = claim["status"]["allocation"]["devices"]["results"]  # type: ignore[index]
            gpus = sorted(
                uuids[r["device"]] for r in results if r["driver"] == DRIVER and r["request"] in requests
            )
            uid = claim["metadata"]["uid"]  # type: ignore[index]
            limit = PINNED_LIMITS[settings["defaultPinnedDeviceMemoryLimit"]]
            expected = {
                "devices": gpus,
                "defaultActiveThreadPercentage": settings["defaultActiveThreadPercentage"],
                "defaultDevicePinnedMemLimit": dict.fromkeys(gpus, limit),
            }
            if inside:
                users = [
                    c["name"]
                    for c in pod["spec"]["containers"]
                    if any(
                        pod_claims[r["name"]] == name for r in (c.get("resources") or {}).get("claims", [])
                    )
                ]
                assert users, f"{pod['metadata']['name']}: no container uses claim {name}"
                seen = [
                    cluster.kubectl(
                        "-n",
                        namespace,
                        "exec",
                        pod["metadata"]["name"],
                        "-c",
                        user,
                        "--",
                        "cat",
                        f"{MPS_PIPE_IN_CONTAINER}/{STATE_FILE}",
                    ).stdout
                    for user in users
                ]
            else:
                seen = [deployment.exec("cat", f"{STATE_DIR}/mps/{mps_directory(uid)}/pipe/{STATE_FILE}")]
            for text in seen:
                state = json.loads(text)
                got = {k: sorted(state[k]) if k == "devices" else state[k] for k in expected}
                assert got == expected, f"claim {namespace}/{name}: MPS daemon {got}, expected {expected}"
            checked.add(uid)
    return checked


def _has_mps(documents: list[Json]) -> bool:
    return any(
        (c.get("opaque", {}).get("parameters", {}).get("sharing") or {}).get("strategy") == "MPS"
        for d in documents
        if d["kind"] in {"ResourceClaim", "ResourceClaimTemplate"}
        for c in (d["spec"]["spec"] if d["kind"] == "ResourceClaimTemplate" else d["spec"])["devices"].get(
            "config", []
        )
    )


def _mps_config(claim: Json) -> tuple[set[str], Json] | None:
    """The requests an MPS config of the claim applies to, and its `mps` settings."""
    for config in claim["spec"]["devices"].get("config", []):
        parameters = config.get("opaque", {}).get("parameters", {})
        sharing = parameters.get("sharing") or {}
        if config.get("opaque", {}).get("driver") == DRIVER and sharing.get("strategy") == "MPS":
            return set(config.get("requests", [])), sharing["mps"]
    return None


def _delete(cluster: RealCluster, path: Path, documents: list[Json]) -> None:
    """Delete what the row applied. Pods whose PID 1 is `sleep` ignore SIGTERM, and the kubelet
    keeps the grace period a pod's deletion began with (30 s when the garbage collector deletes a
    Deployment's pods): so a Deployment and its ReplicaSets go first, leaving their pods, which
    are then deleted with one second. How they end is not what the rows are about."""
    for doc in documents:
        if doc["kind"] == "Deployment":
            namespace = doc["metadata"].get("namespace", "default")
            labels = doc["spec"]["selector"]["matchLabels"]
            selector = ",".join(f"{k}={v}" for k, v in labels.items())
            cluster.kubectl(
                "-n", namespace, "delete", "deployment", doc["metadata"]["name"], "--cascade=orphan"
            )
            cluster.kubectl("-n", namespace, "delete", "replicasets", "-l", selector, "--cascade=orphan")
    for pod in pods_of(cluster, documents):
        meta = pod["metadata"]
        cluster.kubectl(
            "-n", meta["namespace"], "delete", "pod", meta["name"], "--grace-period=1", "--wait=false"
        )
    # Not waiting for namespaces to be finalized: a row that reuses one waits for that (_apply).
    cluster.kubectl("delete", "-f", str(path), "--ignore-not-found", "--wait=false")


def _apply(cluster: RealCluster, path: Path, documents: list[Json]) -> None:
    """`kubectl apply`, once no namespace it creates is still being deleted by an earlier row."""
    namespaces = [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"]

    def free() -> bool:
        found = cluster.kubectl("get", "namespaces", "-o", "json", check=False)
        phases = {n["metadata"]["name"]: n["status"]["phase"] for n in json.loads(found.stdout)["items"]}
        return all(phases.get(name, "Active") == "Active" for name in namespaces)

    if namespaces:
        wait(free, 120, f"namespaces {namespaces} deleted by an earlier row")
    cluster.kubectl("apply", "-f", str(path))
