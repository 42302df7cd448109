"""NVML's GPU recovery action: what it takes to make a GPU usable again (pure data).

Newer host drivers answer the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION with one of these
after a fault, and with NONE once the GPU is fine. Where a driver reports it, it decides whether an
XID makes the device unhealthy and whether the device's re-check passes (NVIDIA's DRA driver
classifies XIDs the same way); older drivers answer NOT_SUPPORTED, and the fixed XID table decides.
"""

from __future__ import annotations

import enum


class RecoveryAction(enum.IntEnum):
    """NVML's nvmlDeviceGpuRecoveryAction_t values."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7

    @property
    def flag_name(self) -> str:
        """`gpu-reset`: how `fake-event --recovery-action` and the fake-event log spell it."""
        return self.name.lower().replace("_", "-")


_NEEDED: dict[int, str] = {
    RecoveryAction.NONE: "no action needed",
    RecoveryAction.GPU_RESET: "GPU reset needed",
    RecoveryAction.NODE_REBOOT: "node reboot needed",
    RecoveryAction.DRAIN_P2P: "drain of peer-to-peer traffic needed",
    RecoveryAction.DRAIN_AND_RESET: "drain and GPU reset needed",
    RecoveryAction.RECOVER_IMEX_DOMAIN: "IMEX domain recovery needed",
    RecoveryAction.BUS_RESET: "bus reset needed",
    RecoveryAction.SYSTEM_REBOOT: "system reboot needed",
}


def needs_action(action: int) -> bool:
    """Whether the GPU must not take new work: any action but NONE, including ones newer than this
    list (a driver that names an action we do not know still says the GPU needs one)."""
    return action != RecoveryAction.NONE


def describe(action: int) -> str:
    """`GPU reset needed (NVML recovery action)`; an unknown number is shown as it came."""
    return f"{_NEEDED.get(action, f'recovery action {action}')} (NVML recovery action)"
