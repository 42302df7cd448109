"""Where the API server is and who we are to it: kubeconfig files and the pod's service account.

Why our own loader rather than the `kubernetes` package's: importing that package costs a node
0.2-0.35 s of CPU and 9 MB at every start (it brings requests, oauthlib, jsonschema and
websocket-client along), the largest single part of a `serve` start; a thousand nodes restarted
by one DaemonSet rollout pay it a thousand times (bench_fleet, bench/RESULTS.md). What kubectl
reads for a user is covered: client certificates, tokens, token files, exec credential plugins
(client.authentication.k8s.io v1 and v1beta1); the two ways Kubernetes itself removed (the
auth-provider plugins, basic auth) are refused with a line saying so.

Kubeconfig rules as kubectl's: several files ($KUBECONFIG) merge with the first definition of a
name winning and the first current-context set winning; relative paths are relative to the file
that names them.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlsplit

from dradriver.files import FileInputError, load_document

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: An exec credential is renewed this long before it expires, so no request carries a stale one.
EXEC_RENEW_MARGIN = 10.0
EXEC_TIMEOUT = 60.0


class AccessError(ValueError):
    """The configuration cannot be used; the message names the file, entry and field."""


@dataclass(frozen=True)
class ExecPlugin:
    """A `user.exec` entry: a command that prints an ExecCredential."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    install_hint: str = ""
    #: What the plugin may ask for under spec.cluster (provideClusterInfo).
    cluster_info: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Access:
    server: str
    #: The CA bundle (PEM) to trust; None trusts the system's roots.
    ca_pem: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    #: (certificate PEM, key PEM) for TLS client authentication.
    client_cert: tuple[str, str] | None = None
    token: str | None = None
    token_file: Path | None = None
    exec_plugin: ExecPlugin | None = None
    #: Whose credentials, for messages: "kubeconfig PATH: user NAME" or "in-cluster service account".
    origin: str = ""


# -- the pod's service account ---------------------------------------------------------------------


