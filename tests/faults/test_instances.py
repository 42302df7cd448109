"""One instance per state directory and per node: the lock lives beside the checkpoint it
guards, so a second `serve` exits 1 naming the holder's pid whatever directories it was given,
also after the plugins directory was removed under the first (real serve processes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import ServeProcess, allocated_claim, short_tmpdir, uid, wait_for
from tests.robustness.common import snapshot

OLD_POD = "7d0e1c52-1111-4c3b-9a55-000000000001"
NEW_POD = "7d0e1c52-2222-4c3b-9a55-000000000002"


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


def test_no_lock_is_left_behind() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root).start()
        assert serve.paths.state_lock.exists()
        assert serve.stop() == 0
        assert not serve.paths.state_lock.exists()
