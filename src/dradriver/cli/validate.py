"""`dradriver validate`: check DRA objects the way the API server would, before applying them.

DeviceClasses, ResourceClaims and ResourceClaimTemplates are checked here (structure, names,
limits, CEL compilation, our opaque config); ResourceSlices by the slice publisher's own
validator. Objects outside resource.k8s.io (the Pod or Job beside a claim) are skipped.
Findings print as `file:doc:path: message`; the exit status is 1 when there is any. With
--resource-quota, the claims and pods the files create are also checked against those quotas
(as the API server's ResourceQuota admission counts them); a refusal is a finding too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from dradriver.cli import _common, _quota
from dradriver.cli._dra_inputs import ClassDirectory, read_documents
from dradriver.offline.workloads import pod_spec

CHECKED_KINDS = ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice")


COMMAND = _common.Command(
    help="validate DeviceClass, ResourceClaim(Template) and ResourceSlice files",
    description=(
        "Validate DRA objects (structure, names, limits, CEL selectors, opaque config) before\n"
        "applying them. Findings print as FILE:DOC:PATH: MESSAGE, DOC counting objects from 1.\n"
        "With --resource-quota, also whether those quotas admit the claims (and pods) the files\n"
        "create, counted as the API server counts them.\n"
        "Exit status: 0 no findings, 1 findings or refused by a quota, 2 unreadable input."
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML or JSON files (multi-document, lists)")
    _common.add_driver_name_flag(parser)
    _common.add_feature_gates_flag(parser)
    _quota.add_quota_flags(parser, cluster=False)
    _common.add_output_flag(parser)


def _slice_findings(obj: Any) -> list[Any]:
    from dradriver.slices import validate_slices

    findings: list[Any] = validate_slices([obj])
    return findings


def is_dra_object(obj: Any) -> bool:
    """Objects of the resource.k8s.io group; files often also hold the Pod or Job using a claim."""
    return str(obj.get("apiVersion", "")).startswith("resource.k8s.io/")


def run(args: argparse.Namespace) -> int:
    from dradriver.offline.allocation.validation import validate_object

    documents = []
    for path in args.files:
        in_file = read_documents(path)
        if not in_file:
            raise _common.CLIError(f"{path}: no objects in the file (empty, or only comments and '---')")
        documents += in_file
    lists = _common.gates_of(args)["DRAListTypeAttributes"]
    findings: list[dict[str, Any]] = []
    skipped = 0
    for doc in documents:
        kind = doc.obj.get("kind")
        if not is_dra_object(doc.obj) and kind not in CHECKED_KINDS:
            skipped += 1  # a workload or namespace beside the claim: the API server's business
            continue
        found: list[tuple[str, str, Sequence[str]]]
        if kind == "ResourceSlice":
            found = [(f.path, f.message, ()) for f in _slice_findings(doc.obj)]
        elif kind in CHECKED_KINDS:
            found = [
                (f.path, f.message, f.hints)
                for f in validate_object(doc.obj, args.driver_name, list_type_attributes=lists)
            ]
        else:
            found = [("kind", f"Unsupported value: {kind!r}: supported: {', '.join(CHECKED_KINDS)}", ())]
        findings += [
            {"file": doc.path, "document": doc.index, "path": path, "message": message, "hints": list(hints)}
            for path, message, hints in found
        ]
    checked = len(documents) - skipped
    outcomes = _quotas(args, documents) if args.resource_quotas and not findings else None
    if args.output != "table":
        from dradriver.cli._output import write_document

        report: dict[str, Any] = {"checked": checked, "skipped": skipped, "findings": findings}
        if outcomes is not None:
            report["quota"] = _quota.to_json(outcomes)
        write_document(report, args.output)
    else:
        for f in findings:
            print(f"{f['file']}:{f['document']}:{f['path']}: {f['message']}")
            for hint in f["hints"]:
                print(f"  hint: {hint}")
        for line in _quota.lines(outcomes or []):
            print(line)
    note = f" ({skipped} other object(s) not checked)" if skipped else ""
    if not _quota.admitted(outcomes):
        refused = sum(1 for o in outcomes or [] if o.refusals)
        print(f"{refused} object(s) refused by a ResourceQuota", file=sys.stderr)
        return 1
    if findings:
        print(f"{len(findings)} finding(s) in {checked} object(s){note}", file=sys.stderr)
        return 1
    print(f"{checked} object(s) valid{note}", file=sys.stderr)
    return 0


def _quotas(args: argparse.Namespace, documents: Sequence[Any]) -> list[Any] | None:
    """The quota outcome of the files' claims, templates and workloads; classes mapping an
    extended resource come from the files and the built-in classes."""
    from dradriver import data

    claims = [d for d in documents if d.obj.get("kind") in ("ResourceClaim", "ResourceClaimTemplate")]
    workloads = [d for d in documents if pod_spec(d.obj) is not None]
    classes = [d for d in documents if d.obj.get("kind") == "DeviceClass"]
    builtin = ClassDirectory((data.DEVICE_CLASSES, data.OPTIONAL_DEVICE_CLASSES)).device_classes()
    return _quota.check_quotas(args, claims, workloads, builtin + classes)
