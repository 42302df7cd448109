"""What `dradriver serve` runs with: its flags, read and checked by the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver import logs
from dradriver.plugin.node_instances import DEFAULT_NODE_LOCK_DIR

if TYPE_CHECKING:  # pydantic: 0.2 s of imports the sockets-first start-up does not wait for
    from dradriver.devicemodel.shares import SharePolicy
    from dradriver.health.config import HealthConfig


@dataclass(frozen=True)
class ServeConfig:
    driver_name: str
    node_name: str
    registry_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    state_dir: Path
    kubeconfig: str | None
    fake_gpus: str | None
    log_format: logs.LogFormat
    verbosity: int
    shutdown_grace: float
    metrics_address: str | None
    claims_dir: Path | None
    driver_root: Path
    driver_root_mount: Path
    partitionable: bool
    stale_claim_grace: float
    #: None: the defaults (`--health-config` not given).
    health: HealthConfig | None = None
    #: Where the host driver's /proc files (/proc/devices, nvidia-caps) are read.
    proc_root: Path = Path("/proc")
    #: The root-only host directory of the node-wide instance lock (`plugin.node_instances`).
    node_lock_dir: Path = DEFAULT_NODE_LOCK_DIR
    #: Claim and pod names as labels of /metrics (--metrics-tenant-labels).
    metrics_tenant_labels: bool = True
    #: Where the host's /dev is seen: the device nodes a spec names are made there if missing.
    host_dev: Path = Path("/dev")
    #: The pod's UID (downward API): rolling updates on, as the Go helper's RollingUpdate(podUID).
    pod_uid: str = ""
    #: Seconds between rescans of the node's devices; 0: only on events.
    rescan_interval: float = 0.0
    #: Seconds between readings of the devices' telemetry (with metrics_address); 0: none.
    telemetry_interval: float = 0.0
    #: Report a claim idle below this SM utilisation (percent) for idle_window seconds; None: off.
    idle_threshold: float | None = None
    idle_window: float | None = None
    #: Exit at start when the API server lets this node's token write another node's slices.
    require_admission_policy: bool = False
    #: Which GPUs are published shareable and how shares are enforced (--gpu-shares); None: off.
    shares: SharePolicy | None = None
    #: Write each prepared claim's device metadata for its containers (--device-metadata).
    device_metadata: bool = True
    #: Where its files go (--device-metadata-dir), a host path the runtime can mount; None:
    #: `<state_dir>/device-metadata`.
    device_metadata_dir: Path | None = None
