"""The plugin as operators install it: a release's rendered manifests (one per kustomization of
deploy/, the image pinned by digest) applied to the real cluster."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from tests.deploy.manifests import kubectl
from tests.e2e.realcluster import RealCluster
from tests.release.release import ReleaseDirectory

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "dradriver"
DAEMONSET = "dradriver-kubelet-plugin"
#: The node label that admits the GPU DaemonSets (base, gpu-operator) to a node.
GPU_NODE_LABEL = "gpu.dradriver.dev/present"
#: The GPU operator's label for GPU clients, which the gpu-operator overlay's nodeSelector names
#: ("true" as the operator sets it; its driver manager flips it around a host driver upgrade).
GPU_CLIENT_LABEL = "nvidia.com/gpu.deploy.client"
DRIVER = DEFAULT_DRIVER_NAME
CDI_DIR = "/var/run/cdi"
STATE_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
#: The fake GPU profile deploy/overlays/fake sets.
FAKE_OVERLAY_PROFILE = "dgx-h100"


def wait(condition: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until `condition()` is truthy and return it; the failure names what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


SEEN_DIR = "/tmp/cdi-seen"


@dataclass
class CdiRecorder:
    deployment: Deployment

    def specs(self) -> list[dict[str, Any]]:
        names = self.deployment.exec("sh", "-c", f"ls {SEEN_DIR} 2>/dev/null || true").split()
        return [json.loads(self.deployment.exec("cat", f"{SEEN_DIR}/{name}")) for name in names]


def _one_ready(pods: list[dict[str, Any]]) -> bool:
    """One pod, every container of it ready (a pod just created reports none yet)."""
    statuses = pods[0]["status"].get("containerStatuses", []) if len(pods) == 1 else []
    return bool(statuses) and all(c["ready"] for c in statuses)


@dataclass
class Deployment:
    """dradriver installed from a release's manifests of one kustomization (`overlays/fake`,
    `base`, `overlays/gpu-operator`)."""

    cluster: RealCluster
    release: ReleaseDirectory
    kustomization: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def node_labels(self) -> list[str]:
        """The labels a node of this kustomization carries where dradriver is to run."""
        return {
            "overlays/fake": [],
            "base": [GPU_NODE_LABEL],
            "overlays/gpu-operator": [GPU_NODE_LABEL, GPU_CLIENT_LABEL],
        }[self.kustomization]

    def install(self) -> None:
        if self.node_labels:
            pairs = [f"{label}=true" for label in self.node_labels]
            self.cluster.kubectl("label", "node", self.cluster.node_name, *pairs, "--overwrite")
        self.cluster.kubectl("apply", "-f", str(self.release.manifests(self.kustomization)))
        self.cluster.kubectl("apply", "-f", str(self.release.device_classes))
        if self.env:
            self.set_env(**self.env)
        self.wait_ready()
        self.cluster.log_sources["plugin"] = self.logs

    def set_env(self, **env: str) -> None:
        """Change the plugin's environment (a rollout) and wait for the new pod to be ready."""
        self.env.update(env)
        pairs = [f"{k}={v}" for k, v in env.items()]
        self.cluster.kubectl("-n", NAMESPACE, "set", "env", f"daemonset/{DAEMONSET}", "-c", "plugin", *pairs)
        self.wait_ready()

    def use_profile(self, profile_cell: str) -> None:
        """Give the fake backend this GPU profile, with serve flags (`a100-mig-empty --partitionable`),
        by a rollout unless it has them already."""
        profile, *flags = profile_cell.split()
        wanted = {
            "DRADRIVER_FAKE_GPUS": profile,
            "DRADRIVER_PARTITIONABLE": str("--partitionable" in flags).lower(),
            "DRADRIVER_GPU_SHARES": "mps" if "--gpu-shares=mps" in flags else "",
        }
        defaults = {
            "DRADRIVER_FAKE_GPUS": FAKE_OVERLAY_PROFILE,
            "DRADRIVER_PARTITIONABLE": "false",
            "DRADRIVER_GPU_SHARES": "",
        }
        current = defaults | self.env
        if any(current[k] != v for k, v in wanted.items()):
            self.set_env(**wanted)

    def profile_from_host(self, host_dir: Path, profile: str = "gpus.yaml") -> None:
        """Point the fake backend at `host_dir/profile` on the node (mounted read-only), so a test
        can change the inventory by replacing that file; a rollout."""
        mount = "/etc/dradriver-profile"
        volume = {"name": "profile", "hostPath": {"path": str(host_dir), "type": "Directory"}}
        container = {
            "name": "plugin",
            "env": [{"name": "DRADRIVER_FAKE_GPUS", "value": f"{mount}/{profile}"}],
            "volumeMounts": [{"name": "profile", "mountPath": mount, "readOnly": True}],
        }
        patch = {"spec": {"template": {"spec": {"volumes": [volume], "containers": [container]}}}}
        self.cluster.kubectl("-n", NAMESPACE, "patch", f"daemonset/{DAEMONSET}", "-p", json.dumps(patch))
        self.wait_ready()

    def wait_ready(self) -> None:
        """Rolled out, the new pod Ready (registered, slices published) and the old one gone."""
        self.cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", f"daemonset/{DAEMONSET}", "--timeout=180s", timeout=200
        )
        # Rollout status may judge a DaemonSet status the controller has not updated yet.
        wait(lambda: _one_ready(self.pods()), 120, "exactly one plugin pod on the node, ready")

    def wait_replaced(self, old_pod: str, timeout: float = 180) -> int:
        """Wait until the node's one plugin pod is a ready one other than `old_pod`, watching the
        rollout; returns the most plugin pods seen on the node at once (2: it surged)."""
        most = 1

        def replaced() -> bool:
            nonlocal most
            pods = self.pods()
            most = max(most, len(pods))
            return _one_ready(pods) and pods[0]["metadata"]["name"] != old_pod

        wait(replaced, timeout, "the new plugin pod ready and the old one gone")
        return most

    def pods(self) -> list[dict[str, Any]]:
        items = self.cluster.get_json(
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/name=dradriver",
            "--field-selector",
            f"spec.nodeName={self.cluster.node_name}",
        )["items"]
        assert isinstance(items, list)
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def pod(self) -> str:
        (pod,) = self.pods()
        return str(pod["metadata"]["name"])

    def exec(self, *command: str, check: bool = True) -> str:
        done = self.cluster.kubectl(
            "-n", NAMESPACE, "exec", self.pod(), "-c", "plugin", "--", *command, check=check
        )
        return done.stdout

    def set_utilization(self, devices: Sequence[str], percent: int) -> None:
        """The fake backend's SM utilisation of `devices` (it outlives the pod: the node's state)."""
        names = " ".join(devices)
        self.exec(
            "sh",
            "-c",
            f"for d in {names}; do dradriver fake-event --device $d --utilization {percent} || exit; done",
        )

    def status(self) -> dict[str, Any]:
        """`dradriver status -o json` inside the plugin pod: the checkpoint as the node has it."""
        result: dict[str, Any] = json.loads(self.exec("dradriver", "status", "-o", "json"))
        return result

    def cdi_files(self) -> list[str]:
        listing = self.exec("ls", "-1", CDI_DIR)
        return sorted(name for name in listing.split() if name.startswith(f"k8s.{DRIVER}-claim_"))

    def cdi_spec(self, claim_uid: str) -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(self.exec("cat", f"{CDI_DIR}/k8s.{DRIVER}-claim_{claim_uid}.json"))
        return spec

    @contextlib.contextmanager
    def recording_cdi(self) -> Iterator[CdiRecorder]:
        """Keep a copy of every claim CDI spec that appears while the block runs: a short-lived
        pod's spec is removed again when its claim is unprepared, before a test can look."""
        pod = self.pod()
        pattern = f"{CDI_DIR}/k8s.{DRIVER}-claim_*.json"
        # Ends on a stop file, and by itself after five minutes at the latest.
        script = (
            f"mkdir -p {SEEN_DIR}; i=0; while [ ! -e {SEEN_DIR}/.stop ] && [ $i -lt 6000 ]; do "
            f'for f in {pattern}; do [ -e "$f" ] && cp "$f" {SEEN_DIR}/; done; sleep 0.05; i=$((i+1)); done'
        )
        in_pod = ("-n", NAMESPACE, "exec", pod, "-c", "plugin", "--")
        watcher = subprocess.Popen(
            [kubectl(), "--kubeconfig", str(self.cluster.kubeconfig), *in_pod, "sh", "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # Copying once its directory is there: a short Job's spec may come and go at once.
            wait(
                lambda: self.cluster.kubectl(*in_pod, "test", "-d", SEEN_DIR, check=False).returncode == 0,
                30,
                "the CDI recorder to run",
            )
            yield CdiRecorder(self)
        finally:
            self.exec("touch", f"{SEEN_DIR}/.stop", check=False)
            watcher.wait(30)
            self.exec("rm", "-rf", SEEN_DIR, check=False)

    def logs(self) -> str:
        pods = self.pods()
        if not pods:
            return "(no plugin pod)"
        done = self.cluster.kubectl(
            "-n", NAMESPACE, "logs", pods[0]["metadata"]["name"], "-c", "plugin", "--tail=60", check=False
        )
        return done.stdout + done.stderr

    def all_logs(self) -> str:
        done = self.cluster.kubectl("-n", NAMESPACE, "logs", self.pod(), "-c", "plugin", check=False)
        return done.stdout

    def slices(self) -> list[dict[str, Any]]:
        items = self.cluster.get_json(
            "resourceslices",
            "--field-selector",
            f"spec.driver={DRIVER},spec.nodeName={self.cluster.node_name}",
        )["items"]
        assert isinstance(items, list)
        return sorted(items, key=lambda s: str(s["metadata"]["name"]))

    def devices(self) -> list[str]:
        return sorted(d["name"] for s in self.slices() for d in s["spec"].get("devices", []))

    def uninstall(self) -> None:
        self.cluster.log_sources.pop("plugin", None)
        self.cluster.kubectl(
            "delete",
            "-f",
            str(self.release.manifests(self.kustomization)),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
            timeout=150,
        )
        self.cluster.kubectl("delete", "-f", str(self.release.device_classes), "--ignore-not-found")
        self.cluster.kubectl(
            "delete", "resourceslices", "--field-selector", f"spec.driver={DRIVER}", "--ignore-not-found"
        )
        if self.node_labels:
            removed = [f"{label}-" for label in self.node_labels]
            self.cluster.kubectl("label", "node", self.cluster.node_name, *removed)
