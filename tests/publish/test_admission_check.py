"""serve's start check: is another node's slice refused to this node's token (the admission policy)?

Against the loopback fake API server, whose stand-in policy refuses slices of `*.invalid` nodes;
tests/e2e/test_admission.py runs the same check against the real policy on a real API server.
"""

from __future__ import annotations

import signal
from pathlib import Path

from dradriver.kube import KubeClient, load_client
from dradriver.kube.access import Access
from dradriver.publish.admission import PROBE_NODE, RETRY_SECONDS, check_slice_admission, probe
from tests.helpers import ServeProcess, free_port, http_get, short_tmpdir, wait_for
from tests.publish.apiservers import TEST_DRIVER
from tests.publish.kubefake import FakeApiServer

NOT_ENFORCED = "SECURITY: the ResourceSlice admission policy is not in force"


def serve_on(fake: FakeApiServer, kubeconfig: Path, root: Path, *extra: str) -> ServeProcess:
    """`serve` for node-1 (its Node exists, for the Events) on the fake, not yet started."""
    fake.create("nodes", None, {"metadata": {"name": "node-1"}})
    return ServeProcess(
        root,
        ["--kubeconfig", str(kubeconfig), *extra],
        {"DRADRIVER_DRIVER_NAME": TEST_DRIVER},
        TEST_DRIVER,
        claims_from_files=False,
    )


def probes(fake: FakeApiServer) -> list[str]:
    return [
        r.query.get("dryRun", "") for r in fake.requests if r.method == "POST" and "resourceslices" in r.path
    ]


def test_a_refused_probe_means_enforced_and_stores_nothing(fake_api: FakeApiServer, tmp_path: Path) -> None:
    client = load_client(str(tmp_path / "kubeconfig"))
    assert client is not None
    waits: list[float] = []
    result = probe(client, TEST_DRIVER, sleep=waits.append)
    assert result.outcome == "enforced"
    assert f"not '{PROBE_NODE}'" in result.detail
    assert probes(fake_api) == ["All"]
    assert waits == []

    fake_api.slice_admission = None  # no policy: asked again once (it may be loading), then reported
    result = probe(client, TEST_DRIVER, sleep=waits.append)
    assert result.outcome == "not-enforced"
    assert waits == [RETRY_SECONDS]
    assert probes(fake_api) == ["All"] * 3
    assert fake_api.list_objects("resourceslices", None, [])["items"] == []  # dry runs only

    fake_api.slice_admission = lambda _: None
    fake_api.fail_next(403)  # RBAC's refusal is no admission policy: nothing concluded
    assert probe(client, TEST_DRIVER, sleep=waits.append).outcome == "unknown"


def test_serve_warns_loudly_without_the_policy_and_keeps_serving(
    fake_api: FakeApiServer, tmp_path: Path
) -> None:
    fake_api.slice_admission = None
    port = free_port()
    with short_tmpdir() as root:
        serve = serve_on(fake_api, tmp_path / "kubeconfig", root, "--metrics-address", f"127.0.0.1:{port}")
        serve.start()
        try:
            wait_for(lambda: NOT_ENFORCED in serve.log(), 15, f"the warning (log: {serve.log()})")
            wait_for(lambda: fake_api.list_objects("events", None, [])["items"], 10, "the Event on the Node")
            (event,) = fake_api.list_objects("events", None, [])["items"]
            assert event["reason"] == "SliceAdmissionPolicyNotEnforced"
            assert event["type"] == "Warning"
            assert event["involvedObject"]["kind"] == "Node"
            status, body = http_get(port, "/metrics")
            assert status == 200
            assert 'dradriver_slice_admission_policy{outcome="not-enforced"} 1.0' in body
            assert len([line for line in serve.log().splitlines() if NOT_ENFORCED in line]) == 1
            assert serve.proc is not None
            assert serve.proc.poll() is None  # a warning: it keeps serving
        finally:
            serve.stop(signal.SIGTERM)


def test_serve_exits_without_the_policy_when_it_is_required(fake_api: FakeApiServer, tmp_path: Path) -> None:
    fake_api.slice_admission = None
    with short_tmpdir() as root:
        serve = serve_on(fake_api, tmp_path / "kubeconfig", root, "--require-admission-policy").start()
        try:
            assert serve.proc is not None
            assert serve.proc.wait(20) == 1
            assert f"--require-admission-policy: {NOT_ENFORCED}" in serve.log()
        finally:
            serve.kill()


def test_serve_with_the_policy_says_so_once(fake_api: FakeApiServer, tmp_path: Path) -> None:
    with short_tmpdir() as root:
        serve = serve_on(fake_api, tmp_path / "kubeconfig", root, "--require-admission-policy").start()
        try:
            wait_for(
                lambda: "keeps this node's token to its own ResourceSlices" in serve.log(), 15, "the check"
            )
            assert probes(fake_api).count("All") == 1  # then the pool's own writes, not dry runs
            assert NOT_ENFORCED not in serve.log()
        finally:
            serve.stop(signal.SIGTERM)


def test_credentials_that_are_no_service_accounts_are_not_probed_unless_required() -> None:
    """A developer's or a benchmark's user (certificates, here none at all) is not what the policy
    constrains: no probe, no warning; --require-admission-policy probes whoever runs."""
    fake = FakeApiServer(allow_anonymous=True).start()
    try:
        client = KubeClient(Access(server=fake.url))

        def check(required: bool) -> str:
            return check_slice_admission(
                client, driver_name=TEST_DRIVER, node_name="node-1", events=None, required=required
            ).outcome

        assert check(required=False) == "unknown"
        assert probes(fake) == []
        assert check(required=True) == "enforced"
        assert probes(fake) == ["All"]
    finally:
        fake.stop()
