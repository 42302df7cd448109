"""Whether the node's kubelet can run two instances of the driver side by side (pure).

Kubelets from 1.33 keep every registered instance of a DRA driver and call the newest one that
is connected; when one instance's registration socket goes, the others stay registered. Older
kubelets keep one instance per driver name: a second registration replaces the first, and when
the replaced instance then removes its socket the kubelet forgets the driver altogether.
"""

from __future__ import annotations

import re

#: The first kubelet release that keeps several instances of a driver registered.
ROLLING_UPDATE_SINCE = (1, 33)

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?")


def kubelet_minor(version: str) -> tuple[int, int] | None:
    """`v1.32.4-gke.100` -> (1, 32); None for what is not a Kubernetes version."""
    match = _VERSION.fullmatch(version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def supports_rolling_update(kubelet_version: str) -> bool | None:
    """True from 1.33 on, False before, None when the version cannot be read."""
    minor = kubelet_minor(kubelet_version)
    return None if minor is None else minor >= ROLLING_UPDATE_SINCE


def too_old_message(kubelet_version: str) -> str:
    return (
        f"kubelet {kubelet_version} predates 1.33 and keeps only one instance of a DRA driver "
        "registered: during a surge rollout (maxSurge: 1) the driver is unregistered for about a "
        "second when the old pod leaves, until this instance registers again. Upgrade the kubelet, "
        "or roll this node with maxSurge: 0, maxUnavailable: 1"
    )
