"""Every DRA call is logged and counted, also one that outlives the kubelet's deadline: the
record says the kubelet got no answer (real serve, real gRPC over its unix socket).

The call is held back the way a busy node holds it: another instance of the driver (here the
test) holds the node-wide `serialize.lock` that every prepare takes with rolling updates on."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import grpc
import pytest
import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import (
    ServeProcess,
    allocated_claim,
    free_port,
    http_get,
    scrape,
    short_tmpdir,
    uid,
    wait_for,
)

POD_UID = "0f3a5a54-5d9c-4d3e-9b1a-000000000028"
FAILED = 'dradriver_dra_call_failures_total{code="DEADLINE_EXCEEDED",method="NodePrepareResources"} 1.0'
COUNTED = 'dradriver_dra_call_duration_seconds_count{api="v1",method="NodePrepareResources"}'


def call_records(log: str, method: str) -> list[dict[str, object]]:
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [r for r in records if r.get("event") == method]


def metric_lines(port: int) -> set[str]:
    """The exposition's sample lines with their labels in sorted order (stable to compare)."""
    out = set()
    for line in scrape(port).splitlines():
        name, brace, rest = line.partition("{")
        if not brace or line.startswith("#"):
            continue
        labels, _, value = rest.partition("} ")
        out.add(f"{name}{{{','.join(sorted(labels.split(',')))}}} {value}")
    return out


def test_a_call_that_outlives_its_deadline_is_logged_and_counted() -> None:
    port = free_port()
    with short_tmpdir() as root:
        serve = ServeProcess(
            root, ["--metrics-address", f"127.0.0.1:{port}", "--log-format", "json"], pod_uid=POD_UID
        )
        claim = allocated_claim("claim-1", uid(1), [{"request": "gpu", "device": "gpu-0"}])
        (serve.claims_dir / "claim-1.yaml").write_text(yaml.safe_dump(claim))
        ref = ClaimRef("default", "claim-1", uid(1))
        serve.start()
        try:
            kubeletclient.register(serve.registration_socket)
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                client.wait_ready(30)
                # Built and idle first: a call whose deadline passes before grpcio hands it to a
                # thread (its start-up holding the interpreter) never reaches any Python code.
                wait_for(lambda: http_get(port, "/readyz")[0] == 200, 30, "readiness")
                with Path(serve.paths.serialize_lock).open("a") as held:
                    fcntl.flock(held, fcntl.LOCK_EX)
                    with pytest.raises(grpc.RpcError) as late:
                        client.prepare([ref], timeout=1.0)
                    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    fcntl.flock(held, fcntl.LOCK_UN)
                wait_for(lambda: FAILED in metric_lines(port), 30, f"{FAILED} (log: {serve.log()})")
                assert f"{COUNTED} 1.0" in metric_lines(port)
                # The call's line follows its metrics.
                wait_for(lambda: call_records(serve.log(), "NodePrepareResources"), 10, "the call's line")
                (record,) = call_records(serve.log(), "NodePrepareResources")
                assert record["unanswered"] == "DEADLINE_EXCEEDED"
                assert record["level"] == "warning"
                assert (record["claims"], record["failed"]) == (1, 0)
                # The work was done: the kubelet's retry is answered from the prepared claim.
                response = client.prepare([ref], timeout=30)
                assert response.claims[ref.uid].error == ""
                wait_for(
                    lambda: len(call_records(serve.log(), "NodePrepareResources")) == 2,
                    30,
                    "the retry's line",
                )
                assert "unanswered" not in call_records(serve.log(), "NodePrepareResources")[1]
        finally:
            serve.kill()
