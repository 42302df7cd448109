"""Reading DRA objects for the `cel`, `dry-run` and `validate` commands.

Files may hold YAML (multi-document) or JSON, single objects, lists, or `kind: List` objects.
Device inventories and device classes come from interchangeable sources (files, the fake GPU
backend, the cluster) behind two small interfaces, so that the commands never care where the
objects came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dradriver.cli._common import CLIError
from dradriver.offline.extended import ExtendedResourceError, pod_extended_resources, resource_classes

T = TypeVar("T")


@dataclass(frozen=True)
class Document:
    """One object from a file; `index` counts documents from 1 (after flattening lists)."""

    path: str
    index: int
    obj: Mapping[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.index}"


def _flatten(value: Any) -> Iterator[Any]:
    if isinstance(value, list):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, Mapping) and str(value.get("kind", "")).endswith("List") and "items" in value:
        yield from _flatten(value.get("items") or [])
    elif value is not None:
        yield value


def read_documents(path: str) -> list[Document]:
    """All objects in a YAML or JSON file; CLIError naming the file on unreadable input."""
    from dradriver.files import FileInputError, load_documents

    try:
        raw = load_documents(path)
    except FileInputError as err:
        raise CLIError(str(err)) from None
    return _objects(raw, path)


def parse_documents(text: str, source: str) -> list[Document]:
    """All objects in YAML or JSON text (`source` names it, e.g. `-` for stdin), read by the same
    safe loader as files."""
    from dradriver.files import FileInputError, parse_text

    try:
        raw = parse_text(text, source, json_text=True if source.endswith(".json") else None)
    except FileInputError as err:
        raise CLIError(str(err)) from None
    return _objects(raw, source)


def _objects(raw: list[Any], source: str) -> list[Document]:
    documents: list[Document] = []
    for item in _flatten(raw):
        if not isinstance(item, Mapping):
            raise CLIError(f"{source}:{len(documents) + 1}: expected an object, got {type(item).__name__}")
        documents.append(Document(source, len(documents) + 1, item))
    return documents


def read_objects(
    paths: Sequence[str], kinds: Sequence[str], flag: str, *, others: list[Document] | None = None
) -> list[Document]:
    """Objects of the given kinds from files; anything else is a CLIError naming the document,
    unless `others` is given: then objects outside resource.k8s.io (say, the Pod using a claim)
    are collected there instead."""
    found: list[Document] = []
    for path in paths:
        documents = read_documents(path)
        if not documents:
            raise CLIError(f"{path}: no objects in file (for {flag})")
        for doc in documents:
            kind = doc.obj.get("kind")
            if kind in kinds:
                found.append(doc)
            elif others is not None and not str(doc.obj.get("apiVersion", "")).startswith("resource.k8s.io/"):
                others.append(doc)
            else:
                raise CLIError(f"{doc.where}: kind {kind!r} given to {flag}; expected {' or '.join(kinds)}")
    return found


def parse_each(documents: Sequence[Document], parse: Callable[[Mapping[str, Any]], T]) -> list[T]:
    """`parse` (one of dradriver.offline.allocation's parsers) of every document's object; its
    InputError is a CLIError naming the document."""
    from dradriver.offline.allocation import InputError

    parsed = []
    for doc in documents:
        try:
            parsed.append(parse(doc.obj))
        except InputError as err:
            raise CLIError(f"{doc.where}: {err}") from None
    return parsed


def extended_resource_claims(workloads: Sequence[Document], classes: Sequence[Document]) -> list[Document]:
    """The claims the scheduler creates for pods that ask for an extended resource a device class
    backs (DRAExtendedResource, Kubernetes >= 1.34; `offline.extended`)."""
    backed = resource_classes(c.obj for c in classes)
    claims = []
    for doc in workloads:
        try:
            asked = pod_extended_resources(doc.obj, backed)
        except ExtendedResourceError as err:
            raise CLIError(f"{doc.where}: {err}") from None
        if asked is None or not asked.requests:
            continue
        meta = doc.obj.get("metadata") or {}
        requests = [
            {"name": r.name, "exactly": {"deviceClassName": r.device_class, "count": r.count}}
            for r in asked.requests
        ]
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": f"{meta.get('name', 'pod')}-extended-resources",
                "namespace": meta.get("namespace", "default"),
            },
            "spec": {"devices": {"requests": requests}},
        }
        claims.append(Document(doc.path, doc.index, claim))
    return claims


# -- sources ---------------------------------------------------------------------------------------


class InventorySource(Protocol):
    """Where ResourceSlices come from."""

    def resource_slices(self) -> list[Document]: ...


class ClassSource(Protocol):
    """Where DeviceClasses come from."""

    def device_classes(self) -> list[Document]: ...


@dataclass(frozen=True)
class Files:
    """The files given to `flag` (--slices, --class): an inventory or a class source, as the
    cluster is both."""

    flag: str
    paths: Sequence[str]

    def resource_slices(self) -> list[Document]:
        return read_objects(self.paths, ["ResourceSlice"], self.flag)

    def device_classes(self) -> list[Document]:
        return read_objects(self.paths, ["DeviceClass"], self.flag)


@dataclass(frozen=True)
class FakeGPUs:
    """The built-in fake GPU backend, through the same slice builder `serve` publishes with."""

    profile: str
    node_name: str
    driver_name: str
    partitionable: bool = False
    #: --gpu-shares: the GPUs serve would publish shareable (a SharePolicy), None: none.
    shares: Any = None

    def resource_slices(self) -> list[Document]:
        import importlib

        try:
            # Imported by name: the slice builder lives in its own module (discovery -> slices).
            build_node_slices = importlib.import_module("dradriver.slices").build_node_slices
        except (ImportError, AttributeError):
            raise CLIError("--fake-gpus: the slice builder (dradriver.slices) is not available") from None
        try:
            slices = build_node_slices(
                self.profile,
                node_name=self.node_name,
                driver_name=self.driver_name,
                partitionable=self.partitionable,
                shares=self.shares,
            )
        except (OSError, ValueError) as err:
            raise CLIError(f"--fake-gpus {self.profile}: {err}") from None
        return [Document(f"fake-gpus:{self.profile}", i + 1, s) for i, s in enumerate(slices)]


@dataclass(frozen=True)
class ClassDirectory:
    """The DeviceClass files directly in each directory (not below)."""

    directories: tuple[Path, ...]

    def device_classes(self) -> list[Document]:
        documents = []
        for directory in self.directories:
            files = sorted(str(p) for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
            if not files:
                raise CLIError(f"{directory}: no DeviceClass files (*.yaml, *.json)")
            documents += read_objects(files, ["DeviceClass"], str(directory))
        return documents


class Cluster:
    """ResourceSlices and DeviceClasses read from the API server (--kubeconfig / KUBECONFIG)."""

    def __init__(self, kubeconfig: str | None, node: str | None = None) -> None:
        self._kubeconfig = kubeconfig
        self._node = node
        self._client: Any = None

    def _api(self) -> Any:
        from dradriver.cli._common import cluster_client

        if self._client is None:
            self._client = cluster_client(self._kubeconfig)
        return self._client

    def _read(self, what: str, kind: str, fetch: Any) -> list[Document]:
        from dradriver.kube import KubeError

        try:
            items = fetch()
        except KubeError as err:
            raise CLIError(f"--cluster: cannot list {what}: {err}") from None
        # Items of a list carry no apiVersion/kind of their own.
        typed = (
            dict(obj)
            | {"apiVersion": obj.get("apiVersion") or "resource.k8s.io/v1", "kind": obj.get("kind") or kind}
            for obj in items
        )
        return [Document(f"cluster:{what}", i + 1, obj) for i, obj in enumerate(typed)]

    def resource_slices(self) -> list[Document]:
        selector = f"spec.nodeName={self._node}" if self._node else None
        return self._read(
            "resourceslices",
            "ResourceSlice",
            lambda: self._api().list_resource_slices(selector).get("items", []),
        )

    def device_classes(self) -> list[Document]:
        return self._read("deviceclasses", "DeviceClass", lambda: self._api().list_device_classes())

    def allocated_claims(self) -> list[Document]:
        """The cluster's allocated ResourceClaims: their devices (and the counters those consume)
        are in use, as the scheduler sees them."""
        claims = self._read("resourceclaims", "ResourceClaim", lambda: self._api().list_resource_claims())
        return [doc for doc in claims if (doc.obj.get("status") or {}).get("allocation")]


def add_inventory_flags(parser: Any) -> None:
    """--fake-gpus (with --partitionable) / --slices / --cluster (mutually exclusive) plus --node."""
    from dradriver.cli._common import (
        add_fake_gpus_flag,
        add_gpu_shares_flags,
        add_kubeconfig_flag,
        add_partitionable_flag,
        env_flag,
        env_list_flag,
        env_switch,
    )

    group = parser.add_argument_group("device inventory (one of)")
    add_fake_gpus_flag(group)
    add_partitionable_flag(group)
    add_gpu_shares_flags(group)
    env_list_flag(group, "--slices", help="ResourceSlice files (YAML or JSON; v1, v1beta2 or v1beta1)")
    env_switch(
        group, "--cluster", help="read ResourceSlices and DeviceClasses from the API server (KUBECONFIG)"
    )
    add_kubeconfig_flag(parser)
    env_flag(
        parser,
        "--node",
        metavar="NAME",
        help="only devices of this node (default: every node in the inventory; the fake GPU node name)",
    )


def check_node(slices: Sequence[Any], node: str | None) -> None:
    """--node must name a node of the inventory (unless some slices serve every node): a typo
    would otherwise be an empty result that looks like an answer."""
    if not node or any(s.node_name == node or not s.node_name for s in slices):
        return
    nodes = sorted({s.node_name for s in slices})
    shown = ", ".join(nodes[:10]) + (f", ... ({len(nodes)} nodes)" if len(nodes) > 10 else "")
    raise CLIError(f"--node {node}: no device of the inventory is on this node (nodes: {shown or 'none'})")


def inventory_from_args(args: Any) -> InventorySource:
    chosen = [
        flag
        for flag, value in (
            ("--fake-gpus", args.fake_gpus),
            ("--slices", args.slices),
            ("--cluster", args.cluster),
        )
        if value
    ]
    if len(chosen) > 1:
        raise CLIError(f"{' and '.join(chosen)} cannot be combined: choose one device inventory")
    for flag, value in (("--partitionable", args.partitionable), ("--gpu-shares", args.gpu_shares)):
        if value and not args.fake_gpus:
            raise CLIError(
                f"{flag} applies to --fake-gpus only (slices from files or a cluster say it themselves)"
            )
    if args.fake_gpus:
        from dradriver.cli._common import share_policy

        return FakeGPUs(
            args.fake_gpus, args.node or "fake-node", args.driver_name, args.partitionable, share_policy(args)
        )
    if args.slices:
        return Files("--slices", args.slices)
    if args.cluster:
        return Cluster(args.kubeconfig, args.node)
    raise CLIError("no device inventory: pass --slices FILE..., --fake-gpus PROFILE or --cluster")
