"""`dradriver dry-run` on partitionable GPUs: `--fake-gpus ... --partitionable` locally, and with
`--cluster` the cluster's allocated claims hold their devices and the counters those consume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.slices import build_node_slices
from tests.deploy.manifests import DEVICECLASSES
from tests.publish.kubefake import FakeApiServer
from tests.publish.test_cli_cluster import dradriver

DRIVER = "gpu.dradriver.dev"


def mig_claim(name: str, profile: str) -> dict[str, Any]:
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}
    request = {
        "name": "mig",
        "exactly": {"deviceClassName": "mig.gpu.dradriver.dev", "selectors": [selector]},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [request]}},
    }


def test_local_dry_run_models_partitionable_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claim = tmp_path / "claim.yaml"
    claim.write_text(yaml.safe_dump(mig_claim("one", "3g.40gb")))
    local = ["dry-run", "--claim", str(claim), "--fake-gpus", "a100-mig-empty"]
    assert main([*local, "--partitionable", "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [node] = report["nodes"]
    assert [d["device"] for d in node["claims"][0]["allocation"]] == ["gpu-0-mig-3g40gb-4"]
    # Without --partitionable the empty MIG GPU has nothing to offer.
    assert main(local) == 1
    capsys.readouterr()
    assert main(["dry-run", "--claim", str(claim), "--slices", str(claim), "--partitionable"]) == 2
    assert "--partitionable applies to --fake-gpus only" in capsys.readouterr().err


def test_cluster_dry_run_counts_what_allocated_claims_hold(fake_api: FakeApiServer, tmp_path: Path) -> None:
    slices = build_node_slices("a100-mig-empty", node_name="node-a", driver_name=DRIVER, partitionable=True)
    for slice_ in slices:
        slice_["metadata"] = {"name": slice_["metadata"]["generateName"] + "x"}
        fake_api.create("resourceslices", None, slice_)
    for name in ("gpu.yaml", "mig.yaml"):
        fake_api.create("deviceclasses", None, yaml.safe_load((DEVICECLASSES / name).read_text()))
    holder = mig_claim("whole-gpu-0", "7g.80gb")
    holder["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "mig", "driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-7g80gb-0"}
                ]
            }
        }
    }
    fake_api.create("resourceclaims", "default", holder)
    claim = tmp_path / "claim.yaml"
    claim.write_text(yaml.safe_dump(mig_claim("small", "1g.10gb")))
    args = [
        "--claim",
        str(claim),
        "--cluster",
        "--kubeconfig",
        str(tmp_path / "kubeconfig"),
        "--node",
        "node-a",
    ]
    result = dradriver("dry-run", *args)
    # The 7g.80gb placement another claim holds uses up every memory slice of GPU 0.
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not enough of them fit the shared counters" in result.stdout
    # The claim being simulated is not counted against itself.
    claim.write_text(yaml.safe_dump(mig_claim("whole-gpu-0", "7g.80gb")))
    assert dradriver("dry-run", *args).returncode == 0
