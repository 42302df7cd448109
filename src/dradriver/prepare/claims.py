"""Where ResourceClaims come from: the API server, or files (demo, tests, node-only set-ups).

Both give the claim as `resource.k8s.io/v1` JSON. `ClaimNotFoundError` means the claim does not
exist (used to garbage-collect claims deleted behind the kubelet's back); `ClaimUnusableError`
that this one claim cannot be had; any other problem is a `ClaimSourceError`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dradriver.files import FileInputError, load_documents
from dradriver.kube import KubeClient, KubeError, NotFoundError, UndecodableError


class ClaimSourceError(Exception):
    pass


class ClaimNotFoundError(ClaimSourceError):
    pass


class ClaimUnusableError(ClaimSourceError):
    """This claim cannot be had, while others can: that claim's error rather than a failed call."""


class ClaimsUnavailableError(ClaimUnusableError):
    """There is no source to ask at all."""


class ClaimSource(Protocol):
    #: True when a missing claim really means it was deleted (so stale state may be collected).
    authoritative: bool
    #: True when each get is a network request (worth having several in flight).
    remote: bool

    def get(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class NoClaimSource:
    """Node-only mode: there is nothing to fetch claims from."""

    authoritative = False
    remote = False

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise ClaimsUnavailableError(
            f"cannot fetch ResourceClaim {namespace}/{name}: no Kubernetes API access (node-only mode; "
            "run in a pod, or pass --kubeconfig)"
        )


Key = tuple[str, str]


@dataclass(frozen=True)
class _ClaimFile:
    """What one file holds: claims by namespace/name, claims it names but that are unusable,
    and the reason the whole file is unreadable (then it holds nothing)."""

    stamp: tuple[int, int, int]
    claims: dict[Key, Mapping[str, Any]] = field(default_factory=dict)
    problems: dict[Key, str] = field(default_factory=dict)
    error: str = ""


class DirectoryClaimSource:
    """ResourceClaims from the YAML/JSON files of a directory.

    Files may hold several documents or a List; anything that is not a ResourceClaim is ignored.
    A file is parsed again only when it changes (size, mtime or inode), and a claim found before
    costs one stat to fetch again. A file that cannot be read (malformed, too large, a FIFO)
    affects only the claims it might hold: a claim found in no readable file is then that
    claim's error, naming the unreadable files, rather than a failed call.
    """

    authoritative = False
    remote = False

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._files: dict[Path, _ClaimFile] = {}
        self._index: dict[Key, Path] = {}

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        key = (namespace, name)
        with self._lock:
            path = self._index.get(key)
            if path is None or _stamp(path) != self._files[path].stamp:
                self._refresh()
                path = self._index.get(key)
            if path is not None:
                held = self._files[path]
                if key in held.problems:
                    raise ClaimUnusableError(
                        f"ResourceClaim {namespace}/{name} in {path}: {held.problems[key]}"
                    )
                return held.claims[key]
            broken = [f"{p.name}: {f.error}" for p, f in self._files.items() if f.error]
        missing = f"resourceclaims.resource.k8s.io {name!r} not found in {namespace!r}"
        if broken:
            shown = "; ".join(broken[:3]) + (f"; and {len(broken) - 3} more" if len(broken) > 3 else "")
            raise ClaimUnusableError(
                f"{missing}; {len(broken)} file(s) in {self._directory} that could hold it cannot be "
                f"read: {shown}"
            )
        raise ClaimNotFoundError(missing)

    def _refresh(self) -> None:
        try:
            paths = sorted(p for p in self._directory.iterdir() if p.suffix in {".yaml", ".yml", ".json"})
        except OSError:
            paths = []
        files: dict[Path, _ClaimFile] = {}
        for path in paths:
            stamp = _stamp(path)
            if stamp is None:
                continue
            cached = self._files.get(path)
            files[path] = (
                cached if cached is not None and cached.stamp == stamp else _read_claim_file(path, stamp)
            )
        self._files = files
        index: dict[Key, Path] = {}
        for path, held in files.items():
            for key in [*held.claims, *held.problems]:
                index.setdefault(key, path)  # the first file (by name) wins
        self._index = index


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _read_claim_file(path: Path, stamp: tuple[int, int, int]) -> _ClaimFile:
    try:
        documents = load_documents(path)
    except FileInputError as err:
        return _ClaimFile(stamp, error=str(err).removeprefix(f"{path}: "))
    held = _ClaimFile(stamp)
    unnamed = 0
    for doc in _objects(documents):
        if not isinstance(doc, dict) or doc.get("kind") != "ResourceClaim":
            continue
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        namespace = meta.get("namespace", "default") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not isinstance(namespace, str):
            unnamed += 1
            continue
        key = (namespace, name)
        if key in held.claims or key in held.problems:
            held.claims.pop(key, None)
            held.problems[key] = "defined more than once in the file"
        else:
            held.claims[key] = doc
    if unnamed:
        return _ClaimFile(
            stamp, held.claims, held.problems, f"{unnamed} ResourceClaim(s) without a string metadata.name"
        )
    return held


def _objects(documents: list[Any]) -> list[Any]:
    """Documents, with `kind: *List` objects replaced by their items."""
    found: list[Any] = []
    for doc in documents:
        if (
            isinstance(doc, dict)
            and str(doc.get("kind", "")).endswith("List")
            and isinstance(doc.get("items"), list)
        ):
            found += doc["items"]
        else:
            found.append(doc)
    return found


class ApiClaimSource:
    """ResourceClaims from the API server (resource.k8s.io/v1), one GET each, as the Go helper does."""

    authoritative = True
    remote = True

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            claim: Mapping[str, Any] = self._client.get_resource_claim(namespace, name)
        except NotFoundError as err:
            raise ClaimNotFoundError(str(err)) from err
        except UndecodableError as err:  # this claim's content, not the server
            raise ClaimUnusableError(f"ResourceClaim {namespace}/{name}: {err}") from None
        except KubeError as err:
            raise ClaimSourceError(str(err)) from err
        return claim


#: A pod a claim is reserved for: namespace, name, UID.
PodKey = tuple[str, str, str]
#: Longer than any prepare takes from its fetch of a claim to the claim's record.
FORGET_AFTER = 300.0


class ReservationsTap:
    """A claim source that remembers the pods each fetched claim is reserved for
    (`status.reservedFor`): what the telemetry labels a prepared claim's devices with. Every
    fetch refreshes it, prepare's and the stale-claim check's alike (at least once a minute)."""

    def __init__(self, source: ClaimSource, clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self.authoritative = source.authoritative
        self.remote = source.remote
        self._clock = clock
        self._lock = threading.Lock()  # guards _pods; held for one assignment, lookup or sweep
        #: By claim UID: its pods, and when they were fetched.
        self._pods: dict[str, tuple[tuple[PodKey, ...], float]] = {}

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        claim = self._source.get(namespace, name)
        uid = str((claim.get("metadata") or {}).get("uid", ""))
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        pods = tuple(
            (namespace, str(r.get("name", "")), str(r.get("uid", "")))
            for r in reserved
            if isinstance(r, dict) and r.get("resource") == "pods" and not r.get("apiGroup")
        )
        with self._lock:
            self._pods[uid] = (pods, self._clock())
        return claim

    def pods(self, uid: str) -> tuple[PodKey, ...]:
        with self._lock:
            return self._pods.get(uid, ((), 0.0))[0]

    def forget(self, keep: set[str]) -> None:
        """Drop what is known of claims other than `keep` (those prepared) that were fetched more
        than FORGET_AFTER seconds ago: a claim whose prepare is under way has been fetched, but
        is not among the prepared yet."""
        cutoff = self._clock() - FORGET_AFTER
        with self._lock:
            self._pods = {uid: entry for uid, entry in self._pods.items() if uid in keep or entry[1] > cutoff}
