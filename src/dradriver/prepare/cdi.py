"""CDI specs for prepared claims: pure rendering and validation, plus the directory they live in.

One transient spec per claim, `<vendor>-claim_<uid>.json`, kind `<vendor>/claim` with the vendor
`k8s.<driver name>`, device names `<claim uid>-<device name>` (unique per claim, never reused, so
runtimes that cache specs cannot mix claims up). `cdiVersion` is the lowest the content needs:
runtimes reject versions newer than they know (podman 4.3 and containerd 1.7 stop at 0.5.0).
The rules enforced here are the CDI library's, which are stricter than its JSON schema.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from dradriver.files import FileReadError, read_bytes
from dradriver.files.write import (
    check_writable,
    ensure_directory,
    is_temp_name,
    storage_error,
    temp_name,
    write_files_atomically,
)

T = TypeVar("T")

CDI_CLASS = "claim"
#: Bind options for everything we mount from the host (what NVIDIA's toolkit uses).
READ_ONLY_BIND = ("ro", "nosuid", "nodev", "rbind", "rprivate")

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_VALID_PERMISSIONS = re.compile(r"r?w?m?")


def vendor(driver_name: str) -> str:
    """`gpu.dradriver.dev` -> `k8s.gpu.dradriver.dev`: ours alone, as NVIDIA's is `k8s.gpu.nvidia.com`."""
    return f"k8s.{driver_name}"


def kind(driver_name: str) -> str:
    return f"{vendor(driver_name)}/{CDI_CLASS}"


def spec_file_name(driver_name: str, claim_uid: str) -> str:
    return f"{vendor(driver_name)}-{CDI_CLASS}_{claim_uid}.json"


def device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def qualified_device_id(driver_name: str, claim_uid: str, device: str) -> str:
    return f"{kind(driver_name)}={device_name(claim_uid, device)}"


@dataclass(frozen=True)
class DeviceNode:
    """A device node in the container. With type, major and minor set it is "minimally specified":
    the runtime creates it without looking at the host, so it works with fake GPUs too."""

    path: str
    type: str = "c"
    major: int | None = None
    minor: int | None = None
    host_path: str | None = None
    file_mode: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path is not None:
            out["hostPath"] = self.host_path
        if self.type:
            out["type"] = self.type
        if self.major is not None:
            out["major"] = self.major
        if self.minor is not None:
            out["minor"] = self.minor
        if self.file_mode is not None:
            out["fileMode"] = self.file_mode
        return out


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = READ_ONLY_BIND

    def to_json(self) -> dict[str, Any]:
        return {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
            "options": list(self.options),
        }


@dataclass(frozen=True)
class ContainerEdits:
    """Edits as runtimes apply them. The same claim-wide edits (the host driver's dozens of mounts)
    go into every spec: their JSON is built once per object (treat it as read-only), and adding
    nothing keeps the object, so that `validate` and the writer can reuse what they did with it."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.env or self.device_nodes or self.mounts)

    def __add__(self, other: ContainerEdits) -> ContainerEdits:
        if not other:
            return self
        return ContainerEdits(
            self.env + other.env, self.device_nodes + other.device_nodes, self.mounts + other.mounts
        )

    def to_json(self) -> dict[str, Any]:
        return self._json

    @cached_property
    def _json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_json() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_json() for m in self.mounts]
        return out


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: ContainerEdits


@dataclass(frozen=True)
class ClaimSpec:
    """Everything that goes into one claim's spec file."""

    kind: str
    devices: tuple[CdiDevice, ...]
    common: ContainerEdits = field(default_factory=ContainerEdits)


def render(spec: ClaimSpec) -> dict[str, Any]:
    """The spec as JSON-ready data, at the lowest cdiVersion its content needs."""
    out: dict[str, Any] = {
        "cdiVersion": "",
        "kind": spec.kind,
        "devices": [{"name": d.name, "containerEdits": d.edits.to_json()} for d in spec.devices],
    }
    if spec.common:
        out["containerEdits"] = spec.common.to_json()
    out["cdiVersion"] = minimum_version(out)
    return out


