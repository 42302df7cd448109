"""ResourceQuotas for `dry-run` and `validate`: would the API server admit the claims (and pods)
the input creates, and if not, which quota entry refuses which, with the API server's message.

The quotas come from --resource-quota files (their status.used, when they have one, is what is
already used; otherwise nothing is) or, for `dry-run --cluster`, from the API server (the
namespaces' quotas with what they have used). The counting is `dradriver.offline.quota`'s; this
module reads the quotas and prints the outcome.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.cli import _common
from dradriver.cli._dra_inputs import Document, read_objects
from dradriver.offline.allocation import InputError, parse_claim
from dradriver.offline.extended import ExtendedResourceError, pod_extended_resources, resource_classes
from dradriver.offline.quota import (
    Outcome,
    QuotaInputError,
    QuotaLedger,
    ResourceQuota,
    admissions,
    check,
    parse_resource_quota,
)


def add_quota_flags(parser: argparse.ArgumentParser, *, cluster: bool) -> None:
    _common.env_list_flag(
        parser,
        "--resource-quota",
        dest="resource_quotas",
        help="ResourceQuota files: say whether the API server would admit the claims and pods the input "
        "creates" + (" (--cluster: the namespaces' quotas are read from the API server)" if cluster else ""),
    )
    _common.env_flag(
        parser,
        "--namespace",
        "-n",
        default="default",
        help="the namespace of input objects that name none (for the quota check)",
    )


def extended_names(class_docs: Sequence[Document]) -> dict[str, str]:
    """Class name -> extendedResourceName, for the classes that map one."""
    out = {}
    for doc in class_docs:
        spec = doc.obj.get("spec")
        name = (doc.obj.get("metadata") or {}).get("name")
        if isinstance(spec, Mapping) and isinstance(spec.get("extendedResourceName"), str) and name:
            out[str(name)] = spec["extendedResourceName"]
    return out


def _parse(documents: Sequence[Document]) -> list[ResourceQuota]:
    quotas = []
    for doc in documents:
        try:
            quotas.append(parse_resource_quota(doc.obj))
        except QuotaInputError as err:
            raise _common.CLIError(f"{doc.where}: {err}") from None
    return quotas


def _cluster_quotas(client: Any, namespaces: Sequence[str]) -> list[ResourceQuota] | None:
    """The namespaces' quotas from the API server; None (and a warning) when they cannot be read."""
    from dradriver.kube import KubeError

    documents = []
    for namespace in namespaces:
        try:
            items = client.request("GET", f"/api/v1/namespaces/{namespace}/resourcequotas").get("items", [])
        except KubeError as err:
            print(
                f"dradriver: warning: cannot read the ResourceQuotas of {namespace}: {err}; "
                "quotas not checked",
                file=sys.stderr,
            )
            return None
        documents += [
            Document(f"cluster:{namespace}/resourcequotas", i + 1, {**q, "kind": "ResourceQuota"})
            for i, q in enumerate(items)
        ]
    return _parse(documents)


def check_quotas(
    args: argparse.Namespace,
    claim_docs: Sequence[Document],
    workload_docs: Sequence[Document],
    class_docs: Sequence[Document],
    client: Any = None,
) -> list[Outcome] | None:
    """The outcome of every claim and pod the input creates; None when no quota was asked for
    (no --resource-quota, no `client` to read the cluster's)."""
    if not args.resource_quotas and client is None:
        return None
    extended = extended_names(class_docs)
    gate = _common.gates_of(args)["DRAExtendedResource"]
    claims = []
    for doc in claim_docs:
        try:
            claims.append((doc.obj, parse_claim(doc.obj)))
        except InputError as err:
            raise _common.CLIError(f"{doc.where}: {err}") from None
    # Without the gate no class backs an extended resource: pods ask for none through DRA.
    backed = resource_classes(d.obj for d in class_docs) if gate else {}
    workloads = []
    for doc in workload_docs:
        try:
            workloads.append((doc.obj, pod_extended_resources(doc.obj, backed)))
        except ExtendedResourceError as err:
            raise _common.CLIError(f"{doc.where}: {err}") from None
    planned = admissions(claims, workloads, extended, namespace=args.namespace, extended_resources=gate)
    if args.resource_quotas:
        quotas = _parse(read_objects(args.resource_quotas, ["ResourceQuota"], "--resource-quota"))
    else:
        found = _cluster_quotas(client, sorted({a.namespace for a in planned}))
        if found is None:
            return None
        quotas = found
    return check(QuotaLedger(quotas, extended, extended_resources=gate), planned)


def admitted(outcomes: Sequence[Outcome] | None) -> bool:
    return outcomes is None or not any(o.refusals for o in outcomes)


def to_json(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    return {
        "admitted": admitted(outcomes),
        "objects": [
            {
                "kind": o.admission.kind,
                "namespace": o.admission.namespace,
                "name": o.admission.name,
                "source": o.admission.source,
                "usage": dict(o.admission.usage),
                "admitted": not o.refusals,
                "refusals": [
                    {
                        "quota": r.quota.ref,
                        "exceeded": list(r.exceeded),
                        "requested": {k: v.canonical() for k, v in r.requested.items()},
                        "used": {k: v.canonical() for k, v in r.used.items()},
                        "limited": {k: v.canonical() for k, v in r.limited.items()},
                        "unknown": list(r.unknown),
                        "message": message,
                    }
                    for r, message in zip(o.refusals, o.messages(), strict=True)
                ],
            }
            for o in outcomes
        ],
    }


def lines(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per admitted object, and per refusal the entry and the API server's message."""
    out = []
    for o in outcomes:
        if not o.refusals:
            counted = ", ".join(f"{k}={v}" for k, v in sorted(o.admission.usage.items()))
            out.append(f"{o.admission.source}: admitted ({counted})")
            continue
        for refusal, message in zip(o.refusals, o.messages(), strict=True):
            entries = (
                ", ".join(
                    f"{e}: requested {refusal.requested[e].canonical()}, used "
                    f"{refusal.used[e].canonical() if e in refusal.used else '0'}, "
                    f"limited {refusal.limited[e].canonical()}"
                    for e in refusal.exceeded
                )
                or f"no status yet for {', '.join(refusal.unknown)}"
            )
            out.append(f"{o.admission.source}: REFUSED by ResourceQuota {refusal.quota.ref} ({entries})")
            out.append(f"  the API server: {message}")
    return out
