"""Regenerate the committed gRPC/protobuf code in src/dradriver/kubeletapi from proto/dra.

Usage: python scripts/genproto.py [OUTPUT_ROOT]   (default: src)

Each proto is mapped onto a virtual path inside the package with protoc's `-I virtual=real`
form, so the generated `_pb2_grpc` modules import their `_pb2` siblings by absolute package
name (`from dradriver.kubeletapi.dra.v1 import api_pb2`) with no sys.path tricks.
tests/test_proto_codegen.py runs this into a temporary directory and diffs the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "dra"

# proto source (relative to proto/dra) -> Python package path of the generated module.
PROTOS: dict[str, str] = {
    "pluginregistration/api.proto": "dradriver/kubeletapi/pluginregistration",
    "v1/api.proto": "dradriver/kubeletapi/dra/v1",
    "v1beta1/api.proto": "dradriver/kubeletapi/dra/v1beta1",
    "health/v1alpha1/api.proto": "dradriver/kubeletapi/health/v1alpha1",
    "health/v1/api.proto": "dradriver/kubeletapi/health/v1",
}


def generate(out_root: Path) -> None:
    """Write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py and *_pb2_grpc.pyi for every proto under out_root."""
    grpc_proto_include = Path(protoc.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside the interpreter
    for source, package in PROTOS.items():
        real_dir = (PROTO_DIR / source).parent
        target = out_root / package
        target.mkdir(parents=True, exist_ok=True)
        args = [
            "protoc",
            f"-I{package}={real_dir}",
            f"-I{grpc_proto_include}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--python_out={out_root}",
            f"--mypy_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"--mypy_grpc_out={out_root}",
            f"{package}/{Path(source).name}",
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {source}")
        for directory in [target, *target.parents]:
            if directory == out_root:
                break
            (directory / "__init__.py").touch()


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "src")
