"""Kubernetes DRA CEL selectors, evaluated locally with the scheduler's semantics.

Public API::

    from dradriver.offline.cel import compile_selector, to_cel_device

    selector = compile_selector('device.attributes["gpu.dradriver.dev"].productName.startsWith("NVIDIA")')
    selector.matches(device_json, driver="gpu.dradriver.dev")   # bool, or CELRuntimeError

`compile_selector` raises `CELCompileError` where the API server rejects an expression, and
`Selector.matches` raises `CELRuntimeError` where the scheduler's evaluation fails (an unknown
attribute id, a version compared with a string, the cost budget); such an error is never
"false". Compiled selectors are cached and immutable, so they may be shared across threads.
Build a device's CEL value once with `to_cel_device` and reuse it for every selector.

Parsing uses cel-python's grammar (`celpy`); type checking, macro expansion and evaluation are
ports of cel-go and the Kubernetes CEL libraries (see the module docstrings for sources).
"""

from dradriver.offline.cel.device import CELDevice, to_cel_device
from dradriver.offline.cel.errors import CELCompileError, CELRuntimeError
from dradriver.offline.cel.hints import Hint, hints_for
from dradriver.offline.cel.program import COST_LIMIT
from dradriver.offline.cel.selector import (
    MAX_EXPRESSION_LENGTH,
    Evaluation,
    Selector,
    clear_cache,
    compile_selector,
)
from dradriver.offline.cel.semver import Semver
from dradriver.quantity import Quantity

__all__ = [
    "COST_LIMIT",
    "MAX_EXPRESSION_LENGTH",
    "CELCompileError",
    "CELDevice",
    "CELRuntimeError",
    "Evaluation",
    "Hint",
    "Quantity",
    "Selector",
    "Semver",
    "clear_cache",
    "compile_selector",
    "hints_for",
    "to_cel_device",
]
