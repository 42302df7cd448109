"""Everything we ship validates against the Kubernetes OpenAPI schemas of every supported version.

`kubernetes-validate` bundles strict JSON schemas (unknown fields are errors) generated from the
upstream OpenAPI documents, including `resource.k8s.io/v1` (DeviceClass, ResourceClaim,
ResourceClaimTemplate, ResourceSlice) for every version from 1.34 on. Schemas check structure
and types, not the API server's semantic validation (name formats, CEL compilation, limits);
the server-side dry-run in test_cluster.py covers that when an API server is available.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from tests.deploy.manifests import (
    KUBERNETES_VERSIONS,
    KUSTOMIZATIONS,
    REPO,
    Manifest,
    deviceclass_files,
    example_files,
    load_documents,
    render,
)


def validate(obj: Manifest, version: str, origin: str) -> None:
    name = f"{origin}: {obj['kind']} {obj['metadata']['name']}"
    try:
        used = kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        field = ".".join(str(p) for p in err.path) or "(top level)"
        pytest.fail(f"{name} is invalid for Kubernetes {version} at {field}: {err.message}")
    except kubernetes_validate.SchemaNotFoundError as err:
        pytest.fail(f"{name}: {err.message}")
    # kubernetes-validate silently falls back to the newest older schema it has; make sure the
    # version we asked for is the one that was checked.
    assert used == version, f"kubernetes-validate has no {version} schemas (used {used})"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rendered_deployment_is_valid(kustomization: str, version: str) -> None:
    for obj in render(kustomization):
        validate(obj, version, f"deploy/{kustomization}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", deviceclass_files() + example_files(), ids=lambda p: p.name)
def test_shipped_file_is_valid(path: Path, version: str) -> None:
    documents = load_documents(path)
    assert documents, f"{path.name} is empty"
    for obj in documents:
        validate(obj, version, str(path.relative_to(REPO)))


def test_strict_schemas_reject_unknown_fields() -> None:
    """Guards the guard: a misspelt field must fail, or the tests above prove nothing."""
    [template, _pod] = load_documents(REPO / "examples/claims/single-gpu.yaml")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClass"] = "gpu.dradriver.dev"
    with pytest.raises(kubernetes_validate.ValidationError, match="deviceClass"):
        kubernetes_validate.validate(template, KUBERNETES_VERSIONS[0], strict=True)
