"""What a local cluster killed before its `stop` leaves on the machine, and the next one's start.

Real leftovers, made by hand while holding the machine lock: /var/lib/kubelet with the cluster's
mark, the pod bridge, the two chains with their jumps, and a process naming the killed run's work
directory. No cluster starts here, so this runs in `make test` (as root, with iptables and ip).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import cluster
from tests.e2e.cluster import BRIDGE, FORWARD_CHAIN, KUBELET_ROOT, MACHINE_LOCK, NAT_CHAIN, OWNER_MARK
from tests.e2e.processes import wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("iptables", "ip")),
    reason="needs root, iptables and ip (it makes a bridge and chains)",
)


@pytest.fixture
def machine() -> Iterator[None]:
    """The machine as no cluster uses it: the lock held, /var/lib/kubelet absent or empty."""
    with MACHINE_LOCK.open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if KUBELET_ROOT.exists() and any(KUBELET_ROOT.iterdir()):
            pytest.skip(f"{KUBELET_ROOT} is in use")
        try:
            yield
        finally:
            cluster._remove_bridge_and_chains()
            shutil.rmtree(KUBELET_ROOT, ignore_errors=True)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _iptables(table: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", "-t", table, *args], capture_output=True, text=True, check=False)


def _sleeper(tmp_path: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    """A process whose program is called `name`, with `args` on its command line."""
    program = Path(tempfile.mkdtemp(dir=tmp_path)) / name
    program.symlink_to(sys.executable)
    process = subprocess.Popen(
        [str(program), "-c", "import time; time.sleep(600)", *args], start_new_session=True
    )
    # Its command line reads empty for a moment after the exec.
    wait_until(lambda: cluster._command_line(process.pid)[:1] == [name.encode()], 10, f"{name} to run")
    return process


def test_a_killed_runs_leftovers_go_and_the_next_start_may_proceed(machine: None, tmp_path: Path) -> None:
    work = tmp_path / "dradriver-e2e-killed"
    KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
    OWNER_MARK.write_text(f"{work}\n")
    (KUBELET_ROOT / "pods").mkdir()
    assert _ip("link", "add", BRIDGE, "type", "bridge").returncode == 0
    for table, chain, hook in (("nat", NAT_CHAIN, "OUTPUT"), ("filter", FORWARD_CHAIN, "FORWARD")):
        assert _iptables(table, "-N", chain).returncode == 0
        assert _iptables(table, "-I", hook, "-j", chain).returncode == 0
    component = _sleeper(tmp_path, "etcd", f"--data-dir={work}/etcd")
    bystander = _sleeper(tmp_path, "etcd", f"--data-dir={work}-other/etcd")
    try:
        assert cluster._killed_runs_work_dir() == work
        cluster._remove_leftovers(work)
        assert component.wait(timeout=10) == -9
        assert bystander.poll() is None, "a directory that only starts with the work directory's name"
        assert not KUBELET_ROOT.exists()
        assert BRIDGE not in _ip("-o", "link", "show").stdout
        assert NAT_CHAIN not in _iptables("nat", "-S").stdout
        assert FORWARD_CHAIN not in _iptables("filter", "-S").stdout
        # The chains can be made again: the next cluster's `_network_rules` starts with -N.
        assert _iptables("nat", "-N", NAT_CHAIN).returncode == 0
    finally:
        for process in (component, bystander):
            process.kill()
            process.wait()


def test_state_without_the_mark_or_with_a_kubelet_running_is_not_taken(machine: None, tmp_path: Path) -> None:
    KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
    (KUBELET_ROOT / "pods").mkdir()
    assert cluster._killed_runs_work_dir() is None, "another kubelet's state, no mark"
    OWNER_MARK.write_text("relative/path\n")
    assert cluster._killed_runs_work_dir() is None, "a mark that names no absolute directory"
    OWNER_MARK.write_text(f"{tmp_path}\n")
    kubelet = _sleeper(tmp_path, "kubelet", "--root-dir=/var/lib/kubelet")
    try:
        assert cluster._killed_runs_work_dir() is None, "a kubelet runs"
    finally:
        kubelet.kill()
        kubelet.wait()
    assert cluster._killed_runs_work_dir() == tmp_path
