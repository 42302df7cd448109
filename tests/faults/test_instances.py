"""One instance per state directory and per node: the lock lives beside the checkpoint it
guards, so a second `serve` exits 1 naming the holder's pid whatever directories it was given,
also after the plugins directory was removed under the first (real serve processes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import ServeProcess, allocated_claim, short_tmpdir, uid, wait_for
from tests.robustness.common import snapshot

OLD_POD = "7d0e1c52-1111-4c3b-9a55-000000000001"
NEW_POD = "7d0e1c52-2222-4c3b-9a55-000000000002"
OTHER_POD = "7d0e1c52-3333-4c3b-9a55-000000000003"
UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def refused(serve: ServeProcess) -> str:
    """Start `serve`, which must exit 1; its log."""
    serve.start(wait=False)
    assert serve.proc is not None
    assert serve.proc.wait(60) == 1, serve.log()
    return serve.log()


def apart(root: Path, *args: str) -> ServeProcess:
    """A serve with kubelet, CDI and claims directories of its own under `root`."""
    root.mkdir()
    return ServeProcess(root, list(args))


def pid(serve: ServeProcess) -> int:
    assert serve.proc is not None
    return serve.proc.pid


def test_a_second_instance_on_the_same_state_dir_exits_1_with_the_holders_pid() -> None:
    with short_tmpdir() as root:
        state = root / "state"
        first = apart(root / "a", "--state-dir", str(state))
        claim = allocated_claim("claim-1", uid(1), [{"request": "gpu", "device": "gpu-0"}])
        (first.claims_dir / "claim-1.yaml").write_text(yaml.safe_dump(claim))
        first.start()
        try:
            with kubeletclient.DRAClient(first.dra_socket) as client:
                ref = ClaimRef("default", "claim-1", uid(1))
                assert client.prepare([ref]).claims[ref.uid].error == ""
            before = snapshot(state) | snapshot(first.cdi_dir)
            # Other plugins, registry, CDI and claims directories: only the state is shared.
            second = apart(root / "b", "--state-dir", str(state))
            log = refused(second)
            assert (
                f"another dradriver serve (pid {pid(first)}) holds {state / 'state.lock'}; "
                "refusing to share its state directory"
            ) in log
            assert not second.registration_socket.exists()
            assert snapshot(state) | snapshot(first.cdi_dir) == before
            kubeletclient.register(first.registration_socket)  # the first one still serves
        finally:
            first.kill()


def test_the_lock_survives_the_plugins_directory_being_removed() -> None:
    with short_tmpdir() as root:
        first = ServeProcess(root).start()
        try:
            state_lock = first.paths.state_lock
            assert state_lock.parent == first.plugins_dir / first.driver  # the default state dir
            shutil.rmtree(first.plugins_dir)
            wait_for(
                lambda: state_lock.exists() and first.lock_file.exists() and first.dra_socket.exists(),
                30,
                f"the locks and socket taken again (log: {first.log()})",
            )
            second = ServeProcess(root)
            second.log_path = root / "second.log"
            assert f"another dradriver serve (pid {pid(first)})" in refused(second)
            kubeletclient.register(first.registration_socket)
        finally:
            first.kill()


def test_rolling_instances_share_the_state_dir_and_a_plain_instance_is_refused() -> None:
    with short_tmpdir() as root:
        old = ServeProcess(root, pod_uid=OLD_POD).start()
        new = ServeProcess(root, pod_uid=NEW_POD).start()
        try:
            state = old.plugins_dir / old.driver
            plain = apart(root / "elsewhere", "--state-dir", str(state))
            log = refused(plain)
            assert f"holds {state / 'state.lock'}; refusing to share its state directory" in log
            assert str(pid(old)) in log
            assert str(pid(new)) in log
            for serve in (old, new):
                kubeletclient.register(serve.registration_socket)
        finally:
            new.kill()
            old.kill()


def publishing(root: Path) -> dict[str, str]:
    """Cluster access for a serve: a kubeconfig naming an API server that never answers, which it
    keeps retrying in the background."""
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    return {"KUBECONFIG": str(kubeconfig)}


def test_a_second_instance_with_directories_all_its_own_exits_1_with_the_first_ones_pid() -> None:
    """A second DaemonSet with other hostPaths shares no file with the first but the node-wide
    lock in the fixed host directory every DaemonSet mounts (--node-lock-dir)."""
    with short_tmpdir() as root:
        env = publishing(root)
        node_lock = ["--node-lock-dir", str(root / "run-dradriver")]
        first = apart(root / "a", *node_lock).start()  # node-only: publishes nothing, so clashes with none
        for name in "bcde":
            (root / name).mkdir()
        second = ServeProcess(root / "b", node_lock, env=env)
        try:
            second.start()
            third = ServeProcess(root / "c", node_lock, env=env)
            log = refused(third)
            line = next(line for line in log.splitlines() if "refusing" in line)
            assert (
                f"another dradriver serve of {first.driver} runs on node node-1 (pid {pid(second)}, "
                f"state directory {second.paths.state_lock.parent}) with a state directory other than "
                f"{third.paths.state_lock.parent}: it holds {node_lock[1]}/{first.driver}_node-1.lock; "
                "refusing to run a second instance on one node"
            ) in line
            assert not third.registration_socket.exists()
            assert not third.paths.state_lock.exists()  # its locks released
            # Another node's pool (a fleet simulated on one machine) or driver is no conflict.
            for other in (
                ServeProcess(root / "d", [*node_lock, "--node-name", "node-2"], env=env),
                ServeProcess(
                    root / "e", [*node_lock, "--driver-name", "other.dev"], env=env, driver="other.dev"
                ),
            ):
                other.start()
                other.kill()
            for serve in (first, second):  # both still serve
                kubeletclient.register(serve.registration_socket)
        finally:
            second.kill()
            first.kill()


def test_a_decoy_process_named_dradriver_serve_does_not_stop_serve() -> None:
    """Any user can start a process whose command line reads `dradriver serve` with the node's
    NODE_NAME and cluster access: it holds no lock in the root-only directory, so it is nobody."""
    with short_tmpdir() as root:
        env = publishing(root)
        decoy_program = root / "bin" / "dradriver"
        decoy_program.parent.mkdir()
        decoy_program.write_text("#!/bin/sh\nsleep 600\n")
        decoy_program.chmod(0o755)
        decoy_env = env | {"NODE_NAME": "node-1", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
        decoy = subprocess.Popen(
            ["/bin/sh", str(decoy_program), "serve", "--node-name", "node-1"], env=decoy_env
        )
        serve = ServeProcess(root, env=env)
        try:
            serve.start()
            kubeletclient.register(serve.registration_socket)
            assert decoy.poll() is None  # the decoy ran throughout
        finally:
            serve.kill()
            decoy.kill()
            decoy.wait(10)


def test_rolling_instances_share_the_node_lock_and_one_with_other_directories_is_refused() -> None:
    with short_tmpdir() as root:
        env = publishing(root)
        old = ServeProcess(root, env=env, pod_uid=OLD_POD).start()
        # It registers only once it has taken the slices over (never, here): its DRA socket is
        # up once it holds its locks.
        new = ServeProcess(root, env=env, pod_uid=NEW_POD).start(wait=False)
        try:
            wait_for(new.dra_socket.exists, 20, f"{new.dra_socket} (log: {new.log()})")
            node_lock = ["--node-lock-dir", str(root / "node-lock")]  # the rollout's, on its "host"
            for name in "bc":
                (root / name).mkdir()
            # Another DaemonSet's rollout: its own state directory, held shared as well.
            log = refused(ServeProcess(root / "b", node_lock, env=env, pod_uid=OTHER_POD))
            assert f"state directory {old.plugins_dir / old.driver}) with a state directory other than" in log
            assert "refusing to run a second instance on one node" in log
            old.kill()  # the old pod is gone: the new one alone holds the node lock
            log = refused(ServeProcess(root / "c", node_lock, env=env))
            assert f"(pid {pid(new)}, state directory {new.plugins_dir / new.driver})" in log
            assert new.proc is not None
            assert new.proc.poll() is None
        finally:
            new.kill()
            old.kill()


def test_a_node_lock_directory_of_another_user_is_refused_in_one_line() -> None:
    with short_tmpdir() as root:
        lock_dir = root / "node-lock"
        lock_dir.mkdir()
        os.chown(lock_dir, 65534, 65534)
        log = refused(ServeProcess(root, env=publishing(root)))
        assert f"--node-lock-dir {lock_dir}: owned by uid 65534, not by this process's" in log


def test_no_lock_is_left_behind() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root).start()
        assert serve.paths.state_lock.exists()
        assert serve.stop() == 0
        assert not serve.paths.state_lock.exists()
