"""Shares of shared GPUs (consumable capacity): each prepared as its own CDI device, held to its
amounts by one MPS daemon per GPU (the stand-in here) that starts with the first share and stops
with the last; over real files, real daemon processes and the checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver import kubeletclient
from dradriver.backend.fake.mps_standin import STATE_FILE
from dradriver.devicemodel.shares import SharePolicy
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import ClaimRecord, ClaimState
from dradriver.prepare.gpu_driver import GpuDriver
from dradriver.prepare.gpu_share_daemons import SHARES_DIRECTORY, ShareDaemons, daemon_key, host_share_daemons
from dradriver.prepare.sharing_settings import MPS_STANDIN, MpsDaemons
from tests.helpers import (
    DRIVER,
    ServeProcess,
    allocated_claim,
    opaque,
    process_alive,
    short_tmpdir,
    uid,
    wait_for,
)
from tests.prepare.node import Node

GIB = "Gi"


class CountingDaemons(MpsDaemons):
    """The stand-in's daemons, counting starts and stops."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(MPS_STANDIN, state_dir / SHARES_DIRECTORY)
        self.starts = 0
        self.stops = 0

    def start(self, claim_uid: str, *args: Any, **kwargs: Any) -> Any:
        self.starts += 1
        return super().start(claim_uid, *args, **kwargs)

    def stop(self, claim_uid: str) -> None:
        self.stops += 1
        super().stop(claim_uid)


@pytest.fixture
def node() -> Iterator[Node]:
    with short_tmpdir() as root:
        yield Node(root, "dgx-h100")


def _shares(node: Node, policy: SharePolicy | None = None) -> tuple[ShareDaemons, CountingDaemons]:
    daemons = CountingDaemons(node.root / "state")
    return ShareDaemons(policy or SharePolicy("mps"), daemons, register=True), daemons


def _share(node: Node, n: int, memory: str = "20Gi", percent: str = "25", device: str = "gpu-0") -> ClaimRef:
    result: dict[str, object] = {
        "request": "gpu",
        "device": device,
        "shareID": f"5a4e0000-0000-4000-8000-{n:012d}",
        "consumedCapacity": {"memory": memory, "computePercent": percent},
    }
    return node.add(allocated_claim(f"share-{n}", uid(n), [result]))


def _gpu_uuid(node: Node, device: str = "gpu-0") -> str:
    hardware = node.devices.get(device)
    assert hardware is not None
    return str(hardware.json["attributes"]["uuid"]["string"])


def _standin_state(node: Node, device: str = "gpu-0") -> dict[str, Any] | None:
    daemons = MpsDaemons(MPS_STANDIN, node.root / "state" / SHARES_DIRECTORY)
    path = daemons.pipe(daemon_key(_gpu_uuid(node, device))) / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _leftovers(node: Node) -> list[Path]:
    """What is left under the shares' directory besides the (empty) directory of the daemons."""
    directory = node.root / "state" / SHARES_DIRECTORY
    return sorted(p for p in directory.rglob("*") if p != directory / "mps") if directory.exists() else []


def _env(spec: dict[str, object]) -> dict[str, str]:
    devices: Any = spec["devices"]
    (device,) = devices
    return dict(e.split("=", 1) for e in device["containerEdits"].get("env", []))


