"""`dradriver serve` start-up and shutdown under faults, as a real subprocess on real sockets:
failures after the sockets exist clean up and say one line, SIGTERM at any moment of start-up
exits 0, --shutdown-grace bounds the exit even with a call stuck on I/O, and modes never
depend on the umask."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import ServeProcess, allocated_claim, free_port, short_tmpdir, uid, wait_for
from tests.publish.kubefake import FakeApiServer
from tests.robustness.common import HANG_SECONDS, json_lines


def leftovers(serve: ServeProcess) -> list[str]:
    """Sockets, lock and bind directories a stopped serve must not leave behind."""
    found = [p for p in (serve.dra_socket, serve.registration_socket, serve.lock_file) if os.path.lexists(p)]
    found += list(serve.registry_dir.glob(".b*")) + list(serve.dra_socket.parent.glob(".b*"))
    return [str(p) for p in found]


def run_to_exit(serve: ServeProcess) -> int:
    serve.start(wait=False)
    assert serve.proc is not None
    return serve.proc.wait(HANG_SECONDS)


# -- failures after the sockets exist -------------------------------------------------------------


@contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("port-taken", "cannot listen: Address already in use"),
        ("foreign-address", "cannot listen: Cannot assign requested address"),
        ("unknown-host", "--metrics-address no-such-host.invalid:"),
        ("cdi-dir-under-a-file", "--cdi-dir"),
    ],
)
def test_failures_after_the_sockets_exist_remove_them_and_say_one_line(case: str, message: str) -> None:
    with short_tmpdir() as root, taken_port() as port:
        (root / "file").write_text("")
        extra = {
            "port-taken": ["--metrics-address", f"127.0.0.1:{port}"],
            "foreign-address": ["--metrics-address", f"192.0.2.1:{free_port()}"],  # TEST-NET-1: not ours
            "unknown-host": ["--metrics-address", f"no-such-host.invalid:{free_port()}"],
            "cdi-dir-under-a-file": ["--cdi-dir", str(root / "file" / "cdi")],
        }[case]
        serve = ServeProcess(root, extra)
        assert run_to_exit(serve) == 1
        log = serve.log()
        assert "Traceback" not in log
        records = json_lines(log)  # JSON from the first line to the last
        errors = [r for r in records if r["level"] == "error"]
        assert len(errors) == 1, errors
        assert errors[0]["event"] == "dradriver serve failed"
        assert message in str(errors[0]["error"])
        assert any(r["event"] == "plugin sockets are up" for r in records)  # it did get that far
        assert leftovers(serve) == []


def test_a_state_dir_that_cannot_be_locked_stops_serve_before_the_sockets_in_one_line() -> None:
    """The instance lock lives in the state directory: it is taken before any socket exists."""
    with short_tmpdir() as root:
        (root / "file").write_text("")
        serve = ServeProcess(root, ["--state-dir", str(root / "file" / "state")])
        assert run_to_exit(serve) == 1
        [record] = json_lines(serve.log())
        assert record["event"] == "dradriver serve failed"
        assert f"--state-dir {root / 'file' / 'state'}: cannot take the lock" in str(record["error"])
        assert leftovers(serve) == []


def test_a_missing_or_broken_kubeconfig_stops_serve_before_it_creates_anything() -> None:
    with short_tmpdir() as root:
        broken = root / "kubeconfig"
        broken.write_text("apiVersion: v1\napiVersion: v1\n")
        for path, message in ((root / "nope", "cannot read: No such file"), (broken, "duplicate key")):
            serve = ServeProcess(root, ["--kubeconfig", str(path)])
            assert run_to_exit(serve) == 2
            [record] = json_lines(serve.log())
            assert message in str(record["event"])
            assert not serve.plugins_dir.exists()
            serve.log_path.unlink()


def test_a_bad_gpu_shares_policy_stops_serve_before_it_creates_anything() -> None:
    with short_tmpdir() as root:
        for flags, message in (
            (
                ["--gpu-shares", "timeslice"],
                "--gpu-shares timeslice: 'timeslice' is not one of mps, unenforced",
            ),
            (["--gpu-shares", "mps:"], "--gpu-shares mps:: 'mps:' names no GPU after ':'"),
            (
                ["--gpu-shares", "mps", "--gpu-share-count", "0"],
                "--gpu-shares mps: share count 0 is not 1..100",
            ),
        ):
            serve = ServeProcess(root, flags)
            assert run_to_exit(serve) == 2
            [record] = json_lines(serve.log())
            assert message in str(record["event"])
            assert not serve.plugins_dir.exists()
            serve.log_path.unlink()


# -- SIGTERM at any moment of start-up --------------------------------------------------------------

#: Log lines marking the steps of start-up, in order (publishing needs the API server).
STEPS = [
    "plugin sockets are up",
    "connected to the API server",
    "publishing ResourceSlices",
    "health monitoring started",
    "driver ready",
]


@contextmanager
def api_server(node: str = "node-1") -> Iterator[FakeApiServer]:
    fake = FakeApiServer().start()
    try:
        fake.create("nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        yield fake
    finally:
        fake.stop()


def _terminate_at(step: str | None, delay: float = 0.0) -> tuple[int, str]:
    with short_tmpdir() as root, api_server() as fake:
        kubeconfig = fake.write_kubeconfig(root / "kubeconfig")
        serve = ServeProcess(root, ["--kubeconfig", str(kubeconfig)], claims_from_files=False)
        serve.start(wait=False)
        proc = serve.proc
        assert proc is not None
        if step is None:
            threading.Event().wait(delay)  # a moment chosen by time, not by what happened
        else:
            wait_for(lambda: step in serve.log() or proc.poll() is not None, HANG_SECONDS, step)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(HANG_SECONDS)
        problems = leftovers(serve)
        log = serve.log()
        assert "Traceback" not in log, log
        assert problems == [], problems
        return code, log


@pytest.mark.parametrize("step", STEPS)
def test_sigterm_right_after_each_step_of_start_up_exits_0(step: str) -> None:
    code, log = _terminate_at(step)
    assert code == 0, log
    assert "stopped; sockets and lock removed" in log


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.3, 0.5, 0.8, 1.2])
def test_sigterm_at_a_moment_of_start_up_exits_0(delay: float) -> None:
    code, log = _terminate_at(None, delay)
    # Before the interpreter reaches dradriver's first line the signal's default action
    # applies; by then nothing exists (checked above), and from there on it is exit 0.
    assert code == 0 or (code == -signal.SIGTERM and log == ""), (code, log)


# -- --shutdown-grace is a hard bound --------------------------------------------------------------


def test_shutdown_grace_bounds_the_exit_with_a_call_stuck_on_io() -> None:
    with short_tmpdir() as root, api_server() as fake:
        claim = allocated_claim("stuck", uid(1), [{"request": "gpu", "device": "gpu-0"}])
        created = fake.create("resourceclaims", "default", claim)
        ref = ClaimRef("default", "stuck", str(created["metadata"]["uid"]))
        kubeconfig = fake.write_kubeconfig(root / "kubeconfig")
        serve = ServeProcess(
            root, ["--kubeconfig", str(kubeconfig), "--shutdown-grace", "1"], claims_from_files=False
        ).start()
        assert serve.proc is not None
        wait_for(lambda: "driver ready" in serve.log(), HANG_SECONDS, "driver ready")
        release = fake.stall("/resourceclaims/stuck")
        calls = len(fake.requests)
        outcome: list[object] = []

        def call() -> None:
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                try:
                    outcome.append(client.prepare([ref], timeout=HANG_SECONDS))
                except grpc.RpcError as err:
                    outcome.append(err.code())

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_for(
            lambda: any("/resourceclaims/stuck" in r.path for r in fake.requests_since(calls)),
            HANG_SECONDS,
            "the claim GET the call is stuck on",
        )
        serve.proc.send_signal(signal.SIGTERM)
        try:
            # The stuck GET is held for 120 s; the process must not wait for it.
            assert serve.proc.wait(HANG_SECONDS) == 0
            assert not release.is_set()
        finally:
            release.set()
        assert leftovers(serve) == []
        assert "shutdown grace period over: exiting with calls still running" in serve.log()
        caller.join(HANG_SECONDS)
        assert outcome
        assert outcome[0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


# -- modes never depend on the umask -------------------------------------------------------------


def test_umask_000_gives_no_world_writable_socket_or_file() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root)
        claim = allocated_claim("c", uid(1), [{"request": "gpu", "device": "gpu-0"}])
        (serve.claims_dir / "c.yaml").write_text(yaml.safe_dump(claim))
        serve.start(umask=0)
        try:
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                assert client.prepare([ClaimRef("default", "c", uid(1))]).claims[uid(1)].error == ""
            state = serve.plugins_dir / serve.driver
            [spec] = serve.cdi_dir.glob("*.json")
            modes = {
                path: stat.S_IMODE(os.lstat(path).st_mode)
                for path in (
                    serve.dra_socket,
                    serve.registration_socket,
                    serve.lock_file,
                    state,
                    serve.cdi_dir,
                    state / "checkpoint.json",
                    state / "health.json",
                    spec,
                )
            }
            assert modes == {
                serve.dra_socket: 0o600,
                serve.registration_socket: 0o600,
                serve.lock_file: 0o644,
                state: 0o755,
                serve.cdi_dir: 0o755,
                state / "checkpoint.json": 0o600,
                state / "health.json": 0o644,
                spec: 0o644,
            }
        finally:
            assert serve.stop() == 0


def test_serve_log_is_json_throughout_a_lifecycle_with_errors() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root).start()
        (serve.claims_dir / "bad.yaml").write_text("a: &a [*a]\n")
        try:
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                response = client.prepare([ClaimRef("default", "missing", uid(9))])
                assert "bad.yaml" in response.claims[uid(9)].error
        finally:
            assert serve.stop() == 0
        records = json_lines(serve.log())
        assert records[0]["event"] == "plugin sockets are up"
        assert all(len(json.dumps(r)) <= 16 * 1024 for r in records)
