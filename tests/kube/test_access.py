"""Cluster access without the `kubernetes` package: kubeconfig rules as kubectl's, tokens kept
fresh (token files, exec plugins run as real processes), TLS with client certificates, over real
HTTP(S) to the loopback fake API server."""

from __future__ import annotations

import base64
import datetime
import os
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver import __version__
from dradriver.kube import KubeClient, KubeError, UnreachableError, load_client
from dradriver.kube.access import Access, AccessError, from_kubeconfig, in_cluster, resolve
from tests.e2e.pki import Pki
from tests.publish.kubefake import FakeApiServer


def kubeconfig(
    path: Path, user: dict[str, Any], cluster: dict[str, Any], *, current: str | None = "ctx"
) -> Path:
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
    }
    if current:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- kubeconfig rules (files, no server) -----------------------------------------------------------


def test_files_merge_as_kubectl_merges_them(tmp_path: Path) -> None:
    """First definition of a name wins, the first current-context set wins, and a relative path
    is relative to the file that names it."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (second / "ca.pem").write_text("CA FROM B")
    kubeconfig(first / "config", {"token": "from-a"}, {"server": "https://a:6443"}, current=None)
    (second / "config").write_text(
        yaml.safe_dump(
            {
                "current-context": "other",
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://ignored"}},
                    {
                        "name": "c2",
                        "cluster": {"server": "https://b:6443", "certificate-authority": "ca.pem"},
                    },
                ],
                "users": [{"name": "u", "user": {"token": "ignored"}}],
                "contexts": [{"name": "other", "context": {"cluster": "c2", "user": "u"}}],
            }
        )
    )
    access = from_kubeconfig(f"{first / 'config'}{os.pathsep}{second / 'config'}")
    assert (access.server, access.ca_pem, access.token) == ("https://b:6443", "CA FROM B", "from-a")


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        (
            {"auth-provider": {"name": "gcp"}},
            {"server": "https://s"},
            "user 'u': auth-provider plugins were removed",
        ),
        (
            {"username": "a", "password": "b"},
            {"server": "https://s"},
            "user 'u': basic authentication was removed",
        ),
        (
            {"client-certificate-data": b64("C")},
            {"server": "https://s"},
            "client-certificate and client-key go",
        ),
        ({"client-key-data": "%%%"}, {"server": "https://s"}, "user 'u': client-key-data is not base64"),
        ({}, {}, "cluster 'c': server is not set"),
        ({}, {"server": "10.0.0.1:6443"}, "cluster 'c': server '10.0.0.1:6443' is not an https://"),
        ({}, {"server": "https://"}, "cluster 'c': server 'https://' is not an https://"),
        ({}, {"server": "https://h:port"}, "cluster 'c': server 'https://h:port' is not an https://"),
        ({}, {"server": "https://s", "proxy-url": "http://p"}, "cluster 'c': proxy-url is not supported"),
        (
            {},
            {"server": "https://s", "certificate-authority": "nope.pem"},
            "certificate-authority: cannot read",
        ),
        (
            {"exec": {"command": "x", "apiVersion": "v1"}},
            {"server": "https://s"},
            "exec.apiVersion 'v1' is not",
        ),
        (
            {
                "exec": {
                    "command": "x",
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "interactiveMode": "Always",
                }
            },
            {"server": "https://s"},
            "interactiveMode Always needs a terminal",
        ),
    ],
)
def test_unusable_entries_are_named(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any], message: str
) -> None:
    path = kubeconfig(tmp_path / "config", user, cluster)
    with pytest.raises(AccessError, match=f"^kubeconfig {path}: .*{message}"):
        from_kubeconfig(str(path))


def test_missing_context_and_names(tmp_path: Path) -> None:
    with pytest.raises(AccessError, match="no current-context is set"):
        resolve([(tmp_path / "k", {"clusters": []})], origin="kubeconfig k")
    with pytest.raises(AccessError, match="no context named 'x' in contexts"):
        resolve([(tmp_path / "k", {"current-context": "x"})], origin="kubeconfig k")


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("CA")
    access = in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
    assert (access.server, access.ca_pem, access.token_file) == (
        "https://[fd00::1]:443",
        "CA",
        tmp_path / "token",
    )
    with pytest.raises(AccessError, match=r"^in-cluster service account: KUBERNETES_SERVICE_HOST"):
        in_cluster({}, tmp_path)


# -- tokens, over HTTP -------------------------------------------------------------------------------


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    fake = FakeApiServer(token="first").start()
    yield fake
    fake.stop()


def test_token_file_is_read_again_when_it_changes(api: FakeApiServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    client = KubeClient(Access(server=api.url, token_file=token))
    assert client.server_version() is not None
    api.token = "second"  # the kubelet rotated the service account token
    token.write_text("second\n")
    os.utime(token, ns=(1, 1))  # a new mtime even within the file system's timestamp granularity
    client.check_resource_v1()
    assert api.requests[-1].user_agent == f"dradriver/{__version__}"


def test_a_projected_token_is_used_as_soon_as_the_kubelet_swaps_it(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The kubelet's atomic writer: `token` -> `..data/token`, and `..data` re-pointed at a new
    directory; the new file may carry the old one's timestamps. The first request after the swap
    already carries the new token (no 401 first: the old one may have expired)."""
    first, second = tmp_path / "..2026_01_01", tmp_path / "..2026_01_02"
    first.mkdir()
    (first / "token").write_text("first\n")
    (tmp_path / "..data").symlink_to(first.name)
    token = tmp_path / "token"
    token.symlink_to("..data/token")
    client = KubeClient(Access(server=api.url, token_file=token))
    assert client.server_version() is not None

    second.mkdir()
    (second / "token").write_text("second\n")
    old = (first / "token").stat()
    os.utime(second / "token", ns=(old.st_atime_ns, old.st_mtime_ns))
    (tmp_path / "..data_tmp").symlink_to(second.name)
    (tmp_path / "..data_tmp").replace(tmp_path / "..data")
    api.token = "second"
    sent = len(api.requests)
    client.check_resource_v1()
    assert len(api.requests) == sent + 1