def test_four_shares_of_one_gpu_get_their_own_devices_limits_and_one_daemon(node: Node) -> None:
    shares, daemons = _shares(node)
    driver = node.driver(shares=shares)
    refs = [_share(node, n) for n in range(4)]
    results = driver.prepare(refs)
    assert all(not r.error for r in results.values()), results
    ids = [results[r.uid].devices[0].cdi_device_ids[0] for r in refs]
    assert len(set(ids)) == 4
    assert [results[r.uid].devices[0].share_id for r in refs] == [
        f"5a4e0000-0000-4000-8000-{n:012d}" for n in range(4)
    ]
    for ref in refs:
        env = _env(node.spec(ref))
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        devices: Any = node.spec(ref)["devices"]
        pipe, _metadata = devices[0]["containerEdits"]["mounts"]
        assert Path(pipe["hostPath"]) == daemons.host_pipe(daemon_key(_gpu_uuid(node)))
    state = _standin_state(node)
    assert state is not None
    assert state["devices"] == [_gpu_uuid(node)]
    assert state["clients"] == {
        f"5a4e0000-0000-4000-8000-{n:012d}": {"activeThreadPercentage": 25, "pinnedDeviceMemLimit": "20480M"}
        for n in range(4)
    }
    assert daemons.starts == 1
    records = {r.uid: r for r in driver.records()}
    share = records[refs[0].uid].devices[0].share
    assert share is not None
    assert (share.memory_mib, share.thread_percentage, share.enforced) == (20480, 25, True)

    # Unprepare releases exactly that share: the daemon and the other shares stay.
    assert driver.unprepare([refs[1]]) == {refs[1].uid: ""}
    state = _standin_state(node)
    assert state is not None
    assert sorted(state["clients"]) == [f"5a4e0000-0000-4000-8000-{n:012d}" for n in (0, 2, 3)]
    assert all(node.cdi.read(r.uid) is not None for r in (refs[0], refs[2], refs[3]))
    assert node.cdi.read(refs[1].uid) is None
    assert daemons.stops == 0
    assert driver.unprepare([refs[0], refs[2], refs[3]]) == {r.uid: "" for r in (refs[0], refs[2], refs[3])}
    assert daemons.stops == 1
    assert _leftovers(node) == []


def test_sixteen_shares_in_random_order_lose_nothing_and_stop_the_daemon_once(node: Node) -> None:
    rng = random.Random(29)
    shares, daemons = _shares(node)
    driver = node.driver(shares=shares)
    refs = [_share(node, n, memory="5Gi", percent="6") for n in range(16)]
    order = refs[:]
    rng.shuffle(order)
    pid = 0
    for ref in order:
        assert not driver.prepare([ref])[ref.uid].error
        state = _standin_state(node)
        assert state is not None
        pid = pid or state["pid"]
        assert state["pid"] == pid  # the same daemon throughout
    state = _standin_state(node)
    assert state is not None
    assert len(state["clients"]) == 16
    rng.shuffle(order)
    for done, ref in enumerate(order, 1):
        assert driver.unprepare([ref]) == {ref.uid: ""}
        state = _standin_state(node)
        if done < 16:
            assert state is not None
            assert len(state["clients"]) == 16 - done
    assert (daemons.starts, daemons.stops) == (1, 1)
    assert _leftovers(node) == []
    assert list(node.cdi.path.iterdir()) == []
    assert driver.records() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_restarted_driver_adopts_the_daemon_and_a_killed_one_is_started_again(node: Node) -> None:
    shares, _ = _shares(node)
    driver = node.driver(shares=shares)
    refs = [_share(node, n) for n in range(2)]
    assert all(not r.error for r in driver.prepare(refs).values())
    state = _standin_state(node)
    assert state is not None
    first = state["pid"]

    # serve restarts (kill -9 leaves the daemon running, in its own session): it is adopted.
    again, daemons = _shares(node)
    driver = node.driver(shares=again)
    state = _standin_state(node)
    assert state is not None
    assert state["pid"] == first
    assert daemons.starts == 0

    # The daemon dies: recovery starts it again, in the same pipe directory (the containers of
    # the shares have it bind-mounted), and tells it its clients' limits.
    pipe = MpsDaemons(MPS_STANDIN, node.root / "state" / SHARES_DIRECTORY).pipe(daemon_key(_gpu_uuid(node)))
    inode = pipe.stat().st_ino
    os.kill(first, signal.SIGKILL)
    os.waitpid(first, 0)  # the first driver's child, started in this process
    restarted, daemons = _shares(node)
    driver = node.driver(shares=restarted)
    state = _standin_state(node)
    assert state is not None
    assert state["pid"] != first
    assert len(state["clients"]) == 2
    assert daemons.starts == 1
    assert pipe.stat().st_ino == inode
    assert driver.unprepare(refs) == {r.uid: "" for r in refs}
    assert _leftovers(node) == []


