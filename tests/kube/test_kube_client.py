"""The Kubernetes client adapter: config discovery, retries, errors, watch; over real HTTP."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dradriver.kube import (
    ApiError,
    Backoff,
    GoneError,
    KubeClient,
    KubeError,
    NotFoundError,
    RetryPolicy,
    UnreachableError,
    UnsupportedServerError,
    load_client,
    pick_config_source,
)
from dradriver.kube.retry import parse_retry_after
from tests.helpers import wait_for
from tests.publish.kubefake import FakeApiServer

# -- where access comes from (pure) ---------------------------------------------------------------


def test_config_source_order(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("{}")
    in_cluster = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}

    assert pick_config_source("/flag", {"KUBECONFIG": "/env"}, home, token) == ("kubeconfig", "/flag")
    assert pick_config_source(None, {"KUBECONFIG": "/env", **in_cluster}, home, token) == ("in-cluster", None)
    env = tmp_path / "env"
    env.write_text("{}")
    assert pick_config_source(None, {"KUBECONFIG": str(env)}, home, token) == ("kubeconfig", str(env))
    # As kubectl: missing files in $KUBECONFIG are skipped, and a set $KUBECONFIG hides ~/.kube/config.
    assert pick_config_source(None, {"KUBECONFIG": f"/nope:{env}"}, home, token) == ("kubeconfig", str(env))
    assert pick_config_source(None, {"KUBECONFIG": "/nope"}, home, token) is None
    assert pick_config_source(None, in_cluster, home, token) == ("in-cluster", None)
    assert pick_config_source(None, in_cluster, home, tmp_path / "no-token") == (
        "kubeconfig",
        str(home / ".kube/config"),
    )
    assert pick_config_source(None, {}, tmp_path / "nohome", token) is None


def test_no_cluster_access_gives_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_client(None) is None


def test_unusable_kubeconfig_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    with pytest.raises(KubeError, match=f"cannot load kubeconfig {bad}"):
        load_client(str(bad))


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("3", 3.0),
        (" 0 ", 0.0),
        ("", None),
        (None, None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
    ],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, now=1445412480.0) == seconds


def test_backoff_is_jittered_exponential_and_capped() -> None:
    backoff = Backoff(initial=0.2, factor=2.0, cap=5.0, jitter=0.5)
    assert backoff.delay(0, rand=lambda: 0.5) == pytest.approx(0.2)
    assert backoff.delay(3, rand=lambda: 0.5) == pytest.approx(1.6)
    assert backoff.delay(10, rand=lambda: 1.0) == pytest.approx(7.5)
    assert backoff.delay(10, rand=lambda: 0.0) == pytest.approx(2.5)
    assert backoff.wait(0, retry_after=4.0, rand=lambda: 0.5) == 4.0


# -- against the loopback fake --------------------------------------------------------------------


def client_for(fake: FakeApiServer, tmp_path: Path, sleeps: list[float] | None = None) -> KubeClient:
    record = sleeps if sleeps is not None else []
    client = load_client(
        str(tmp_path / "kubeconfig"),
        retry=RetryPolicy(backoff=Backoff(initial=0.01, cap=0.05), max_attempts=4, budget=30.0),
        sleep=record.append,
    )
    assert client is not None
    return client


def test_retries_429_honouring_retry_after(fake_api: FakeApiServer, tmp_path: Path) -> None:
    sleeps: list[float] = []
    client = client_for(fake_api, tmp_path, sleeps)
    fake_api.fail_next(429, count=2, retry_after=2)
    assert client.list_device_classes() == []
    assert sleeps == [2.0, 2.0]
    assert len(fake_api.requests) == 3


def test_gives_up_after_max_attempts(fake_api: FakeApiServer, tmp_path: Path) -> None:
    client = client_for(fake_api, tmp_path)
    fake_api.fail_next(500, count=10)
    with pytest.raises(ApiError, match="HTTP 500 InternalError: injected"):
        client.get_node("n")
    assert len(fake_api.requests) == 4


def test_create_is_not_retried_when_the_server_may_have_acted(
    fake_api: FakeApiServer, tmp_path: Path
) -> None:
    client = client_for(fake_api, tmp_path)
    slice_ = {
        "metadata": {"generateName": "x-"},
        "spec": {"driver": "d", "pool": {"name": "p", "resourceSliceCount": 1}},
    }
    fake_api.fail_next(500)
    with pytest.raises(ApiError):
        client.create_resource_slice(slice_)
    assert len(fake_api.requests) == 1
    fake_api.fail_next(503, retry_after=0)  # 503: the server did not act
    assert client.create_resource_slice(slice_)["metadata"]["name"].startswith("x-")
    assert len(fake_api.requests) == 3


def test_connection_refused_is_retried_then_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = FakeApiServer()
    fake.write_kubeconfig(tmp_path / "kubeconfig", server=f"http://127.0.0.1:{port}")
    sleeps: list[float] = []
    client = client_for(fake, tmp_path, sleeps)
    with pytest.raises(UnreachableError, match="cannot connect"):
        client.create_resource_slice({"metadata": {"generateName": "x-"}})
    assert len(sleeps) == 3
    fake.stop()


def test_v1_not_served_names_the_version_requirement(tmp_path: Path) -> None:
    fake = FakeApiServer(serve_resource_v1=False).start()
    fake.write_kubeconfig(tmp_path / "kubeconfig")
    client = client_for(fake, tmp_path)
    with pytest.raises(
        UnsupportedServerError, match=r"does not serve resource.k8s.io/v1 .*Kubernetes >= 1.34"
    ):
        client.check_resource_v1()
    fake.stop()


def test_v1_served(fake_api: FakeApiServer, tmp_path: Path) -> None:
    client_for(fake_api, tmp_path).check_resource_v1()


def test_objects_round_trip_as_dicts(fake_api: FakeApiServer, tmp_path: Path) -> None:
    client = client_for(fake_api, tmp_path)
    node = fake_api.create("nodes", None, {"metadata": {"name": "node-a"}})
    assert client.node_uid("node-a") == node["metadata"]["uid"]
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": []}}}
    fake_api.create("resourceclaims", "team-a", claim)
    got = client.get_resource_claim("team-a", "c")
    assert got["metadata"]["namespace"] == "team-a"
    assert got["spec"] == claim["spec"]
    with pytest.raises(NotFoundError):
        client.get_resource_claim("team-a", "missing")
    fake_api.create("deviceclasses", None, {"metadata": {"name": "gpu"}, "spec": {}})
    assert [c["metadata"]["name"] for c in client.list_device_classes()] == ["gpu"]
    event = client.create_event("default", {"metadata": {"generateName": "node-a."}, "reason": "Test"})
    assert event["metadata"]["namespace"] == "default"


def test_a_server_url_with_a_path_prefixes_every_request(fake_api: FakeApiServer, tmp_path: Path) -> None:
    """A server behind a proxy (`server: https://proxy/k8s/clusters/c-1`): every request goes under
    its path, as kubectl sends it."""
    fake_api.write_kubeconfig(tmp_path / "kubeconfig", server=f"{fake_api.url}/k8s/clusters/c-1/")
    client = client_for(fake_api, tmp_path)
    seen = len(fake_api.requests)
    with pytest.raises(NotFoundError):  # the fake serves at its root only
        client.get_resource_claim("team-a", "c")
    assert [r.path for r in fake_api.requests_since(seen)] == [
        "/k8s/clusters/c-1/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c"
    ]


def test_delete_preconditions(fake_api: FakeApiServer, tmp_path: Path) -> None:
    client = client_for(fake_api, tmp_path)
    spec = {"driver": "d", "pool": {"name": "p", "resourceSliceCount": 1}}
    created = client.create_resource_slice({"metadata": {"generateName": "x-"}, "spec": spec})
    name, uid = created["metadata"]["name"], created["metadata"]["uid"]
    with pytest.raises(ApiError, match="Precondition failed"):
        client.delete_resource_slice(name, uid=uid, resource_version="1")
    client.delete_resource_slice(name, uid=uid, resource_version=created["metadata"]["resourceVersion"])
    with pytest.raises(NotFoundError):
        client.delete_resource_slice(name)


def test_watch_streams_events_and_reports_gone(fake_api: FakeApiServer, tmp_path: Path) -> None:
    client = client_for(fake_api, tmp_path)
    rv = client.list_resource_slices("spec.driver=d")["metadata"]["resourceVersion"]
    spec = {"driver": "d", "pool": {"name": "p", "resourceSliceCount": 1}}
    fake_api.create("resourceslices", None, {"metadata": {"name": "mine"}, "spec": spec})
    fake_api.create("resourceslices", None, {"metadata": {"name": "other"}, "spec": {**spec, "driver": "e"}})
    with client.watch_resource_slices("spec.driver=d", rv) as stream:
        event = next(iter(stream))
    assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "mine")

    fake_api.compact()
    with pytest.raises(GoneError), client.watch_resource_slices("spec.driver=d", rv) as stream:
        list(stream)


def test_watch_close_from_another_thread_ends_iteration(fake_api: FakeApiServer, tmp_path: Path) -> None:
    import threading

    client = client_for(fake_api, tmp_path)
    rv = client.list_resource_slices()["metadata"]["resourceVersion"]
    stream = client.watch_resource_slices(None, rv)
    done = threading.Event()

    def consume() -> None:
        list(stream)
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    assert not done.wait(0.3)
    stream.close()
    wait_for(done.is_set, 2, "the watch iteration to end")
