"""Publishing this node's devices as ResourceSlices, with the upstream controller's semantics.

`reconcile` decides (pure), `controller.SliceController` watches and writes.
"""

from dradriver.publish.controller import (
    PublishStatus,
    SliceController,
    WriteCounts,
    delete_node_slices,
    field_selector,
)
from dradriver.publish.reconcile import Plan, plan_pool

__all__ = [
    "Plan",
    "PublishStatus",
    "SliceController",
    "WriteCounts",
    "delete_node_slices",
    "field_selector",
    "plan_pool",
]