def _restart_after(
    node: Node, crash: Callable[[ClaimRecord], dict[str, ClaimRecord]]
) -> tuple[GpuDriver, CountingDaemons]:
    """One share prepared, the checkpoint's claims as `crash` leaves them, then a restart."""
    shares, _ = _shares(node)
    driver = node.driver(shares=shares)
    ref = _share(node, 1)
    assert not driver.prepare([ref])[ref.uid].error
    loaded = node.store.load()
    assert loaded is not None
    node.store.save(loaded.model_copy(update={"claims": crash(loaded.claims[ref.uid])}))
    restarted, daemons = _shares(node)
    return node.driver(shares=restarted), daemons


def test_recovery_stops_a_daemon_no_share_needs(node: Node) -> None:
    # The checkpoint names no share (a crash between the daemon's start and the claim's record).
    _restart_after(node, lambda record: {})
    assert _standin_state(node) is None
    assert _leftovers(node) == []


def test_a_crash_after_the_reservation_is_rolled_back_with_its_daemon(node: Node) -> None:
    driver, daemons = _restart_after(
        node, lambda record: {record.uid: record.model_copy(update={"state": ClaimState.PREPARE_STARTED})}
    )
    assert driver.records() == []
    assert daemons.stops == 1
    assert _leftovers(node) == []


def test_without_mps_on_the_host_a_share_fails_with_one_line(node: Node) -> None:
    shares = host_share_daemons(
        SharePolicy("mps"), driver_root=node.root / "no-driver", state_dir=node.root / "state"
    )
    driver = node.driver(shares=shares)
    ref = _share(node, 1)
    error = driver.prepare([ref])[ref.uid].error
    assert error.startswith(
        f"claim {ref}: the share of gpu-0 cannot be held to its limits: the host driver under "
    )
    assert "no nvidia-cuda-mps-control" in error
    assert "--gpu-shares unenforced" in error
    assert "\n" not in error
    assert driver.records() == []
    assert node.cdi.read(ref.uid) is None


def test_unenforced_shares_run_without_a_daemon_and_say_so(node: Node) -> None:
    shares, daemons = _shares(node, SharePolicy("unenforced"))
    driver = node.driver(shares=shares)
    ref = _share(node, 1, memory="10Gi", percent="50")
    assert not driver.prepare([ref])[ref.uid].error
    env = _env(node.spec(ref))
    assert env["DRADRIVER_SHARE_UNENFORCED"] == "memory=10240Mi,computePercent=50"
    assert not [name for name in env if name.startswith("CUDA_MPS_")]
    (record,) = driver.records()
    assert record.devices[0].share is not None
    assert record.devices[0].share.enforced is False
    assert daemons.starts == 0
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert _leftovers(node) == []


def test_a_share_on_a_node_that_publishes_none_fails(node: Node) -> None:
    driver = node.driver(shares=ShareDaemons())
    ref = _share(node, 1)
    assert driver.prepare([ref])[ref.uid].error == (
        f"claim {ref}: device gpu-0 was allocated as a share, but this node does not publish shares "
        "(serve --gpu-shares)"
    )


def _claim(
    node: Node, n: int, results: list[dict[str, object]], config: tuple[dict[str, object], ...] = ()
) -> ClaimRef:
    return node.add(allocated_claim(f"bad-{n}", uid(100 + n), results, config=config))


