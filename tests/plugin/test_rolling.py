"""Two `dradriver serve` instances on one node, as during a surge rollout (rolling updates on).

Real subprocesses, real sockets and files: per-pod socket names as the Go helper makes them,
the instance lock per pod, prepare/unprepare serialized across instances by `serialize.lock`,
each instance working on the checkpoint as the other left it, and the kubelet < 1.33 fallback.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import yaml

from dradriver import kubeletclient
from dradriver.health.board import HealthBoard
from dradriver.kubeletapi.pluginregistration import api_pb2 as reg_pb
from dradriver.kubeletapi.pluginregistration import api_pb2_grpc as reg_grpc
from dradriver.plugin.driver import ClaimRef, PrepareResult
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.rolling import kubelet_minor, supports_rolling_update
from dradriver.plugin.server import (
    PluginPaths,
    PluginServer,
    dra_socket_name,
    instance_alive,
    registration_socket_name,
)
from dradriver.prepare.serialize import SerializeLock
from tests.helpers import DRIVER, ServeProcess, allocated_claim, short_tmpdir, uid, wait_for

OLD_POD = "7d0e1c52-1111-4c3b-9a55-000000000001"
NEW_POD = "7d0e1c52-2222-4c3b-9a55-000000000002"


def test_socket_names_are_the_go_helpers() -> None:
    """kubeletplugin.Start: `<driver><-uid>-reg.sock` in the registry dir, `dra<-uid>.sock`."""
    assert registration_socket_name(DRIVER) == f"{DRIVER}-reg.sock"
    assert registration_socket_name(DRIVER, OLD_POD) == f"{DRIVER}-{OLD_POD}-reg.sock"
    assert dra_socket_name() == "dra.sock"
    assert dra_socket_name(OLD_POD) == f"dra-{OLD_POD}.sock"
    paths = PluginPaths.for_driver(DRIVER, Path("/var/lib/kubelet/plugins"), Path("/r"), OLD_POD)
    assert paths.serialize_lock == Path(f"/var/lib/kubelet/plugins/{DRIVER}/serialize.lock")
    assert paths.lock_file.name == f"serve-{OLD_POD}.lock"


@pytest.mark.parametrize(
    ("version", "minor", "supported"),
    [
        ("v1.36.2", (1, 36), True),
        ("v1.33.0", (1, 33), True),
        ("v1.32.4-gke.1000", (1, 32), False),
        ("v1.31.1+k3s1", (1, 31), False),
        ("", None, None),
        ("unknown", None, None),
    ],
)
def test_kubelet_version_decides_rolling_update_support(
    version: str, minor: tuple[int, int] | None, supported: bool | None
) -> None:
    assert kubelet_minor(version) == minor
    assert supports_rolling_update(version) is supported


@contextmanager
def two_instances() -> Iterator[tuple[ServeProcess, ServeProcess]]:
    with short_tmpdir() as root:
        old = ServeProcess(root, pod_uid=OLD_POD).start()
        new = ServeProcess(root, pod_uid=NEW_POD).start()
        try:
            yield old, new
        finally:
            old.kill()
            new.kill()


def claims(serve: ServeProcess, specs: dict[int, str], admin: bool = False) -> list[ClaimRef]:
    """Allocated claims (number -> device) in the claim directory both instances read."""
    serve.claims_dir.mkdir(exist_ok=True)
    path = serve.claims_dir / "claims.yaml"
    existing = list(yaml.safe_load_all(path.read_text())) if path.exists() else []
    for n, device in specs.items():
        result = {"request": "gpu", "device": device, **({"adminAccess": True} if admin else {})}
        existing.append(allocated_claim(f"claim-{n}", uid(n), [result]))
    path.write_text(yaml.safe_dump_all(existing))
    return [ClaimRef("default", f"claim-{n}", uid(n)) for n in specs]


def checkpoint_claims(serve: ServeProcess) -> set[str]:
    document = json.loads((serve.plugins_dir / DRIVER / "checkpoint.json").read_text())
    return set(document["data"]["claims"])


def test_two_instances_register_side_by_side_with_their_own_sockets() -> None:
    with two_instances() as (old, new):
        for serve, pod in ((old, OLD_POD), (new, NEW_POD)):
            assert serve.registration_socket.name == f"{DRIVER}-{pod}-reg.sock"
            registration = kubeletclient.register(serve.registration_socket)
            assert registration.endpoint == str(serve.plugins_dir / DRIVER / f"dra-{pod}.sock")
            with kubeletclient.DRAClient(registration.endpoint, registration.service) as client:
                assert dict(client.prepare([]).claims) == {}
        # Logged once the registration socket it answered on is up.
        wait_for(lambda: "registering now" in new.log(), 10, "the registration's line")
        # The second instance offered itself to the kubelet only once it could serve.
        log = new.log()
        assert log.index('"driver ready"') < log.index("registering now that the driver is ready")
        assert "registering now" not in old.log()
        assert instance_alive(old.registry_dir, DRIVER, OLD_POD)
        assert instance_alive(old.registry_dir, DRIVER, NEW_POD)
        assert not instance_alive(old.registry_dir, DRIVER, "7d0e1c52-3333-4c3b-9a55-000000000003")


def test_the_instance_lock_is_per_pod() -> None:
    with two_instances() as (old, _new):
        assert old.proc is not None
        assert old.proc.poll() is None, old.log()
        again = ServeProcess(old.root, pod_uid=OLD_POD)
        again.log_path = old.root / "again.log"
        again.start(wait=False)
        assert again.proc is not None
        try:
            assert again.proc.wait(30) == 1, f"{again.log()}\nthe first instance: {old.log()}"
        finally:
            again.kill()  # never left serving when the assertion fails
        assert f"holds {old.lock_file}" in again.log()


def test_a_claim_prepared_by_one_instance_is_known_to_the_other() -> None:
    """Each call starts from the checkpoint as the other instance left it: no device is given
    twice, and either instance unprepares what the other prepared."""
    with two_instances() as (old, new):
        first, second = claims(old, {1: "gpu-0", 2: "gpu-0"})
        with (
            kubeletclient.DRAClient(old.dra_socket) as to_old,
            kubeletclient.DRAClient(new.dra_socket) as to_new,
        ):
            assert to_old.prepare([first]).claims[first.uid].error == ""
            refused = to_new.prepare([second]).claims[second.uid].error
            assert f"already prepared for claim default/claim-1 ({first.uid})" in refused
            assert to_new.unprepare([first]).claims[first.uid].error == ""
            assert checkpoint_claims(new) == set()
            assert to_old.prepare([second]).claims[second.uid].error == ""
            assert checkpoint_claims(old) == {second.uid}
            assert to_new.unprepare([second]).claims[second.uid].error == ""
        assert list(old.cdi_dir.glob("*.json")) == []


def test_concurrent_calls_on_both_instances_lose_no_checkpoint_record() -> None:
    with two_instances() as (old, new):
        refs = claims(old, {n: f"gpu-{n % 8}" for n in range(100, 160)}, admin=True)
        failures: list[BaseException] = []

        def worker(serve: ServeProcess, mine: list[ClaimRef]) -> None:
            try:
                with kubeletclient.DRAClient(serve.dra_socket) as client:
                    for ref in mine:
                        assert client.prepare([ref]).claims[ref.uid].error == ""
            except BaseException as err:  # re-raised in the main thread
                failures.append(err)

        threads = [
            threading.Thread(target=worker, args=(serve, refs[i::4]))
            for i, serve in enumerate((old, new, old, new))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert checkpoint_claims(old) == {r.uid for r in refs}
        assert len(list(old.cdi_dir.glob("*.json"))) == len(refs)


def test_serialize_lock_excludes_other_holders(tmp_path: Path) -> None:
    lock = SerializeLock(tmp_path / "serialize.lock")
    with lock:
        other = os.open(lock.path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    other = os.open(lock.path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(other)


class _NoDRA:
    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        return {}

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {}


def test_with_an_old_kubelet_the_instance_registers_again_when_the_other_leaves() -> None:
    """A kubelet < 1.33 forgets the driver when the replaced instance removes its socket: the
    remaining instance re-creates its registration socket, so the kubelet registers it anew."""
    from dradriver.plugin.dra import DRAService, built

    with short_tmpdir() as root:
        registry = root / "registry"
        registry.mkdir()
        paths = PluginPaths.for_driver(DRIVER, root / "plugins", registry, NEW_POD)
        registration = RegistrationState()
        server = PluginServer(
            paths,
            DRIVER,
            DRAService(built(_NoDRA())),
            HealthBoard(),
            registration,
            watch_interval=0.05,
        )
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer_path = registry / registration_socket_name(DRIVER, OLD_POD)
        peer.bind(str(peer_path))
        peer.listen()
        server.start()
        try:
            kubeletclient.register(paths.registration_socket)
            assert registration.status.registered is True
            server.legacy_kubelet()
            # A new socket may get the freed inode number again: its change time tells them apart.
            first = identity(paths.registration_socket)
            assert first is not None
            peer.close()
            peer_path.unlink()
            wait_for(
                lambda: identity(paths.registration_socket) not in (first, None),
                10,
                "the registration socket to be re-created",
            )
            assert registration.status.registered is None  # until the kubelet registers it again
            with grpc.insecure_channel(f"unix://{paths.registration_socket}") as channel:
                info = reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=5)
            assert info.endpoint == str(paths.dra_socket)
        finally:
            server.stop(grace=0)


def identity(path: Path) -> tuple[int, int] | None:
    """Inode and change time; None while the socket is being re-created (removed, not yet bound)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


def test_a_kubelet_older_than_1_33_is_reported_on_the_node(tmp_path: Path) -> None:
    """serve reads the kubelet's version from its Node; before 1.33 it logs the consequence and
    emits a Warning Event on the Node (and re-registers when the other instance leaves, above)."""
    from tests.publish.kubefake import FakeApiServer

    fake = FakeApiServer().start()
    try:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-1"},
            "status": {"nodeInfo": {"kubeletVersion": "v1.32.4"}},
        }
        fake.create("nodes", None, node)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        with short_tmpdir() as root:
            serve = ServeProcess(root, ["--kubeconfig", str(kubeconfig)], pod_uid=NEW_POD).start()
            try:
                wait_for(lambda: "predates 1.33" in serve.log(), 30, f"the warning ({serve.log()})")

                def reported() -> list[dict[str, object]]:
                    events = fake.objects("events")
                    return [e for e in events if e.get("reason") == "KubeletTooOldForRollingUpdate"]

                wait_for(reported, 30, "the Node Event")
                (event,) = reported()
                assert event["type"] == "Warning"
                assert "maxSurge: 0, maxUnavailable: 1" in str(event["message"])
            finally:
                serve.kill()
    finally:
        fake.stop()
