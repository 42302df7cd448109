"""The committed gRPC code matches proto/dra, and proto/dra matches the upstream wire contract."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from dradriver.kubeletapi.dra.v1 import api_pb2 as v1
from dradriver.kubeletapi.dra.v1beta1 import api_pb2 as v1beta1
from dradriver.kubeletapi.health.v1 import api_pb2 as health_v1
from dradriver.kubeletapi.health.v1alpha1 import api_pb2 as health_v1alpha1
from dradriver.kubeletapi.pluginregistration import api_pb2 as registration

ROOT = Path(__file__).resolve().parent.parent


def test_committed_generated_code_is_current(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "genproto.py"), str(tmp_path)], check=True)
    generated = tmp_path / "dradriver" / "kubeletapi"
    committed = ROOT / "src" / "dradriver" / "kubeletapi"
    new_files = sorted(p.relative_to(generated) for p in generated.rglob("*") if p.is_file())
    old_files = sorted(
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    assert new_files == old_files
    stale = [str(p) for p in new_files if not filecmp.cmp(generated / p, committed / p, shallow=False)]
    assert stale == [], f"run `make proto`: stale generated files {stale}"


T = FieldDescriptor
STRING, BOOL, INT64, MESSAGE, ENUM = T.TYPE_STRING, T.TYPE_BOOL, T.TYPE_INT64, T.TYPE_MESSAGE, T.TYPE_ENUM


def fields(message: object) -> dict[str, tuple[int, int, bool]]:
    descriptor = message.DESCRIPTOR  # type: ignore[attr-defined]
    return {f.name: (f.number, f.type, f.is_repeated) for f in descriptor.fields}


def test_registration_wire_names() -> None:
    assert registration.DESCRIPTOR.package == "pluginregistration"
    service = registration.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "GetInfo": ("InfoRequest", "PluginInfo"),
        "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse"),
    }
    assert fields(registration.PluginInfo) == {
        "type": (1, STRING, False),
        "name": (2, STRING, False),
        "endpoint": (3, STRING, False),
        "supported_versions": (4, STRING, True),
    }
    assert fields(registration.RegistrationStatus) == {
        "plugin_registered": (1, BOOL, False),
        "error": (2, STRING, False),
    }


@pytest.mark.parametrize(("pb", "package"), [(v1, "v1"), (v1beta1, "v1beta1")])
def test_dra_wire_names(pb: object, package: str) -> None:
    descriptor = pb.DESCRIPTOR  # type: ignore[attr-defined]
    assert descriptor.package == f"k8s.io.kubelet.pkg.apis.dra.{package}"
    service = descriptor.services_by_name["DRAPlugin"]
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    assert fields(pb.Claim) == {  # type: ignore[attr-defined]
        "namespace": (1, STRING, False),
        "uid": (2, STRING, False),
        "name": (3, STRING, False),
    }
    device = {
        "request_names": (1, STRING, True),
        "pool_name": (2, STRING, False),
        "device_name": (3, STRING, False),
        "cdi_device_ids": (4, STRING, True),
    }
    if package == "v1":
        device["share_id"] = (5, STRING, False)
        assert pb.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence  # type: ignore[attr-defined]
    assert fields(pb.Device) == device  # type: ignore[attr-defined]
    assert fields(pb.NodePrepareResourceResponse) == {  # type: ignore[attr-defined]
        "devices": (1, MESSAGE, True),
        "error": (2, STRING, False),
    }
    assert fields(pb.NodeUnprepareResourceResponse) == {"error": (1, STRING, False)}  # type: ignore[attr-defined]
    for response in ("NodePrepareResourcesResponse", "NodeUnprepareResourcesResponse"):
        claims = getattr(pb, response).DESCRIPTOR.fields_by_name["claims"]
        assert claims.number == 1
        assert claims.message_type.GetOptions().map_entry


@pytest.mark.parametrize(("health", "package"), [(health_v1alpha1, "v1alpha1"), (health_v1, "v1")])
def test_health_wire_names(health: Any, package: str) -> None:
    """The same messages in both versions; only the package (so the service name) differs."""
    assert health.DESCRIPTOR.package == package
    service = health.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert service.full_name == f"{package}.DRAResourceHealth"
    (method,) = service.methods
    assert method.name == "NodeWatchResources"
    assert method.server_streaming
    assert not method.client_streaming
    assert fields(health.DeviceHealth) == {
        "device": (1, MESSAGE, False),
        "health": (2, ENUM, False),
        "last_updated_time": (3, INT64, False),
        "health_check_timeout_seconds": (4, INT64, False),
        "message": (5, STRING, False),
    }
    assert fields(health.DeviceIdentifier) == {
        "pool_name": (1, STRING, False),
        "device_name": (2, STRING, False),
    }
    assert {v.name: v.number for v in health.HealthStatus.DESCRIPTOR.values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
