"""One instance per state directory and per node: the lock lives beside the checkpoint it
guards, so a second `serve` exits 1 naming the holder's pid whatever directories it was given,
also after the plugins directory was removed under the first (real serve processes)."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from dradriver.plugin.node_instances import ServeIdentity, flock_holders, parent_pid, serve_identity
from tests.helpers import ServeProcess, allocated_claim, short_tmpdir, uid, wait_for
from tests.robustness.common import snapshot

OLD_POD = "7d0e1c52-1111-4c3b-9a55-000000000001"
NEW_POD = "7d0e1c52-2222-4c3b-9a55-000000000002"
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


def test_a_second_instance_with_directories_all_its_own_exits_1_with_the_first_ones_pid() -> None:
    """A second DaemonSet with other hostPaths shares no file with the first, only the node and
        the pool both would publish: found in the process table (/proc here, the host's /proc in the
        DaemonSet). Both have cluster access: a kubeconfig naming an API server that never answers,
    which they keep retrying in the background."""
    with short_tmpdir() as root:
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
        publishing = {"KUBECONFIG": str(kubeconfig)}
        first = apart(root / "a").start()  # node-only: publishes nothing, so clashes with none
        for name in "bcde":
            (root / name).mkdir()
        second = ServeProcess(root / "b", env=publishing)
        try:
            second.start()
            third = ServeProcess(root / "c", env=publishing)
            log = refused(third)
            assert (
                f"another dradriver serve of {first.driver} runs on node node-1 (pid {pid(second)}) "
                f"with a state directory other than {third.paths.state_lock.parent}; "
                "refusing to run a second instance on one node"
            ) in log
            assert not third.registration_socket.exists()
            assert not third.paths.state_lock.exists()  # its locks released
            # Another node's pool (a fleet simulated on one machine) or driver is no conflict.
            for other in (
                ServeProcess(root / "d", ["--node-name", "node-2"], env=publishing),
                ServeProcess(root / "e", ["--driver-name", "other.dev"], env=publishing, driver="other.dev"),
            ):
                other.start()
                other.kill()
            for serve in (first, second):  # both still serve
                kubeletclient.register(serve.registration_socket)
        finally:
            second.kill()
            first.kill()


def test_flock_holders_reads_the_kernels_lock_table(tmp_path: Path) -> None:
    path = tmp_path / "state.lock"
    with path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        st = os.stat(path)
        locks = Path("/proc/locks").read_text()
        assert os.getpid() in flock_holders(locks, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
        assert flock_holders(locks, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino + 1) == set()


def test_parent_pid_reads_a_stat_line_whose_command_has_spaces() -> None:
    assert parent_pid(Path("/proc/self/stat").read_text()) == os.getppid()
    assert parent_pid("42 (a) b (c) S 7 42 42 0 -1") == 7


def test_serve_identity_reads_flags_then_variables() -> None:
    env = {"DRADRIVER_DRIVER_NAME": "env.dev", "NODE_NAME": "n-env"}
    assert serve_identity(["/usr/bin/dradriver", "serve"], {}) == ServeIdentity(
        "gpu.dradriver.dev", None, False
    )
    in_pod = env | {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    by_module = ["python3", "-m", "dradriver", "serve", "--driver-name=a.dev"]
    assert serve_identity(by_module, in_pod) == ServeIdentity("a.dev", "n-env", True)
    by_flags = ["dradriver", "serve", "--node-name", "n1", "--kubeconfig", "k"]
    assert serve_identity(by_flags, env) == ServeIdentity("env.dev", "n1", True)
    assert serve_identity(["dradriver", "status"], env) is None
    assert serve_identity(["python3", "-m", "pytest", "serve"], env) is None


def test_no_lock_is_left_behind() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root).start()
        assert serve.paths.state_lock.exists()
        assert serve.stop() == 0
        assert not serve.paths.state_lock.exists()