def test_shares_that_cannot_be_held_to_limits_are_refused_before_anything_is_touched(node: Node) -> None:
    shares, daemons = _shares(node)
    driver = node.driver(shares=shares)
    capacity = {"memory": "1Gi", "computePercent": "10"}
    two = _claim(
        node,
        1,
        [
            {
                "request": "a",
                "device": "gpu-0",
                "shareID": "5a4e0000-0000-4000-8000-000000000101",
                "consumedCapacity": capacity,
            },
            {
                "request": "b",
                "device": "gpu-1",
                "shareID": "5a4e0000-0000-4000-8000-000000000102",
                "consumedCapacity": capacity,
            },
        ],
    )
    configured = _claim(
        node,
        2,
        [
            {
                "request": "gpu",
                "device": "gpu-0",
                "shareID": "5a4e0000-0000-4000-8000-000000000103",
                "consumedCapacity": capacity,
            }
        ],
        (
            opaque(
                {
                    "apiVersion": "gpu.dradriver.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS"},
                }
            ),
        ),
    )
    uncounted = _claim(
        node, 3, [{"request": "gpu", "device": "gpu-0", "shareID": "5a4e0000-0000-4000-8000-000000000104"}]
    )
    results = driver.prepare([two, configured, uncounted])
    assert results[two.uid].error == (
        f"claim {two}: it was allocated 2 shares (gpu-0, gpu-1); a claim can hold one share, as a CUDA "
        "process connects to one MPS server"
    )
    assert "which is a share (already MPS" in results[configured.uid].error
    assert results[uncounted.uid].error == (
        f"claim {uncounted}: device gpu-0: the allocation's consumedCapacity has no 'memory': the device "
        "was not published by serve --gpu-shares"
    )
    assert daemons.starts == 0
    assert driver.records() == []


def test_kill_9_of_serve_keeps_the_shares_and_their_daemon() -> None:
    """A real `serve` killed with SIGKILL: the GPU's daemon (its own session) keeps running, the
    restarted serve adopts it, and the last unprepare stops it."""
    with short_tmpdir() as root:
        serve = ServeProcess(root, ["--gpu-shares", "mps:0"]).start()
        try:
            results: list[dict[str, object]] = [
                {
                    "request": "gpu",
                    "device": "gpu-0",
                    "shareID": f"5a4e0000-0000-4000-8000-{n:012d}",
                    "consumedCapacity": {"memory": "10Gi", "computePercent": "10"},
                }
                for n in range(3)
            ]
            for n in range(3):
                claim = allocated_claim(f"share-{n}", uid(n), [results[n]], pool="node-1")
                (serve.claims_dir / f"share-{n}.yaml").write_text(yaml.safe_dump(claim))
            refs = [ClaimRef("default", f"share-{n}", uid(n)) for n in range(3)]
            state_dir = serve.plugins_dir / DRIVER
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                client.wait_ready(30)
                response = client.prepare(refs)
                assert all(not response.claims[r.uid].error for r in refs), response
            (state_file,) = (state_dir / SHARES_DIRECTORY).rglob(STATE_FILE)
            pid = json.loads(state_file.read_text())["pid"]

            serve.kill()
            assert process_alive(pid)  # in its own session: the kill of serve leaves it running
            serve.start()
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                client.wait_ready(30)
                again = client.prepare(refs)
                assert all(not again.claims[r.uid].error for r in refs), again
                state = json.loads(state_file.read_text())
                assert state["pid"] == pid
                assert len(state["clients"]) == 3
                assert all(not e.error for e in client.unprepare(refs[:2]).claims.values())
                assert json.loads(state_file.read_text())["pid"] == pid
                assert all(not e.error for e in client.unprepare(refs[2:]).claims.values())
            wait_for(lambda: not process_alive(pid), 10, "the daemon to exit")
            assert [p for p in (state_dir / SHARES_DIRECTORY).rglob("*") if p.name != "mps"] == []
        finally:
            serve.kill()


