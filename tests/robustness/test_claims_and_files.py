"""Claims from any source fail one by one, never the whole call; files we write never follow a
planted symlink; recovery reads are bounded; the probe server's threads are bounded. Real
`serve` subprocesses, real sockets."""

from __future__ import annotations

import json
import os
import resource
import socket
from pathlib import Path
from typing import Any

import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import (
    ServeProcess,
    allocated_claim,
    free_port,
    http_get,
    open_idle_connections,
    running_serve,
    short_tmpdir,
    uid,
    wait_for,
)
from tests.robustness.common import HANG_SECONDS


def ref(n: int, name: str | None = None) -> ClaimRef:
    return ClaimRef("default", name or f"c{n}", uid(n))


def good(n: int, device: str) -> dict[str, Any]:
    return allocated_claim(f"c{n}", uid(n), [{"request": "gpu", "device": device}])


def test_wrong_types_anywhere_in_a_claim_are_that_claims_error() -> None:
    broken: dict[int, tuple[dict[str, Any], str]] = {}
    claim = good(2, "gpu-2")
    claim["status"]["allocation"]["devices"]["results"] = "gpu-2"
    broken[2] = (claim, "status.allocation.devices.results: Input should be a valid tuple")
    claim = good(3, "gpu-3")
    claim["status"]["allocation"]["devices"]["results"][0]["pool"] = 7
    broken[3] = (claim, "status.allocation.devices.results[0].pool: Input should be a valid string")
    claim = good(4, "gpu-4")
    claim["status"]["allocation"]["devices"]["config"] = [
        {"opaque": {"driver": "gpu.dradriver.dev", "parameters": ["not", "an", "object"]}}
    ]
    broken[4] = (claim, "invalid opaque config")
    claim = good(5, "gpu-5")
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = "yes"
    broken[5] = (claim, "adminAccess: Input should be a valid boolean")
    claim = good(6, "gpu-6")
    claim["metadata"]["uid"] = ["not", "a", "string"]
    broken[6] = (claim, "metadata.uid: Input should be a valid string")
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as client:
        docs = [good(1, "gpu-1"), *(c for c, _ in broken.values())]
        (serve.claims_dir / "claims.yaml").write_text(yaml.safe_dump_all(docs))
        response = client.prepare([ref(1), *(ref(n) for n in broken)])
        assert response.claims[uid(1)].error == ""
        for n, (_, message) in broken.items():
            assert message in response.claims[uid(n)].error, response.claims[uid(n)].error
        assert [p.name for p in serve.cdi_dir.glob("*.json")] == [
            f"k8s.gpu.dradriver.dev-claim_{uid(1)}.json"
        ]
        assert client.unprepare([ref(1)]).claims[uid(1)].error == ""
    assert "Traceback" not in serve.log()


def test_one_bad_file_affects_only_the_claims_it_holds() -> None:
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as client:
        (serve.claims_dir / "a-good.yaml").write_text(yaml.safe_dump(good(1, "gpu-1")))
        (serve.claims_dir / "b-bomb.yaml").write_text(
            "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 10) + "]\n"
                for i in range(6)
            )
        )
        os.mkfifo(serve.claims_dir / "c-fifo.yaml")  # nobody writes to it: reading it must not hang
        (serve.claims_dir / "d-good.json").write_text(json.dumps(good(2, "gpu-2")))
        response = client.prepare([ref(1), ref(2), ref(3, "in-the-bomb")])
        assert response.claims[uid(1)].error == ""
        assert response.claims[uid(2)].error == ""
        error = response.claims[uid(3)].error
        assert "2 file(s)" in error
        assert "b-bomb.yaml: line " in error
        assert "more than 250000 values (the limit)" in error
        assert "c-fifo.yaml: is a FIFO, not a regular file" in error
        # The daemon still answers, and a good claim added later works.
        (serve.claims_dir / "e-late.yaml").write_text(yaml.safe_dump(good(4, "gpu-4")))
        assert client.prepare([ref(4)]).claims[uid(4)].error == ""


def test_hostile_claim_references_get_short_errors() -> None:
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as client:
        huge = "x" * 1_000_000
        response = client.prepare([ClaimRef("default", huge, huge), ClaimRef(huge, "c", uid(1))])
        assert len(response.claims) == 2
        for entry in response.claims.values():
            assert 0 < len(entry.error) < 1200
            assert "more characters" in entry.error
        assert client.unprepare([ClaimRef("default", "c", huge)]).claims[huge].error != ""
        assert list(serve.cdi_dir.glob("*")) == []
    assert all(len(line) <= 16 * 1024 for line in serve.log().splitlines())


