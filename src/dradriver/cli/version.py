"""`dradriver version`: what this installation is, and which Kubernetes and DRA APIs it speaks."""

from __future__ import annotations

import argparse
import platform
from typing import Any

from dradriver.cli import _common

COMMAND = _common.Command(
    help="show the version, the commit it was built from, and the Kubernetes and DRA APIs it speaks",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    _common.add_output_flag(parser)


def version_info() -> dict[str, Any]:
    """The documented `-o json` object (docs/tools.md, "The `dradriver` command on your PATH")."""
    from dradriver import DEFAULT_DRIVER_NAME, __version__, buildinfo
    from dradriver.kube.client import MIN_KUBERNETES, RESOURCE_API
    from dradriver.offline.allocation.model import API_VERSIONS
    from dradriver.plugin.dra import SUPPORTED_SERVICES
    from dradriver.prepare.config import API_VERSION

    source = buildinfo.current()
    return {
        "version": __version__,
        "commit": source.commit,
        "treeState": source.tree_state,
        "python": platform.python_version(),
        "kubernetes": {
            "minVersion": MIN_KUBERNETES,
            "resourceAPI": RESOURCE_API.removeprefix("/apis/"),
            "resourceAPIVersionsRead": list(API_VERSIONS),
        },
        "dra": {
            "kubeletServices": list(SUPPORTED_SERVICES),
            "defaultDriverName": DEFAULT_DRIVER_NAME,
            "opaqueConfigAPI": API_VERSION,
        },
    }


def run(args: argparse.Namespace) -> int:
    info = version_info()
    if args.output != "table":
        from dradriver.cli._output import write_document

        write_document(info, args.output)
        return 0
    kubernetes, dra = info["kubernetes"], info["dra"]
    print(f"dradriver {info['version']} (commit {info['commit']}, tree {info['treeState']})")
    print(f"Python {info['python']}")
    print(f"Kubernetes >= {kubernetes['minVersion']}: publishes and reads {kubernetes['resourceAPI']}")
    print(f"  dry-run and validate read resource.k8s.io {', '.join(kubernetes['resourceAPIVersionsRead'])}")
    print(f"kubelet DRA services: {', '.join(dra['kubeletServices'])}")
    print(f"default driver name {dra['defaultDriverName']}, opaque config {dra['opaqueConfigAPI']}")
    return 0
