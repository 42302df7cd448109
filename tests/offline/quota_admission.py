"""The real API server's quota admission, as tests against it need it: awaiting a namespace's
quotas in admission, and creating an object to see whether it is refused."""

from __future__ import annotations

from typing import Any

from dradriver.kube import ApiError, KubeClient
from tests.e2e.processes import wait_until

#: Created once the namespace's quotas have their status; it limits only ConfigMaps, which the
#: tests create only as probes.
SENTINEL = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "sentinel"},
            "spec": {"hard": {"count/configmaps": "0"}}}  # fmt: skip


def wait_for_admission(api: KubeClient, namespace: str) -> None:
    """Until the API server's quota admission has the namespace's quotas, whose status the quota
    controller has filled already. Admission reads them from its own informer, which can lag the
    quota controller; until then it uses what a live lookup found when the namespace's first quota
    was created (none), kept 30 s, and admits claims unchecked. The informer delivers quotas in the
    order they were written, so once a ConfigMap is refused by the sentinel, created after the
    others' status, admission has that status too."""
    api.request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", body=SENTINEL)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "probe-"}}
    wait_until(
        lambda: "quota: sentinel" in (refusal(api, path, probe) or ""),
        60,
        f"the API server's quota admission to have the quotas of {namespace}",
    )


def refusal(api: KubeClient, path: str, body: dict[str, Any]) -> str | None:
    """The API server's message when it refuses to create `body` (403 Forbidden); None when created."""
    try:
        api.request("POST", path, body=body)
    except ApiError as err:
        if err.status != 403:
            raise
        return err.message
    return None
