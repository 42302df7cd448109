"""At start: does the API server keep this node's token to this node's ResourceSlices?

RBAC lets the plugin's account write every ResourceSlice; only an admission policy (the
ValidatingAdmissionPolicy of deploy/base/admission-policy.yaml, or an equivalent webhook) narrows
that to the node the token is bound to. Nothing on the API server says whether such a policy
covers this account, so we ask the way an attacker would: a server-side dry run (nothing is
stored) of a slice for another node. Refused by admission: in force. Accepted: not in force,
reported loudly (a log line, a Warning Event on the Node, a metric).

Not in force is a warning, not an exit, unless --require-admission-policy: the policy is the
cluster admin's to install, and a node plugin that stops every GPU workload on every node over
a cluster-side setting would turn a hardening gap into an outage. Operators who want the
stricter rule set the flag, and the plugin then crash-loops visibly until the policy is there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dradriver import logs, metrics
from dradriver.kube.client import RESOURCE_API
from dradriver.kube.errors import ApiError, KubeError

if TYPE_CHECKING:
    from dradriver.kube.client import KubeClient
    from dradriver.kube.events import NodeEventSender

log = logs.get_logger(component="admission")

#: The node the probe slice names: a valid node name that no real node has.
PROBE_NODE = "dradriver-admission-probe.invalid"
#: Accepted right after an install, the policy may not be loaded yet (about a second): ask again.
ATTEMPTS = 2
RETRY_SECONDS = 1.5
EVENT_REASON = "SliceAdmissionPolicyNotEnforced"

Outcome = Literal["enforced", "not-enforced", "unknown"]


class AdmissionPolicyMissingError(ValueError):
    """--require-admission-policy and the API server accepted another node's slice."""


@dataclass(frozen=True)
class SliceAdmission:
    outcome: Outcome
    #: The API server's refusal (enforced), or why nothing could be concluded (unknown).
    detail: str = ""


def probe_slice(driver_name: str) -> dict[str, object]:
    """A valid ResourceSlice of this driver for another node (its own pool): the write the
    policy must refuse."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "dradriver-admission-probe-"},
        "spec": {
            "driver": driver_name,
            "nodeName": PROBE_NODE,
            "pool": {"name": PROBE_NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def probe(
    client: KubeClient, driver_name: str, *, sleep: Callable[[float], None] = time.sleep
) -> SliceAdmission:
    """Ask the API server (dry run) to create another node's slice with this client's token."""
    for attempt in range(ATTEMPTS):
        if attempt:
            sleep(RETRY_SECONDS)
        try:
            client.request(
                "POST",
                f"{RESOURCE_API}/resourceslices",
                query=[("dryRun", "All")],
                body=probe_slice(driver_name),
            )
        except ApiError as err:
            # Admission refusals say "denied" (a policy: "denied request", a webhook: "denied
            # the request"); RBAC's 403 and validation's 422 do not.
            if "denied" in err.message:
                return SliceAdmission("enforced", err.message)
            return SliceAdmission("unknown", str(err))
        except KubeError as err:
            return SliceAdmission("unknown", str(err))
    return SliceAdmission("not-enforced")


def check_slice_admission(
    client: KubeClient,
    *,
    driver_name: str,
    node_name: str,
    events: NodeEventSender | None,
    required: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> SliceAdmission:
    """Probe, and say what was found: log, metric, Event; raise when `required` and not in force.
    Credentials that cannot be a service account's (a developer's certificate, a benchmark's
    per-node users) are not what the policy is for: not probed."""
    if not client.service_account_like and not required:
        log.debug("not a service account token: the slice admission policy is not checked")
        return SliceAdmission("unknown", "not a service account token")
    result = probe(client, driver_name, sleep=sleep)
    metrics.SLICE_ADMISSION.labels(result.outcome).set(1)
    if result.outcome == "enforced":
        log.info("the admission policy keeps this node's token to its own ResourceSlices")
    elif result.outcome == "unknown":
        log.warning("cannot tell whether the ResourceSlice admission policy is in force", error=result.detail)
    else:
        message = (
            f"SECURITY: the ResourceSlice admission policy is not in force: the API server accepted "
            f"(dry run) a slice for node {PROBE_NODE!r} from node {node_name!r}'s token, so a stolen "
            "token could rewrite any node's devices; apply deploy/base/admission-policy.yaml "
            "(docs/operations.md, 'Security')"
        )
        log.error(message, node=node_name)
        if events is not None:
            events.send(EVENT_REASON, message, "Warning")
        if required:
            raise AdmissionPolicyMissingError(f"--require-admission-policy: {message}")
    return result
