"""Where ResourceClaims come from: the API server, or files (demo, tests, node-only set-ups).

Both give the claim as `resource.k8s.io/v1` JSON. `ClaimNotFoundError` means the claim does not
exist (used to garbage-collect claims deleted behind the kubelet's back); `ClaimUnusableError`
that this one claim cannot be had; any other problem is a `ClaimSourceError`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dradriver import logs
from dradriver.plugin.driver import ClaimRef

if TYPE_CHECKING:
    from dradriver.kube import KubeClient, WatchEvent
    from dradriver.kube.reflector import Reflector


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
    from dradriver.files import FileInputError, load_documents

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
        from dradriver.kube import KubeError, NotFoundError

        try:
            claim: Mapping[str, Any] = self._client.get_resource_claim(namespace, name)
        except NotFoundError as err:
            raise ClaimNotFoundError(str(err)) from err
        except KubeError as err:
            raise ClaimSourceError(str(err)) from err
        return claim


class ClaimHints(Protocol):
    def get(self, ref: ClaimRef) -> Mapping[str, Any] | None:
        """A copy of the claim that may be out of date, or None."""
        ...


def allocated_here(claim: Mapping[str, Any], driver_name: str, pool_name: str) -> bool:
    """Whether the claim's allocation has a result of our driver in our pool."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return any(
        r.get("driver") == driver_name and r.get("pool") == pool_name
        for r in (allocation.get("devices") or {}).get("results") or []
    )


class ClaimWatch:
    """This node's allocated ResourceClaims, kept by one list + watch of all ResourceClaims.

    A hint, never the truth the kubelet acted on: a watch may trail the API server. Prepare
    starts from it while the claim is fetched and answers only once the fetched claim shows the
    same UID and allocation (GpuDriver). Claims allocated elsewhere are dropped as they arrive,
    and nothing is handed out while the watch is down. A claim newly allocated here also warms
    a connection for the fetch that will follow.
    """

    def __init__(
        self, client: KubeClient, *, driver_name: str, pool_name: str, warm_after: float | None = None
    ) -> None:
        """`warm_after`: how long the client may have been idle before a new claim warms it."""
        from dradriver.kube import Backoff
        from dradriver.kube.client import WARM_AFTER_IDLE_SECONDS
        from dradriver.kube.reflector import Reflector

        self._client = client
        self._warm_after = WARM_AFTER_IDLE_SECONDS if warm_after is None else warm_after
        self._driver_name = driver_name
        self._pool_name = pool_name
        self._lock = threading.Lock()
        self._claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._watching = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reflector: Reflector = Reflector(
            what="ResourceClaims",
            list_objects=self._list,
            watch=client.watch_resource_claims,
            on_list=self._replace,
            on_event=self._apply,
            on_watching=self._set_watching,
            backoff=Backoff(initial=0.2, cap=10.0),
            log=logs.get_logger(component="claim-watch"),
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._reflector.run, args=(self._stop,), name="claim-watch")
        self._thread.daemon = True
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._reflector.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def get(self, ref: ClaimRef) -> Mapping[str, Any] | None:
        with self._lock:
            claim = self._claims.get((ref.namespace, ref.name)) if self._watching else None
        if claim is None or (claim.get("metadata") or {}).get("uid") != ref.uid:
            return None
        return claim

    def __len__(self) -> int:
        with self._lock:
            return len(self._claims)

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self._client.list_resource_claim_page(continue_token=token)
            items += [c for c in page.get("items", []) if self._ours(c)]
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def _ours(self, claim: Mapping[str, Any]) -> bool:
        return allocated_here(claim, self._driver_name, self._pool_name)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._claims = {_key(c): c for c in items}

    def _apply(self, event: WatchEvent) -> None:
        key = _key(event.object)
        with self._lock:
            if event.type != "DELETED" and self._ours(event.object):
                newly = self._claims.get(key) is None
                self._claims[key] = event.object
            else:
                newly = False
                self._claims.pop(key, None)
        if newly:
            # Allocated here just now: the kubelet will ask to prepare it once its pod is bound.
            self._client.warm(self._warm_after)

    def _set_watching(self, watching: bool) -> None:
        with self._lock:
            self._watching = watching


def _key(claim: Mapping[str, Any]) -> tuple[str, str]:
    meta = claim.get("metadata") or {}
    return str(meta.get("namespace", "default")), str(meta.get("name"))