def exec_plugin(tmp_path: Path, expires_in: float) -> Path:
    """A credential plugin that prints the token in `tokens` and counts its runs in `runs`."""
    script = tmp_path / "plugin"
    script.write_text(
        f"#!{sys.executable}\n"
        "import datetime, json, os, pathlib, sys\n"
        "here = pathlib.Path(sys.argv[0]).parent\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['kind'] == 'ExecCredential' and info['spec']['interactive'] is False, info\n"
        "with open(here / 'runs', 'a') as runs: runs.write(os.environ['GREETING'] + '\\n')\n"
        f"expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds={expires_in})\n"
        "status = {'token': (here / 'tokens').read_text().strip(),\n"
        "          'expirationTimestamp': expires.strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential', 'status': status}))\n"
    )
    script.chmod(0o755)
    (tmp_path / "tokens").write_text("first")
    return script


def exec_kubeconfig(tmp_path: Path, server: str) -> Path:
    return kubeconfig(
        tmp_path / "config",
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "./plugin",  # relative to the kubeconfig, as kubectl resolves it
                "env": [{"name": "GREETING", "value": "hello"}],
            }
        },
        {"server": server},
    )


def test_exec_plugin_runs_once_then_again_when_refused(api: FakeApiServer, tmp_path: Path) -> None:
    exec_plugin(tmp_path, expires_in=3600)
    client = load_client(str(exec_kubeconfig(tmp_path, api.url)))
    assert client is not None
    client.check_resource_v1()
    client.server_version()
    assert (tmp_path / "runs").read_text().splitlines() == ["hello"]
    api.token = "second"  # revoked: the server answers 401 until the plugin gives the new one
    (tmp_path / "tokens").write_text("second")
    client.check_resource_v1()
    assert (tmp_path / "runs").read_text().splitlines() == ["hello", "hello"]