def _stop_standins(state_dir: Path) -> None:
    """What a failed test leaves: the stand-in daemons outlive a killed serve (their own session)."""
    for state_file in (state_dir / SHARES_DIRECTORY).rglob(STATE_FILE):
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.kill(json.loads(state_file.read_text())["pid"], signal.SIGTERM)


def test_a_real_serve_keeps_the_shares_of_a_gpu_to_one_namespace() -> None:
    """Two tenants' shares never share a GPU's MPS daemon: a share of a GPU that holds another
    namespace's shares fails naming both, another GPU takes it, and once the first tenant's
    shares are released the kubelet's retry prepares it."""
    with short_tmpdir() as root:
        serve = ServeProcess(root, ["--gpu-shares", "mps:0,1"]).start()
        try:
            capacity = {"memory": "10Gi", "computePercent": "10"}
            placed = [("team-a", "gpu-0"), ("team-a", "gpu-0"), ("team-b", "gpu-0"), ("team-b", "gpu-1")]
            refs = []
            for n, (namespace, device) in enumerate(placed):
                result: dict[str, object] = {
                    "request": "gpu",
                    "device": device,
                    "shareID": f"5a4e0000-0000-4000-8000-{n:012d}",
                    "consumedCapacity": capacity,
                }
                claim = allocated_claim(f"share-{n}", uid(n), [result], namespace=namespace)
                (serve.claims_dir / f"share-{n}.yaml").write_text(yaml.safe_dump(claim))
                refs.append(ClaimRef(namespace, f"share-{n}", uid(n)))
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                client.wait_ready(30)
                # One pod's claims per call, as the kubelet sends them.
                errors = [client.prepare([ref]).claims[ref.uid].error for ref in refs]
                spec = json.loads(
                    (serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{refs[0].uid}.json").read_text()
                )
                gpu_0 = _env(spec)["DRADRIVER_DEVICE_GPU_0"]
                assert errors == [
                    "",
                    "",
                    f"claim {refs[2]}: GPU gpu-0 ({gpu_0}) holds MPS shares of namespace team-a; the shares "
                    "of a GPU share one MPS daemon and pipe directory, so they come from one namespace: this "
                    "one is prepared once those are released",
                    "",
                ]
                assert not (serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{refs[2].uid}.json").exists()
                assert all(not e.error for e in client.unprepare(refs[:2]).claims.values())
                assert client.prepare([refs[2]]).claims[refs[2].uid].error == ""
                assert all(not e.error for e in client.unprepare(refs[2:]).claims.values())
            assert [
                p for p in (serve.plugins_dir / DRIVER / SHARES_DIRECTORY).rglob("*") if p.name != "mps"
            ] == []
        finally:
            serve.kill()
            _stop_standins(serve.plugins_dir / DRIVER)


def test_the_standin_replaces_links_planted_in_the_pipe_directory(node: Node) -> None:
    """Whoever can write in a pipe directory (no container can: it is mounted read-only) cannot
    make the stand-in write through a link to a file of the host."""
    shares, daemons = _shares(node)
    driver = node.driver(shares=shares)
    first, second = _share(node, 1), _share(node, 2)
    assert not driver.prepare([first])[first.uid].error
    pipe = daemons.pipe(daemon_key(_gpu_uuid(node)))
    victims = [node.root / "victim-state", node.root / "victim-temporary"]
    for victim in victims:
        victim.write_text("host file\n")
    (pipe / STATE_FILE).unlink()
    (pipe / STATE_FILE).symlink_to(victims[0])
    (pipe / f".{STATE_FILE}.tmp").symlink_to(victims[1])
    assert not driver.prepare([second])[second.uid].error
    assert [v.read_text() for v in victims] == ["host file\n", "host file\n"]
    assert not (pipe / STATE_FILE).is_symlink()
    state = _standin_state(node)
    assert state is not None
    assert len(state["clients"]) == 2
    assert driver.unprepare([first, second]) == {first.uid: "", second.uid: ""}