def _all_edits(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    if "containerEdits" in spec:
        yield spec["containerEdits"]
    for device in spec.get("devices", []):
        yield device.get("containerEdits", {})


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion whose features cover the spec (the CDI library's own rules)."""
    version = "0.3.0"
    if any("type" in m for e in _all_edits(spec) for m in e.get("mounts", [])):
        version = "0.4.0"
    if any("hostPath" in n for e in _all_edits(spec) for n in e.get("deviceNodes", [])) or any(
        d["name"][:1].isdigit() for d in spec.get("devices", [])
    ):
        version = "0.5.0"
    if "annotations" in spec or any("annotations" in d for d in spec.get("devices", [])):
        version = "0.6.0"
    if "." in str(spec.get("kind", "")).partition("/")[2]:
        version = max(version, "0.6.0")
    return version


def validate(spec: Mapping[str, Any]) -> list[str]:
    """What a CDI library would reject (or a runtime fail on), as messages; empty when valid."""
    problems: list[str] = []
    vendor_part, slash, class_part = str(spec.get("kind", "")).partition("/")
    if not slash or not _VENDOR_OR_CLASS.fullmatch(vendor_part) or not _VENDOR_OR_CLASS.fullmatch(class_part):
        problems.append(f"kind {spec.get('kind')!r}: must be vendor/class, each a letter then [A-Za-z0-9_.-]")
    devices = spec.get("devices") or []
    if not devices:
        problems.append("devices: must not be empty")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        name = str(device.get("name", ""))
        if not _DEVICE_NAME.fullmatch(name):
            problems.append(f"devices[{i}].name {name!r}: invalid CDI device name")
        if name in seen:
            problems.append(f"devices[{i}].name {name!r}: duplicate device name")
        seen.add(name)
        if not device.get("containerEdits"):
            problems.append(f"devices[{i}].containerEdits: must not be empty")
    common = spec.get("containerEdits")
    if common is not None:
        problems += _SHARED_EDITS.get(common, "problems", lambda: _edit_problems("containerEdits", common))
    for i, device in enumerate(devices):
        problems += _edit_problems(f"devices[{i}].containerEdits", device.get("containerEdits", {}))
    return problems


class _SharedEditsMemo:
    """What was worked out for a claim-wide edits object (`ContainerEdits.to_json` hands out the
    same dict to every spec): its problems and its encoding, kept while the object is held here,
    so that its identity cannot be another's. The last few objects only: a rescan replaces them."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._entries: dict[int, tuple[object, dict[str, Any]]] = {}

    def get(self, edits: object, what: str, compute: Callable[[], T]) -> T:
        entry = self._entries.get(id(edits))
        if entry is None or entry[0] is not edits:
            if len(self._entries) >= self._size:
                del self._entries[next(iter(self._entries))]
            entry = self._entries[id(edits)] = (edits, {})
        values = entry[1]
        if what not in values:
            values[what] = compute()
        value: T = values[what]
        return value


_SHARED_EDITS = _SharedEditsMemo()


def encode(spec: Mapping[str, Any]) -> bytes:
    """A spec as written: compact JSON (the C encoder, ten times faster than an indenting one),
    the claim-wide edits' part encoded once per edits object."""
    common = spec.get("containerEdits")
    if common is None:
        return json.dumps(spec, separators=(",", ":")).encode() + b"\n"
    rest = json.dumps({k: v for k, v in spec.items() if k != "containerEdits"}, separators=(",", ":"))
    text = _SHARED_EDITS.get(common, "json", lambda: json.dumps(common, separators=(",", ":")))
    return f'{rest[:-1]},"containerEdits":{text}}}\n'.encode()


def _edit_problems(where: str, edits: Mapping[str, Any]) -> list[str]:
    problems = []
    for i, env in enumerate(edits.get("env", [])):
        if env.find("=") <= 0:
            problems.append(f"{where}.env[{i}] {env!r}: must be NAME=value")
    for i, node in enumerate(edits.get("deviceNodes", [])):
        if not str(node.get("path", "")).startswith("/"):
            problems.append(f"{where}.deviceNodes[{i}].path: must be an absolute path")
        if node.get("type", "") not in {"", "b", "c", "u", "p"}:
            problems.append(f"{where}.deviceNodes[{i}].type: must be one of b, c, u, p")
        if not _VALID_PERMISSIONS.fullmatch(str(node.get("permissions", ""))):
            problems.append(f"{where}.deviceNodes[{i}].permissions: must be a subset of rwm")
    for i, mount in enumerate(edits.get("mounts", [])):
        if not str(mount.get("hostPath", "")).startswith("/") or not str(mount.get("containerPath", "")):
            problems.append(f"{where}.mounts[{i}]: hostPath (absolute) and containerPath are required")
        if not {"bind", "rbind"} & set(mount.get("options", [])):
            problems.append(f"{where}.mounts[{i}].options: needs bind or rbind (runc fails without)")
    return problems


class InvalidSpecError(ValueError):
    pass


#: Specs are world-readable (every runtime reads them) and written by us alone.
SPEC_FILE_MODE = 0o644
#: Our specs are a few KiB; anything larger in our name was not written by us.
MAX_SPEC_BYTES = 1024 * 1024


def read_spec(path: Path) -> dict[str, Any] | None:
    """A spec of ours as written, or None if it is missing, not a regular file (a planted
    symlink or device is never followed), too large or not a JSON object."""
    try:
        data = json.loads(read_bytes(path, MAX_SPEC_BYTES, follow_symlinks=False))
    except (FileReadError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def spec_state(path: Path, recorded: Mapping[str, Any] | None) -> str:
    """How a prepared claim's spec file compares with the spec recorded for it: "ok", "missing",
    "differs" (also unreadable: emptied, garbage), or "unverified" (an older version recorded none)."""
    if recorded is None:
        return "unverified"
    if not os.path.lexists(path):
        return "missing"
    return "ok" if read_spec(path) == recorded else "differs"


class CdiDirectory:
    """The runtime's dynamic CDI directory (e.g. /var/run/cdi), of which we own our vendor's claim files.

    Runtimes watch the directory and re-read it on every change, and some fail every injection on
    the node if one file does not parse: so files appear only whole (temp name the runtime ignores,
    then swapped in) and only after validation. Nothing is fsynced: a spec only matters until the next
    reboot, after which recovery removes every spec of the previous boot (see `CheckpointStore`).
    See `dradriver.files.write` for why a symlink planted in the directory is never followed.
    """

    def __init__(self, path: Path, driver_name: str) -> None:
        self.path = path
        self._driver_name = driver_name
        self._prefix = f"{vendor(driver_name)}-{CDI_CLASS}_"

    def file_for(self, claim_uid: str) -> Path:
        return self.path / spec_file_name(self._driver_name, claim_uid)

    def write(self, claim_uid: str, spec: Mapping[str, Any]) -> Path:
        """Validate and write one claim's spec; InvalidSpecError or OSError if it cannot be."""
        error = self.write_many({claim_uid: spec}).get(claim_uid)
        if error is not None:
            raise error
        return self.file_for(claim_uid)

    def write_many(self, specs: Mapping[str, Mapping[str, Any]]) -> dict[str, InvalidSpecError | OSError]:
        """Validate and write the specs of many claims (keyed by UID) in one batch; returns
        the error of each claim whose spec could not be written."""
        errors: dict[str, InvalidSpecError | OSError] = {}
        files: dict[str, bytes] = {}
        for claim_uid, spec in specs.items():
            if problems := validate(spec):
                errors[claim_uid] = InvalidSpecError("; ".join(problems))
            else:
                files[claim_uid] = encode(spec)
        if not files:
            return errors
        try:
            ensure_directory(self.path)
        except OSError as err:
            return errors | dict.fromkeys(files, err)
        names = {self.file_for(uid).name: uid for uid in files}
        failed = write_files_atomically(
            self.path, {name: files[uid] for name, uid in names.items()}, mode=SPEC_FILE_MODE
        )
        return errors | {names[name]: err for name, err in failed.items()}

    def remove(self, claim_uid: str) -> bool:
        """Remove a claim's spec; False if there is none (also on a read-only directory, where
        unlink fails with EROFS before it looks: a rollback of a spec never written)."""
        target = self.file_for(claim_uid)
        try:
            target.unlink()
        except FileNotFoundError:
            return False
        except OSError:
            if not os.path.lexists(target):
                return False
            raise
        return True

    def set_aside(self, claim_uid: str) -> Path | None:
        """Rename a claim's spec to a temp name (runtimes ignore it, recovery removes it) until the
        checkpoint says the claim is gone; None if it has none. StorageError if it cannot be."""
        target = self.file_for(claim_uid)
        aside = self.path / temp_name(target.name)
        try:
            os.rename(target, aside)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise storage_error(f"remove the CDI spec of claim {claim_uid}", self.path, err) from err
        return aside

    def put_back(self, claim_uid: str, aside: Path) -> None:
        """Undo `set_aside`: the checkpoint still lists the claim."""
        os.rename(aside, self.file_for(claim_uid))

    def check_writable(self) -> None:
        """StorageError unless a spec can be written and removed here now (start-up checks before
        it changes anything)."""
        if not self.path.is_dir():
            return  # nothing to remove at start-up; the first prepare creates it
        try:
            check_writable(self.path, f"{self._prefix}probe.json", 4096)
        except OSError as err:
            raise storage_error("write CDI specs", self.path, err) from err

    def claim_uids(self) -> list[str]:
        """UIDs of every claim spec of ours in the directory."""
        if not self.path.is_dir():
            return []
        return sorted(
            p.name[len(self._prefix) : -len(".json")]
            for p in self.path.iterdir()
            if p.name.startswith(self._prefix) and p.name.endswith(".json")
        )

    def read(self, claim_uid: str) -> dict[str, Any] | None:
        return read_spec(self.file_for(claim_uid))

    def remove_temp_files(self) -> list[Path]:
        """Leftovers of writes interrupted by a crash; runtimes ignore them, we clean them up."""
        if not self.path.is_dir():
            return []
        leftovers = [p for p in self.path.iterdir() if is_temp_name(p.name, self._prefix)]
        for p in leftovers:
            p.unlink(missing_ok=True)
        return leftovers