def test_exec_plugin_runs_again_before_expiry(api: FakeApiServer, tmp_path: Path) -> None:
    exec_plugin(tmp_path, expires_in=5)  # within the renewal margin: every request renews it
    client = load_client(str(exec_kubeconfig(tmp_path, api.url)))
    assert client is not None
    client.check_resource_v1()
    client.check_resource_v1()
    assert len((tmp_path / "runs").read_text().splitlines()) == 2


def test_exec_plugin_failure_is_one_line(api: FakeApiServer, tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, expires_in=3600)
    script.write_text("#!/bin/sh\necho 'token expired, run: login' >&2\nexit 3\n")
    client = load_client(str(exec_kubeconfig(tmp_path, api.url)))
    assert client is not None
    with pytest.raises(KubeError, match=r"exec plugin .*plugin: exited with 3: token expired, run: login$"):
        client.check_resource_v1()


# -- TLS -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_api(pki: Pki) -> Iterator[FakeApiServer]:
    """The fake API server over TLS with a certificate for `apiserver.test` only, asking every
    client for a certificate of the same CA."""
    serving = pki.issue("apiserver", "apiserver", dns=("apiserver.test",))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca.cert))
    context.load_cert_chain(serving.cert, serving.key)
    context.verify_mode = ssl.CERT_REQUIRED
    fake = FakeApiServer(tls=context, allow_anonymous=True).start()
    yield fake
    fake.stop()


def test_client_certificate_and_tls_server_name(tls_api: FakeApiServer, pki: Pki, tmp_path: Path) -> None:
    user = pki.issue("node", "system:node:n")
    (tmp_path / "ca.crt").write_bytes(pki.ca.cert.read_bytes())
    path = kubeconfig(
        tmp_path / "config",
        {
            "client-certificate-data": b64(user.cert.read_text()),
            "client-key-data": b64(user.key.read_text()),
        },
        {"server": tls_api.url, "certificate-authority": "ca.crt", "tls-server-name": "apiserver.test"},
    )
    client = load_client(str(path))
    assert client is not None
    client.check_resource_v1()
    assert not list(tmp_path.glob("dradriver-tls-*"))

    # Without the server name the certificate (for apiserver.test) does not match 127.0.0.1.
    document = yaml.safe_load(path.read_text())
    del document["clusters"][0]["cluster"]["tls-server-name"]
    path.write_text(yaml.safe_dump(document))
    client = load_client(str(path))
    assert client is not None
    with pytest.raises(UnreachableError, match="CERTIFICATE_VERIFY_FAILED"):
        client.request("GET", "/version", idempotent=False)


def test_mismatched_client_key_is_named(tls_api: FakeApiServer, pki: Pki, tmp_path: Path) -> None:
    user, other = pki.issue("node", "system:node:n"), pki.issue("other", "other")
    path = kubeconfig(
        tmp_path / "config",
        {"client-certificate": str(user.cert), "client-key": str(other.key)},
        {"server": tls_api.url, "insecure-skip-tls-verify": True},
    )
    with pytest.raises(
        KubeError, match=f"^cannot load kubeconfig {path}: user 'u': client-certificate and client-key: "
    ):
        load_client(str(path))


def test_expired_exec_timestamp_format_is_named(api: FakeApiServer, tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, expires_in=3600)
    when = datetime.datetime.now(datetime.UTC).isoformat()
    script.write_text(
        f"#!{sys.executable}\nimport json\n"
        f"print(json.dumps({{'status': {{'token': 'first', 'expirationTimestamp': 'soon {when}'}}}}))\n"
    )
    client = load_client(str(exec_kubeconfig(tmp_path, api.url)))
    assert client is not None
    with pytest.raises(KubeError, match=r"status\.expirationTimestamp 'soon .*' is not RFC 3339"):
        client.check_resource_v1()
