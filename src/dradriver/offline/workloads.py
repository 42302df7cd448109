"""Where a workload keeps its pod spec: one table for every tool that reads pods from manifests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: kind -> path of keys from the object to its pod spec.
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    **dict.fromkeys(("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"), ("spec", "template", "spec")),
}


def pod_spec(obj: Mapping[str, Any]) -> Any:
    """The pod spec of a Pod or of a workload's pod template; None for other kinds or when absent."""
    path = POD_SPEC_PATHS.get(str(obj.get("kind")))
    if path is None:
        return None
    spec: Any = obj
    for key in path:
        spec = spec.get(key) if isinstance(spec, Mapping) else None
    return spec if isinstance(spec, Mapping) else None
