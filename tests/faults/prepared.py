"""Claims for the fault suite, and a driver with one claim prepared on a directory about to fail."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.gpu_driver import GpuDriver
from tests.faults.mounts import tmpfs
from tests.helpers import allocated_claim, uid
from tests.prepare.node import Node


def one_gpu(n: int, device: str) -> dict[str, object]:
    return allocated_claim(f"claim-{n}", uid(n), [{"request": "gpu", "device": device}])


@contextmanager
def one_claim_prepared(
    node: Node, directory: str, size: str = "2m"
) -> Iterator[tuple[GpuDriver, ClaimRef, Path]]:
    """`node`'s `directory` ("state", "cdi" or "device-metadata") on a fresh tmpfs of `size`, and a
    driver on the node with claim 1 prepared on gpu-0; yields the driver, the claim and the mounted
    directory."""
    mounted = node.root / directory
    with tmpfs(mounted, size):
        driver = node.driver()
        try:
            ref = node.add(one_gpu(1, "gpu-0"))
            assert driver.prepare([ref])[ref.uid].error == ""
            yield driver, ref, mounted
        finally:
            driver.close()