def in_cluster(environ: Mapping[str, str], directory: Path = SERVICE_ACCOUNT_DIR) -> Access:
    origin = "in-cluster service account"
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise AccessError(f"{origin}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    token = directory / "token"
    if not token.is_file():
        raise AccessError(f"{origin}: {token}: no service account token")
    return Access(
        server=f"https://{host}:{port}",
        ca_pem=_read_text(directory / "ca.crt", f"{origin}: CA"),
        token_file=token,
        origin=origin,
    )


# -- kubeconfig files --------------------------------------------------------------------------------


def from_kubeconfig(paths: str) -> Access:
    """The current context's Access from one file or an os.pathsep-separated list of them."""
    files = [Path(p).expanduser() for p in paths.split(os.pathsep) if p]
    documents: list[tuple[Path, Mapping[str, Any]]] = []
    for path in files:
        try:
            document = load_document(path)
        except FileInputError as err:
            raise AccessError(f"kubeconfig {err}") from None
        if document is None:
            continue
        if not isinstance(document, dict):
            raise AccessError(f"kubeconfig {path}: must be a mapping (apiVersion: v1, kind: Config)")
        documents.append((path, document))
    return resolve(documents, origin=f"kubeconfig {paths}")


def resolve(documents: Sequence[tuple[Path, Mapping[str, Any]]], origin: str) -> Access:
    """Merge kubeconfig documents (kubectl's rules) and read the current context's cluster and user."""
    merged = _Merged.of(documents)
    if not merged.current_context:
        raise AccessError(f"{origin}: no current-context is set")
    context, _ = merged.entry("contexts", "context", merged.current_context, origin)
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not cluster_name:
        raise AccessError(f"{origin}: context {merged.current_context!r} names no cluster")
    cluster, cluster_dir = merged.entry("clusters", "cluster", str(cluster_name), origin)
    user, user_dir = merged.entry("users", "user", str(user_name), origin) if user_name else ({}, Path())
    where = f"{origin}: cluster {cluster_name!r}"
    user_origin = f"{origin}: user {user_name!r}" if user_name else origin
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise AccessError(f"{where}: server is not set")
    if not _server_url(server):
        raise AccessError(f"{where}: server {server!r} is not an https:// (or http://) URL with a host")
    if cluster.get("proxy-url"):
        raise AccessError(f"{where}: proxy-url is not supported by dradriver")
    ca_pem = _pem(cluster, "certificate-authority", cluster_dir, where)
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    tls_server_name = cluster.get("tls-server-name") or None
    return Access(
        server=server.rstrip("/"),
        ca_pem=ca_pem,
        insecure=insecure,
        tls_server_name=tls_server_name,
        origin=user_origin,
        **_user_credentials(user, user_dir, user_origin, cluster),
    )


@dataclass
class _Merged:
    current_context: str = ""
    #: (kind, name) -> (entry body, directory of the file that defined it)
    entries: dict[tuple[str, str], tuple[Mapping[str, Any], Path]] = field(default_factory=dict)

    @classmethod
    def of(cls, documents: Sequence[tuple[Path, Mapping[str, Any]]]) -> _Merged:
        merged = cls()
        for path, document in documents:
            merged.current_context = merged.current_context or str(document.get("current-context") or "")
            for kind, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
                for item in document.get(kind) or []:
                    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                        raise AccessError(f"kubeconfig {path}: {kind}: every entry needs a name")
                    body = item.get(key) or {}
                    if not isinstance(body, dict):
                        where = f"kubeconfig {path}: {kind} {item['name']!r}"
                        raise AccessError(f"{where}: {key} must be a mapping")
                    merged.entries.setdefault((kind, item["name"]), (body, path.parent))
        return merged

    def entry(self, kind: str, key: str, name: str, origin: str) -> tuple[Mapping[str, Any], Path]:
        try:
            return self.entries[(kind, name)]
        except KeyError:
            raise AccessError(f"{origin}: no {key} named {name!r} in {kind}") from None


class _UserCredentials(TypedDict, total=False):
    """The user's part of an Access, as its fields are named."""

    client_cert: tuple[str, str]
    token: str
    token_file: Path
    exec_plugin: ExecPlugin


def _server_url(server: str) -> bool:
    """Whether `server` is a URL requests can be sent to: scheme, host, and a valid port if any."""
    try:
        url = urlsplit(server)
        return url.scheme in ("https", "http") and bool(url.hostname) and url.port != 0
    except ValueError:  # a port that is no number, or out of range
        return False


def _user_credentials(
    user: Mapping[str, Any], directory: Path, where: str, cluster: Mapping[str, Any]
) -> _UserCredentials:
    if user.get("auth-provider"):
        raise AccessError(
            f"{where}: auth-provider plugins were removed from Kubernetes (1.26); use an exec "
            "credential plugin (user.exec) instead"
        )
    if user.get("username") or user.get("password"):
        raise AccessError(f"{where}: basic authentication was removed from Kubernetes (1.19)")
    found: _UserCredentials = {}
    cert = _pem(user, "client-certificate", directory, where)
    key = _pem(user, "client-key", directory, where)
    if (cert is None) != (key is None):
        raise AccessError(f"{where}: client-certificate and client-key go together")
    if cert is not None and key is not None:
        found["client_cert"] = (cert, key)
    if user.get("token"):
        found["token"] = str(user["token"])
    elif user.get("tokenFile"):
        found["token_file"] = _path(str(user["tokenFile"]), directory)
    if user.get("exec"):
        found["exec_plugin"] = _exec_plugin(user["exec"], directory, where, cluster)
    return found


def _exec_plugin(spec: Any, directory: Path, where: str, cluster: Mapping[str, Any]) -> ExecPlugin:
    if not isinstance(spec, dict) or not isinstance(spec.get("command"), str) or not spec["command"]:
        raise AccessError(f"{where}: exec.command is not set")
    api_version = str(spec.get("apiVersion") or "")
    if api_version not in ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"):
        raise AccessError(
            f"{where}: exec.apiVersion {api_version!r} is not client.authentication.k8s.io/v1 or v1beta1"
        )
    if spec.get("interactiveMode") == "Always":
        raise AccessError(f"{where}: exec.interactiveMode Always needs a terminal; dradriver has none")
    command = spec["command"]
    if os.sep in command and not os.path.isabs(command):  # kubectl: relative to the kubeconfig
        command = str(directory / command)
    env = tuple((str(e.get("name")), str(e.get("value", ""))) for e in spec.get("env") or [])
    info = None
    if spec.get("provideClusterInfo"):
        info = {
            k: cluster[k]
            for k in ("server", "tls-server-name", "insecure-skip-tls-verify", "certificate-authority-data")
            if k in cluster
        }
    return ExecPlugin(
        command=command,
        args=tuple(str(a) for a in spec.get("args") or []),
        env=env,
        api_version=api_version,
        install_hint=str(spec.get("installHint") or ""),
        cluster_info=info,
    )


def _pem(entry: Mapping[str, Any], name: str, directory: Path, where: str) -> str | None:
    """`name-data` (base64 PEM) or the file `name` names."""
    data = entry.get(f"{name}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise AccessError(f"{where}: {name}-data is not base64 of a PEM text") from None
    if entry.get(name):
        return _read_text(_path(str(entry[name]), directory), f"{where}: {name}")
    return None


def _path(value: str, directory: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else directory / path


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise AccessError(f"{what}: cannot read {path}: {getattr(err, 'strerror', None) or err}") from None


# -- bearer tokens -----------------------------------------------------------------------------------


class Credentials:
    """The bearer token each request carries, kept fresh.

    Token files are re-read when they change (the kubelet rotates service account tokens); exec
    plugins run again shortly before their credential expires or after the server refused it.
    Lock rule: `_lock` guards `_token`, `_expires` and `_stamp`; requests come from several threads.
    """

    def __init__(self, access: Access) -> None:
        self._access = access
        self._lock = threading.Lock()
        self._token: str | None = access.token
        self._expires: float | None = None
        self._stamp: tuple[int, int, int] | None = None

    @property
    def renewable(self) -> bool:
        return self._access.exec_plugin is not None or self._access.token_file is not None

    def header(self) -> str | None:
        """The Authorization header's value, or None when the user has no token."""
        with self._lock:
            if self._access.exec_plugin is not None:
                if self._token is None or (self._expires is not None and time.time() > self._expires):
                    self._token, self._expires = self._exec(self._access.exec_plugin)
            elif self._access.token_file is not None:
                self._reread(self._access.token_file)
            return f"Bearer {self._token}" if self._token else None

    def invalidate(self) -> None:
        """The server refused the token: fetch a new one before the next request."""
        with self._lock:
            if self._access.exec_plugin is not None:
                self._token = None
            self._stamp = None

    def _reread(self, path: Path) -> None:
        try:
            # A projected token is replaced by swapping a symlink to a new file: another inode,
            # whatever the timestamps say.
            status = path.stat()
            stamp = (status.st_dev, status.st_ino, status.st_mtime_ns)
            if stamp != self._stamp:
                self._token, self._stamp = path.read_text().strip(), stamp
        except OSError as err:
            raise AccessError(f"{self._access.origin}: token file {path}: {err.strerror}") from None

    def _exec(self, plugin: ExecPlugin) -> tuple[str, float | None]:
        where = f"{self._access.origin}: exec plugin {plugin.command}"
        spec: dict[str, Any] = {"interactive": False}
        if plugin.cluster_info is not None:
            spec["cluster"] = plugin.cluster_info
        info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        if shutil.which(plugin.command, path=env.get("PATH")) is None:
            hint = f" ({plugin.install_hint.strip()})" if plugin.install_hint else ""
            raise AccessError(f"{where}: not found{hint}")
        try:
            done = subprocess.run(
                [plugin.command, *plugin.args],
                env=env,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=EXEC_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise AccessError(f"{where}: {err}") from None
        if done.returncode != 0:
            last = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise AccessError(f"{where}: exited with {done.returncode}: {last[0]}")
        try:
            status = json.loads(done.stdout)["status"]
            if "token" not in status and status.get("clientCertificateData"):
                raise AccessError(f"{where}: gave a client certificate; dradriver takes only tokens")
            token = status["token"]
        except (ValueError, KeyError, TypeError):
            raise AccessError(f"{where}: printed no ExecCredential with status.token") from None
        if not isinstance(token, str) or not token:
            raise AccessError(f"{where}: status.token is empty")
        expires = status.get("expirationTimestamp")
        if not expires:
            return token, None
        try:
            when = datetime.fromisoformat(str(expires).replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise AccessError(f"{where}: status.expirationTimestamp {expires!r} is not RFC 3339") from None
        return token, when - EXEC_RENEW_MARGIN
