"""What the scheduler writes into a claim once the simulator has allocated it: `status.allocation`.

Lets a node run the whole flow without a cluster (`make demo`, tests): allocate locally, write
the allocated claim where `serve --claims-dir` reads it, prepare over gRPC.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dradriver.offline.allocation.model import DeviceClass
from dradriver.offline.allocation.simulator import ClaimReport


def allocation_status(report: ClaimReport, classes: Mapping[str, DeviceClass]) -> dict[str, Any]:
    """Results in allocation order, then configs as the scheduler lists them: each class's
    configs scoped to the requests (or `request/subrequest`s) that used the class, then the
    claim's own configs."""
    class_of: dict[str, str] = {}
    for request in report.claim.requests:
        if request.exactly is not None:
            class_of[request.name] = request.exactly.device_class
        for sub in request.first_available:
            class_of[f"{request.name}/{sub.name}"] = sub.device_class
    results = []
    used_by: dict[str, list[str]] = {}
    for device in report.results:
        result: dict[str, Any] = {
            "request": device.request,
            "driver": device.driver,
            "pool": device.pool,
            "device": device.device,
        }
        if device.admin_access:
            result["adminAccess"] = True
        if device.share_id is not None:
            result["shareID"] = device.share_id
        if device.consumed_capacity:
            result["consumedCapacity"] = dict(device.consumed_capacity)
        results.append(result)
        requests = used_by.setdefault(class_of[device.request], [])
        if device.request not in requests:
            requests.append(device.request)
    config = [
        {"source": "FromClass", "requests": requests, **dict(entry)}
        for class_name, requests in used_by.items()
        for entry in classes[class_name].config
    ]
    config += [{"source": "FromClaim", **dict(entry)} for entry in report.claim.config]
    return {"devices": {"results": results, "config": config}}
