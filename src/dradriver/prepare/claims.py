"""Where ResourceClaims come from: the API server, or files (demo, tests, node-only set-ups).

Both give the claim as `resource.k8s.io/v1` JSON. `ClaimNotFoundError` means the claim does not
exist (used to garbage-collect claims deleted behind the kubelet's back); any other problem is a
`ClaimSourceError`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

if TYPE_CHECKING:
    from dradriver.kube import KubeClient


class ClaimSourceError(Exception):
    pass


class ClaimNotFoundError(ClaimSourceError):
    pass


class ClaimsUnavailableError(ClaimSourceError):
    """There is no source to ask at all: a per-claim error rather than a failed call."""


class ClaimSource(Protocol):
    #: True when a missing claim really means it was deleted (so stale state may be collected).
    authoritative: bool

    def get(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class NoClaimSource:
    """Node-only mode: there is nothing to fetch claims from."""

    authoritative = False

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise ClaimsUnavailableError(
            f"cannot fetch ResourceClaim {namespace}/{name}: no Kubernetes API access (node-only mode; "
            "run in a pod, or pass --kubeconfig)"
        )


class DirectoryClaimSource:
    """ResourceClaims from the YAML/JSON files of a directory.

    Files may hold several documents or a List; anything that is not a ResourceClaim is ignored.
    A file is parsed again only when it changes (size, mtime or inode), so lookups stay cheap
    when one file holds many claims.
    """

    authoritative = False

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._files: dict[Path, tuple[tuple[int, int, int], dict[tuple[str, str], Mapping[str, Any]]]] = {}

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        with self._lock:
            for claims in self._refresh():
                claim = claims.get((namespace, name))
                if claim is not None:
                    return claim
        raise ClaimNotFoundError(f"resourceclaims.resource.k8s.io {name!r} not found in {namespace!r}")

    def _refresh(self) -> list[dict[tuple[str, str], Mapping[str, Any]]]:
        try:
            paths = sorted(p for p in self._directory.iterdir() if p.suffix in {".yaml", ".yml", ".json"})
        except FileNotFoundError:
            return []
        current = {}
        for path in paths:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            cached = self._files.get(path)
            if cached is None or cached[0] != stamp:
                cached = (stamp, {_key(c): c for c in _claims_in(path)})
            current[path] = cached
        self._files = current
        return [claims for _, claims in current.values()]


def _key(claim: Mapping[str, Any]) -> tuple[str, str]:
    meta = claim.get("metadata") or {}
    return str(meta.get("namespace", "default")), str(meta.get("name"))


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _claims_in(path: Path) -> list[Mapping[str, Any]]:
    try:
        text = path.read_text()
        documents = (
            [json.loads(text)] if path.suffix == ".json" else list(yaml.load_all(text, Loader=_Loader))
        )
    except (OSError, ValueError, yaml.YAMLError):
        return []
    found: list[Mapping[str, Any]] = []
    for doc in documents:
        items = (
            doc.get("items", []) if isinstance(doc, dict) and doc.get("kind", "").endswith("List") else [doc]
        )
        found += [d for d in items if isinstance(d, dict) and d.get("kind") == "ResourceClaim"]
    return found


class ApiClaimSource:
    """ResourceClaims from the API server (resource.k8s.io/v1), one GET each, as the Go helper does."""

    authoritative = True

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        from dradriver.kube import KubeError, NotFoundError

        try:
            claim: Mapping[str, Any] = self._client.get_resource_claim(namespace, name)
        except NotFoundError as err:
            raise ClaimNotFoundError(str(err)) from err
        except KubeError as err:
            raise ClaimSourceError(str(err)) from err
        return claim
