"""XIDs: what the common codes mean, and how much each one says about the GPU (pure data).

An XID is the NVIDIA driver's error report. Most codes describe a broken GPU, but a few are
raised for faults of one application (an illegal memory access, a killed context) on a GPU that
is fine; taking the GPU away for those would let one bad job drain a node. The defaults follow
NVIDIA's own ignore list (13, 31, 43, 45, 68, 109; the same list their device plugin and DRA
driver use), and an XID nobody listed is treated as fatal: a GPU that reports something unknown
is not trusted with new work until it has been quiet for a while and answers again.

Where the host driver reports NVML's recovery action with the XID (`recovery`), the action decides
instead of the table: any action needed makes the XID fatal, none leaves the GPU healthy. The
operator's per-XID classes (`xids` in the health config) still come first.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from dradriver.health.recovery import needs_action


class XidClass(enum.StrEnum):
    #: The GPU is broken: the device becomes unhealthy and is tainted.
    FATAL = "fatal"
    #: One application's fault; the GPU is fine. Counted and logged, health unchanged.
    APPLICATION = "application"
    #: A report about the GPU that needs no action now (e.g. a memory row was remapped).
    INFORMATIONAL = "informational"


#: The largest XID code: the host driver reports them as a C int.
MAX_XID = 2**31 - 1

#: NVIDIA's list of XIDs caused by applications, not by the GPU.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: XIDs that record something without the GPU being unusable.
INFORMATIONAL_XIDS = frozenset({63, 92})

DEFAULT_CLASSES: Mapping[int, XidClass] = {
    **dict.fromkeys(sorted(APPLICATION_XIDS), XidClass.APPLICATION),
    **dict.fromkeys(sorted(INFORMATIONAL_XIDS), XidClass.INFORMATIONAL),
}

#: Short names of the XIDs seen most in practice (NVIDIA's XID catalog), for messages.
DESCRIPTIONS: Mapping[int, str] = {
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "Video processor exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    154: "GPU Recovery Action Changed",
}


def describe(xid: int) -> str:
    """`XID 79 (GPU has fallen off the bus)`, or just `XID 500` for a code not in the catalog."""
    name = DESCRIPTIONS.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def classify(
    xid: int,
    overrides: Mapping[int, XidClass] | None = None,
    unlisted: XidClass = XidClass.FATAL,
    recovery: int | None = None,
) -> XidClass:
    """The class of `xid`: an override first, then NVML's `recovery` action where the host driver
    reports one (an action needed: fatal; none: the table's class, if not fatal), then the
    defaults, else `unlisted`."""
    if overrides and xid in overrides:
        return overrides[xid]
    if recovery is not None:
        if needs_action(recovery):
            return XidClass.FATAL
        return DEFAULT_CLASSES.get(xid, XidClass.INFORMATIONAL)
    return DEFAULT_CLASSES.get(xid, unlisted)