# -- files we write ----------------------------------------------------------------------------------


def test_planted_symlinks_are_replaced_never_followed() -> None:
    with short_tmpdir() as root:
        victim = root / "victim"
        victim.write_text("precious\n")
        serve = ServeProcess(root)
        state = serve.plugins_dir / serve.driver
        state.mkdir(parents=True)
        serve.cdi_dir.mkdir()
        (state / "checkpoint.json").symlink_to(victim)
        spec = serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{uid(1)}.json"
        (serve.claims_dir / "c.yaml").write_text(yaml.safe_dump(good(1, "gpu-1")))
        serve.start()
        try:
            wait_for(lambda: "driver ready" in serve.log(), HANG_SECONDS, "recovery done")
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                # Planted after recovery, at the name the spec is about to be written to.
                spec.symlink_to(victim)
                assert client.prepare([ref(1)]).claims[uid(1)].error == ""
        finally:
            assert serve.stop() == 0
        assert victim.read_text() == "precious\n"
        assert not spec.is_symlink()
        assert yaml.safe_load(spec.read_text())["devices"]
        assert not (state / "checkpoint.json").is_symlink()
        quarantined = list(state.glob("checkpoint.json.corrupt-*"))
        assert [p.is_symlink() for p in quarantined] == [True]  # moved aside, not read through
        assert "is a symbolic link; refusing to follow it" in serve.log()


def test_recovery_reads_are_bounded() -> None:
    with short_tmpdir() as root:
        serve = ServeProcess(root)
        state = serve.plugins_dir / serve.driver
        state.mkdir(parents=True)
        serve.cdi_dir.mkdir()
        (serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{uid(1)}.json").symlink_to("/dev/zero")
        (serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{uid(2)}.json").write_bytes(b"x" * (2 * 1024 * 1024))
        os.mkfifo(state / "fake-events.jsonl")
        serve.start()
        try:
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                client.wait_ready(HANG_SECONDS)
                assert dict(client.unprepare([]).claims) == {}
            assert list(serve.cdi_dir.glob("*.json")) == []  # not ours after all: removed as orphans
        finally:
            assert serve.stop() == 0
        assert "Traceback" not in serve.log()


# -- the probe and metrics server ---------------------------------------------------------------------


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def test_readyz_answers_every_time_with_1000_idle_connections_open() -> None:
    """Idle connections (open, sending nothing) cannot hold the probe out: a new connection takes
    the oldest idle one's slot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    port = free_port()
    with running_serve(["--metrics-address", f"127.0.0.1:{port}"]) as serve:
        kubeletclient.register(serve.registration_socket)
        wait_for(lambda: http_get(port, "/readyz") == (200, "ok\n"), HANG_SECONDS, "readiness")
        idle = open_idle_connections(port, 1000)
        try:
            assert [http_get(port, "/readyz") for _ in range(20)] == [(200, "ok\n")] * 20
            assert http_get(port, "/metrics")[0] == 200
        finally:
            for conn in idle:
                conn.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_200_half_open_connections_do_not_make_200_threads() -> None:
    port = free_port()
    with running_serve(["--metrics-address", f"127.0.0.1:{port}"]) as serve:
        assert serve.proc is not None
        # Counted once start-up's threads run (ready) and the metrics lane has its worker.
        kubeletclient.register(serve.registration_socket)
        wait_for(lambda: http_get(port, "/readyz") == (200, "ok\n"), HANG_SECONDS, "readiness")
        assert http_get(port, "/metrics")[0] == 200
        before = _threads(serve.proc.pid)
        half_open = []
        try:
            for _ in range(200):
                conn = socket.create_connection(("127.0.0.1", port), timeout=10)
                conn.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest of the request
                half_open.append(conn)
            # The kubelet's probe still gets through while they hang there.
            assert http_get(port, "/healthz") == (200, "ok\n")
            assert http_get(port, "/metrics")[0] == 200
            assert _threads(serve.proc.pid) <= before + 2
            # The server closes them once their time to send a request is over.
            for conn in half_open:
                assert conn.recv(1) == b""
        finally:
            for conn in half_open:
                conn.close()
        assert http_get(port, "/readyz")[0] in (200, 503)
