"""Device and counter-set names: DNS labels that stay the same across reboots and hot-unplug.

A GPU is named after its minor number (`gpu-<minor>`), never NVML's index, which shifts when
a sibling GPU drops off the bus. A MIG device is named after its parent's minor, its profile and
its placement, all of which describe where it sits rather than when it was created:

    gpu-<parentMinor>-mig-<profile>-<placementStart>[-c<computeStart>]

where <profile> is the MIG profile with everything but [a-z0-9] removed ("1g.10gb+me" ->
"1g10gbme") and the `-c<computeStart>` suffix appears only for a compute instance smaller than
its GPU instance ("1c.3g.40gb"), which can share its GPU instance's placement with siblings.
A possible MIG placement published with --partitionable gets the same name the MIG device
would have once created.
"""

from __future__ import annotations

import re

_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9]")


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device_name(
    parent_minor: int, profile: str, placement_start: int, compute_start: int | None = None
) -> str:
    """`compute_start` only for compute instances that do not span their GPU instance."""
    slug = _NOT_LABEL_CHARS.sub("", profile.lower())
    suffix = "" if compute_start is None else f"-c{compute_start}"
    return f"gpu-{parent_minor}-mig-{slug}-{placement_start}{suffix}"


def counter_set_name(minor: int) -> str:
    """The shared counters of one physical GPU (partitionable mode)."""
    return f"gpu-{minor}-counters"
