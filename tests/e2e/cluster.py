"""A real single-node Kubernetes cluster for the end-to-end tests, started from a directory of binaries.

`LocalCluster(bin_dir, work_dir).start()` runs etcd, kube-apiserver, containerd (CDI on),
kube-controller-manager, kube-scheduler and a kubelet as plain root processes, each logging to
`work_dir/logs/<component>.log`, and `stop()` removes everything again: the processes and every
container they started, mounts, network namespaces, the pod bridge, the iptables rules and chains
that appeared, cgroups, and all state. `ControlPlane` is the etcd + kube-apiserver half alone (for
a second API server with other feature gates, or API-only benchmarks).

The binaries are Kubernetes 1.36 (any directory holding etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kubelet, containerd, containerd-shim-runc-v2 and ctr);
the host needs runc, the CNI plugins bridge/host-local/loopback, a static busybox and iptables.
What makes these components run on the project's CI machines (cgroup v1, no CAP_SYS_RESOURCE,
no registry) is handled here; each such setting says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from tests.e2e.pki import Pki
from tests.e2e.processes import Component, free_port, wait_until

if TYPE_CHECKING:
    from scripts.build_image import ImageConfig

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
)
#: The manifests in deploy/ mount these host paths: the kubelet must use them.
KUBELET_ROOT = Path("/var/lib/kubelet")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
BUSYBOX_IMAGE = "docker.io/library/busybox:1.37"
PAUSE_IMAGE = "docker.io/dradriver-e2e/pause:1"
BRIDGE = "dre2e0"
NAT_CHAIN = "DRADRIVER-E2E"
FORWARD_CHAIN = "DRADRIVER-E2E-FWD"
CNI_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
IPTABLES_TABLES = ("filter", "nat", "mangle")
#: The kubelet adds canary chains to both families.
IPTABLES = ("iptables", "ip6tables")


class ClusterError(RuntimeError):
    """The cluster could not be started; the message names the component and its log."""


def missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]


def node_ip() -> str:
    """The address of the default-route interface: a loopback advertise address makes the
    apiserver's endpoint reconciler loop, and pods reach the apiserver through it."""
    routes = subprocess.run(
        ["ip", "-4", "-j", "route", "show", "default"], capture_output=True, text=True, check=False
    )
    for route in json.loads(routes.stdout or "[]"):
        addresses = subprocess.run(
            ["ip", "-4", "-j", "addr", "show", "dev", route["dev"]],
            capture_output=True,
            text=True,
            check=False,
        )
        for link in json.loads(addresses.stdout or "[]"):
            for info in link.get("addr_info", []):
                return str(info["local"])
    raise ClusterError("no default route: cannot choose the node's address")


#: Pod networks to pick from: the first that overlaps nothing on this host (podman, for one,
#: leaves a cni-podman0 bridge on 10.88.0.0/16 behind, with its address still assigned).
POD_CIDRS = ("10.88.0.0/16", "10.244.0.0/16", "10.42.0.0/16", "172.31.0.0/16")


def free_pod_cidr() -> str:
    def ip_json(*args: str) -> list[dict[str, Any]]:
        done = subprocess.run(["ip", "-4", "-j", *args], capture_output=True, text=True, check=False)
        result: list[dict[str, Any]] = json.loads(done.stdout or "[]")
        return result

    destinations = [str(r.get("dst", "")) for r in ip_json("route", "show", "table", "all")]
    taken = [ipaddress.ip_network(d, strict=False) for d in destinations if d and d != "default"]
    taken += [
        ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
        for link in ip_json("addr", "show")
        for info in link.get("addr_info", [])
    ]
    for candidate in POD_CIDRS:
        network = ipaddress.ip_network(candidate)
        if not any(network.overlaps(t) for t in taken if not t.is_loopback):
            return candidate
    raise ClusterError(f"every candidate pod network overlaps one of this host's: {', '.join(POD_CIDRS)}")


def _static_busybox() -> Path:
    for candidate in (shutil.which("busybox"), "/bin/busybox", "/usr/bin/busybox"):
        if candidate and Path(candidate).exists():
            head = subprocess.run(
                ["file", "-L", candidate], capture_output=True, text=True, check=False
            ).stdout
            if "statically linked" in head or "static-pie" in head or not shutil.which("file"):
                return Path(candidate)
    raise ClusterError("a static busybox is needed for the test images (apt-get install busybox-static)")


def _cni_dir() -> Path:
    for directory in CNI_DIRS:
        if all((directory / p).exists() for p in ("bridge", "host-local", "loopback")):
            return directory
    raise ClusterError(
        "CNI plugins bridge, host-local and loopback not found (apt-get install containernetworking-plugins)"
    )


@dataclass
class ControlPlane:
    """etcd and kube-apiserver on free ports, with their own PKI and data under `work_dir`."""

    bin_dir: Path
    work_dir: Path
    advertise_address: str
    feature_gates: str = ""
    service_cidr: str = "10.0.0.0/24"
    #: Added to kube-apiserver's environment (e.g. GODEBUG=memprofilerate=N for a finer heap profile).
    apiserver_env: dict[str, str] = field(default_factory=dict)
    #: The beta versions too: the tests read and write them like older clients do. Each served
    #: version has a watch cache of its own (three copies of every ResourceSlice).
    beta_resource_apis: bool = True
    components: list[Component] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logs = self.work_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pki = Pki(self.work_dir / "pki")
        self.apiserver_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.admin_kubeconfig = self.work_dir / "admin.kubeconfig"

    @property
    def service_ip(self) -> str:
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    def gate_flags(self) -> list[str]:
        return [f"--feature-gates={self.feature_gates}"] if self.feature_gates else []

    def kubeconfig_for(self, name: str, user: str, organization: str | None = None) -> Path:
        credential = self.pki.issue(name, user, organization)
        return self.pki.kubeconfig(self.work_dir / f"{name}.kubeconfig", user, credential, self.server)

    def start(self) -> None:
        etcd_client, etcd_peer = free_port(), free_port()
        etcd = self._launch(
            "etcd",
            "--name=e2e",
            f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            "--log-level=error",
        )
        wait_until(lambda: _tcp_open("127.0.0.1", etcd_client), 60, "etcd to listen", etcd)
        serving = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"),
            ips=("127.0.0.1", self.service_ip, self.advertise_address),
        )
        kubelet_client = self.pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"
        )
        issuer = "https://kubernetes.default.svc.cluster.local"
        apiserver = self._launch(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.advertise_address}",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca.cert}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--service-account-issuer={issuer}",
            f"--api-audiences={issuer}",
            f"--service-account-key-file={self.pki.service_account_public}",
            f"--service-account-signing-key-file={self.pki.service_account}",
            f"--service-cluster-ip-range={self.service_cidr}",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            *(
                ["--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"]
                if self.beta_resource_apis
                else []
            ),
            "--v=1",
            *self.gate_flags(),
            env={**os.environ, **self.apiserver_env} if self.apiserver_env else None,
        )
        self.kubeconfig_for("admin", "kubernetes-admin", "system:masters").rename(self.admin_kubeconfig)
        wait_until(self._ready, 120, "kube-apiserver /readyz", apiserver)

    def _ready(self) -> bool:
        done = subprocess.run(
            [
                "curl",
                "-sf",
                "--max-time",
                "2",
                "--cacert",
                str(self.pki.ca.cert),
                "--cert",
                str(self.work_dir / "pki/admin.crt"),
                "--key",
                str(self.work_dir / "pki/admin.key"),
                f"{self.server}/readyz",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.returncode == 0

    def _launch(self, name: str, *args: str, env: dict[str, str] | None = None) -> Component:
        component = Component(name, [str(self.bin_dir / name), *args], self.logs / f"{name}.log", env)
        component.start()
        self.components.append(component)
        return component

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()


@dataclass
class _HostState:
    """What was on the host before the cluster started, so that stop() removes only what it added."""

    chains: set[tuple[str, str, str]]
    netns: set[str]
    ip_forward: str
    root_shared: bool


def _root_is_shared() -> bool:
    """Whether `/` is a shared mount (the optional fields of its mountinfo line name a peer group)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return any(f.startswith("shared:") for f in fields[6 : fields.index("-")])
    return False


#: One local cluster per machine (it owns /var/lib/kubelet): a second one waits for this lock.
MACHINE_LOCK = Path("/var/tmp/dradriver-e2e-cluster.lock")
#: Written into KUBELET_ROOT by `start`, naming the cluster's work directory. Found by whoever
#: holds MACHINE_LOCK while no kubelet runs, it marks what a killed run left (its holder is
#: gone), not another kubelet's state.
OWNER_MARK = KUBELET_ROOT / ".dradriver-e2e-cluster"


class LocalCluster:
    """The whole single-node cluster. One per machine: `start` waits until no other runs."""

    def __init__(
        self,
        bin_dir: Path,
        work_dir: Path,
        *,
        node_name: str = "e2e-node",
        pod_cidr: str | None = None,
        feature_gates: str = "",
        kubelet_verbosity: int = 4,
    ) -> None:
        self.bin_dir = bin_dir.resolve()
        self.work_dir = work_dir.resolve()
        self.node_name = node_name
        self.pod_cidr = pod_cidr or free_pod_cidr()
        self.kubelet_verbosity = kubelet_verbosity
        self.node_ip = node_ip()
        self.control_plane = ControlPlane(self.bin_dir, self.work_dir, self.node_ip, feature_gates)
        self.containerd_socket = self.work_dir / "run/containerd.sock"
        self.kubelet: Component | None = None
        self._components: list[Component] = []
        self._host: _HostState | None = None
        self._lock: IO[str] | None = None
        self.kubeconfig = self.control_plane.admin_kubeconfig
        self.logs = self.control_plane.logs

    # --- start ----------------------------------------------------------------------------

    def start(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the local cluster runs as root (kubelet, containerd, iptables, mounts)")
        if missing := missing_binaries(self.bin_dir):
            raise ClusterError(f"missing in {self.bin_dir}: {', '.join(missing)}")
        for tool in ("runc", "iptables", "ip", "curl", "mount"):
            if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
                raise ClusterError(f"{tool} is not installed")
        self._lock = MACHINE_LOCK.open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another local cluster to finish (lock {MACHINE_LOCK})", file=sys.stderr)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        if KUBELET_ROOT.exists() and any(KUBELET_ROOT.iterdir()):
            killed_run = _killed_runs_work_dir()
            if killed_run is None:
                self._release_lock()  # and touch nothing: it belongs to someone else
                raise ClusterError(f"{KUBELET_ROOT} is not empty: another kubelet owns this machine")
            _remove_leftovers(killed_run)
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        OWNER_MARK.write_text(f"{self.work_dir}\n")
        self._host = _HostState(
            chains=_iptables_chains(),
            netns=_netns(),
            ip_forward=Path("/proc/sys/net/ipv4/ip_forward").read_text(),
            root_shared=_root_is_shared(),
        )
        try:
            if not self._host.root_shared:
                # As on any systemd host: HostToContainer and Bidirectional volume propagation
                # (the GPU DaemonSets' driver root) need the host path on a shared mount.
                subprocess.run(["mount", "--make-rshared", "/"], check=True, capture_output=True)
            self.control_plane.start()
            self._network_rules()
            self._start_containerd()
            self._import_base_images()
            self._start_controllers()
            self.start_kubelet()
            self.wait_node_ready()
        except BaseException:
            self.stop()
            raise

    def _launch(self, name: str, *args: str) -> Component:
        binary = args[0] if args and args[0].startswith("/") else str(self.bin_dir / name)
        rest = args[1:] if args and args[0].startswith("/") else args
        component = Component(name, [binary, *rest], self.logs / f"{name}.log")
        component.start()
        self._components.append(component)
        return component

    def _network_rules(self) -> None:
        """No kube-proxy: the `kubernetes` Service IP is a DNAT rule to the apiserver, so in-cluster
        clients (the plugin's DaemonSet) work. Pods may talk to each other and to this host only:
        nothing a pod sends ever leaves the machine."""
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        cp = self.control_plane
        nat = [
            ["-t", "nat", "-N", NAT_CHAIN],
            [
                "-t",
                "nat",
                "-A",
                NAT_CHAIN,
                "-d",
                f"{cp.service_ip}/32",
                "-p",
                "tcp",
                "--dport",
                "443",
                "-j",
                "DNAT",
                "--to-destination",
                f"{self.node_ip}:{cp.apiserver_port}",
            ],
            ["-t", "nat", "-I", "PREROUTING", "-j", NAT_CHAIN],
            ["-t", "nat", "-I", "OUTPUT", "-j", NAT_CHAIN],
            ["-N", FORWARD_CHAIN],
            ["-A", FORWARD_CHAIN, "-s", self.pod_cidr, "-d", self.pod_cidr, "-j", "ACCEPT"],
            ["-A", FORWARD_CHAIN, "-s", self.pod_cidr, "-j", "DROP"],
            ["-A", FORWARD_CHAIN, "-d", self.pod_cidr, "-j", "DROP"],
            ["-I", "FORWARD", "-j", FORWARD_CHAIN],
        ]
        for rule in nat:
            subprocess.run(["iptables", "-w", *rule], check=True, capture_output=True)

    def _write_cni_config(self) -> Path:
        conf_dir = self.work_dir / "cni/net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "cniVersion": "1.0.0",
            "name": "dradriver-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.work_dir / "cni/ipam"),
                        "ranges": [[{"subnet": self.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        }
        (conf_dir / "10-dradriver-e2e.conflist").write_text(json.dumps(config, indent=2))
        return conf_dir

    def _start_containerd(self) -> None:
        runc = shutil.which("runc") or "/usr/sbin/runc"
        # Without CAP_SYS_RESOURCE (bit 24 of the bounding set; some VMs drop it) runc cannot set
        # the negative oom_score_adj the kubelet asks for: clamp to containerd's own instead.
        bounding = int(re.search(r"CapBnd:\s*([0-9a-f]+)", Path("/proc/self/status").read_text())[1], 16)  # type: ignore[index]
        restrict_oom = not (bounding >> 24) & 1
        runtime = 'plugins."io.containerd.cri.v1.runtime"'
        config = f"""version = 3
root = "{self.work_dir / "containerd/root"}"
state = "{self.work_dir / "containerd/state"}"
[grpc]
  address = "{self.containerd_socket}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[{runtime}]
  restrict_oom_score_adj = {str(restrict_oom).lower()}
  enable_cdi = true
  cdi_spec_dirs = {json.dumps(list(CDI_DIRS))}
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = ["{_cni_dir()}"]
    conf_dir = "{self._write_cni_config()}"
"""
        path = self.work_dir / "containerd.toml"
        path.write_text(config)
        self.containerd_socket.parent.mkdir(parents=True, exist_ok=True)
        env_path = f"{self.bin_dir}:{os.environ.get('PATH', '')}"
        component = Component(
            "containerd",
            [str(self.bin_dir / "containerd"), "--config", str(path)],
            self.logs / "containerd.log",
            env={**os.environ, "PATH": env_path},
        )
        component.start()
        self._components.append(component)
        wait_until(lambda: self.ctr("version", check=False).returncode == 0, 60, "containerd", component)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=300,
        )

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive under the names its index gives; an archive of one image (`make
        image`) also under `name@sha256:<manifest>`, which a reference pinned by digest (the
        release's manifests) resolves to. Only the local importer names manifests, not the
        index, by digest."""
        self.ctr("images", "import", str(archive))
        with tarfile.open(archive) as tar:
            index = tar.extractfile("index.json")
            assert index is not None, f"{archive}: no index.json"
            names = {m["annotations"]["io.containerd.image.name"] for m in json.load(index)["manifests"]}
        if len(names) == 1:
            base = names.pop().rsplit(":", 1)[0]
            self.ctr("images", "import", "--local", "--digests", "--base-name", base, str(archive))

    def _import_base_images(self) -> None:
        """busybox (what the examples run) and the pause image, from the host's static busybox:
        nothing can be pulled here."""
        from scripts.build_image import ImageConfig

        self.import_busybox_images(
            {
                BUSYBOX_IMAGE: ImageConfig(env=("PATH=/bin",), cmd=("sh",)),
                PAUSE_IMAGE: ImageConfig(env=("PATH=/bin",), entrypoint=("/bin/sleep", "2147483647")),
            }
        )

    def import_busybox_images(
        self, images: Mapping[str, ImageConfig], scripts: Mapping[str, str] | None = None
    ) -> None:
        """Import images under these references, all one layer: the host's static busybox with
        every applet in /bin, plus `scripts` (path in the image -> content, executable)."""
        busybox = _static_busybox()
        with tempfile.TemporaryDirectory(dir=self.work_dir) as work:
            root = Path(work) / "rootfs"
            for sub in ("bin", "etc", "tmp", "dev", "proc", "sys", "root"):
                (root / sub).mkdir(parents=True)
            shutil.copy2(busybox, root / "bin/busybox")
            applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout
            for applet in applets.split():
                if applet != "busybox":
                    (root / "bin" / applet).symlink_to("busybox")
            (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
            (root / "etc/group").write_text("root:x:0:\n")
            (root / "tmp").chmod(0o1777)
            for name, content in (scripts or {}).items():
                script = root / name.lstrip("/")
                script.parent.mkdir(parents=True, exist_ok=True)
                script.write_text(content)
                script.chmod(0o755)
            self.import_root(root, images)

    def import_root(self, root: Path, images: Mapping[str, ImageConfig]) -> None:
        """Import images under these references, all one layer: the root filesystem `root`."""
        from scripts.build_image import write_archive

        with tempfile.TemporaryDirectory(dir=self.work_dir) as work:
            layer = Path(work) / "layer.tar"
            subprocess.run(
                [
                    "tar",
                    "--numeric-owner",
                    "--owner=0",
                    "--group=0",
                    "--sort=name",
                    "--mtime=@0",
                    "-C",
                    str(root),
                    "-cf",
                    str(layer),
                    ".",
                ],
                check=True,
            )
            archive = Path(work) / "images.tar"
            write_archive(layer, archive, images, epoch=0)
            self.import_image(archive)

    def _start_controllers(self) -> None:
        cp = self.control_plane
        manager = cp.kubeconfig_for("controller-manager", "system:kube-controller-manager")
        scheduler = cp.kubeconfig_for("scheduler", "system:kube-scheduler")
        self._launch(
            "kube-controller-manager",
            f"--kubeconfig={manager}",
            f"--authentication-kubeconfig={manager}",
            f"--authorization-kubeconfig={manager}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            f"--service-account-private-key-file={cp.pki.service_account}",
            f"--root-ca-file={cp.pki.ca.cert}",
            # The default ServiceAccounts, their tokens and the resourceclaim controller (claims
            # from templates and for extended resources) need per-controller credentials.
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={cp.pki.ca.cert}",
            f"--cluster-signing-key-file={cp.pki.ca.key}",
            f"--service-cluster-ip-range={cp.service_cidr}",
            "--v=1",
            *cp.gate_flags(),
        )
        self._launch(
            "kube-scheduler",
            f"--kubeconfig={scheduler}",
            f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            "--v=2",
            *cp.gate_flags(),
        )

    def _kubelet_config(self) -> Path:
        cp = self.control_plane
        serving = cp.pki.issue(
            "kubelet-serving",
            f"system:node:{self.node_name}",
            "system:nodes",
            dns=(self.node_name, "localhost"),
            ips=("127.0.0.1", self.node_ip),
        )
        gates = dict(item.split("=") for item in cp.feature_gates.split(",") if item)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(cp.pki.ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            # Kubernetes >= 1.35 refuses cgroup v1 unless told otherwise; CI machines have it.
            "failCgroupV1": False,
            "failSwapOn": False,
            "port": self.kubelet_port,
            "healthzPort": free_port(),
            "readOnlyPort": 0,
            "clusterDomain": "cluster.local",
            # No DNS in this cluster, and pods must not inherit the host's resolvers.
            "resolvConf": "",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 95,
            "imageGCLowThresholdPercent": 90,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "2%",
                "imagefs.available": "2%",
            },
            "featureGates": {k: v == "true" for k, v in gates.items()},
        }
        path = self.work_dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_kubelet(self) -> None:
        if not hasattr(self, "kubelet_port"):
            self.kubelet_port = free_port()
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        for sub in ("plugins_registry", "plugins"):
            (KUBELET_ROOT / sub).mkdir(exist_ok=True)
        for directory in CDI_DIRS:
            Path(directory).mkdir(parents=True, exist_ok=True)
        kubeconfig = self.control_plane.kubeconfig_for(
            "kubelet", f"system:node:{self.node_name}", "system:nodes"
        )
        self.kubelet = self._launch(
            "kubelet",
            f"--config={self._kubelet_config()}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.node_ip}",
            f"--root-dir={KUBELET_ROOT}",
            f"--v={self.kubelet_verbosity}",
        )

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
            self._components.remove(self.kubelet)
            self.kubelet = None

    def restart_kubelet(self) -> None:
        self.stop_kubelet()
        self.start_kubelet()
        self.wait_node_ready()

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        from tests.deploy.manifests import kubectl

        done = subprocess.run(
            [kubectl(), "--kubeconfig", str(self.kubeconfig), "--request-timeout=30s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def wait_node_ready(self) -> None:
        """The kubelet's own /healthz first (through the apiserver): after a restart the Node may
        still show Ready from before for up to 40 s."""
        assert self.kubelet is not None
        kubelet = self.kubelet
        wait_until(
            lambda: (
                self.kubectl(
                    "get", "--raw", f"/api/v1/nodes/{self.node_name}/proxy/healthz", check=False
                ).returncode
                == 0
            ),
            120,
            "the kubelet's /healthz",
            kubelet,
        )
        wait_until(
            lambda: (
                self.kubectl(
                    "wait", "--for=condition=Ready", f"node/{self.node_name}", "--timeout=5s", check=False
                ).returncode
                == 0
            ),
            180,
            f"node {self.node_name} Ready",
            kubelet,
        )
        wait_until(
            lambda: (
                self.kubectl("-n", "default", "get", "serviceaccount", "default", check=False).returncode == 0
            ),
            60,
            "ServiceAccount default/default",
            kubelet,
        )

    # --- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Remove everything the cluster added to the host; safe to call more than once, and a
        no-op for a cluster that never got as far as owning the machine."""
        if self._host is None:
            return
        self.stop_kubelet()
        self._kill_containers()
        for component in reversed(self._components):
            component.stop()
        self._components.clear()
        self.control_plane.stop()
        _kill_processes_of(self.work_dir)
        _unmount(self.work_dir, keep_netns=self._host.netns)
        self._remove_network()
        _remove_state(self.work_dir)
        self._host = None
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def _kill_containers(self) -> None:
        if not self.containerd_socket.exists():
            return
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(
            "RUNNING" in line for line in self.ctr("tasks", "ls", check=False).stdout.splitlines()
        ):
            time.sleep(0.2)

    def _remove_network(self) -> None:
        _remove_bridge_and_chains()
        if self._host is None:
            return
        # Chains that appeared while the cluster ran (ours, the kubelet's canaries and firewall):
        # flush all first (they may jump to each other), then remove the jumps and the chains.
        added = sorted(_iptables_chains() - self._host.chains)
        for tool, table, chain in added:
            subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True, check=False)
        for tool, table, chain in added:
            _delete_jumps_to(tool, table, chain)
            subprocess.run([tool, "-w", "-t", table, "-X", chain], capture_output=True, check=False)
        Path("/proc/sys/net/ipv4/ip_forward").write_text(self._host.ip_forward)
        if not self._host.root_shared:
            subprocess.run(["mount", "--make-rprivate", "/"], check=False, capture_output=True)

    def component_logs(self) -> dict[str, Path]:
        return {path.stem: path for path in sorted(self.logs.glob("*.log"))}


def _tcp_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _iptables_chains() -> set[tuple[str, str, str]]:
    """(tool, table, chain) of every user-defined chain of both families."""
    chains = set()
    for tool in IPTABLES:
        if shutil.which(tool) is None:
            continue
        for table in IPTABLES_TABLES:
            done = subprocess.run(
                [tool, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
            )
            chains |= {
                (tool, table, line.split()[1]) for line in done.stdout.splitlines() if line.startswith("-N ")
            }
    return chains


def _delete_jumps_to(tool: str, table: str, chain: str) -> None:
    listing = subprocess.run(
        [tool, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
    ).stdout
    for line in listing.splitlines():
        parts = line.split()
        if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] == chain:
            subprocess.run([tool, "-w", "-t", table, "-D", *parts[1:]], capture_output=True, check=False)


def _netns() -> set[str]:
    directory = Path("/run/netns")
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def _kubepods_cgroup_files(name: str) -> Iterator[Path]:
    root = Path("/sys/fs/cgroup")
    for hierarchy in [root, *([p for p in root.iterdir() if p.is_dir()] if root.is_dir() else [])]:
        kubepods = hierarchy / "kubepods"
        if kubepods.is_dir():
            yield from kubepods.rglob(name)


def _remove_kubepods_cgroups() -> None:
    root = Path("/sys/fs/cgroup")
    if not root.is_dir():
        return
    for hierarchy in [root, *[p for p in root.iterdir() if p.is_dir()]]:
        kubepods = hierarchy / "kubepods"
        if not kubepods.is_dir():
            continue
        for directory in sorted(
            (p for p in kubepods.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            kubepods.rmdir()


def _killed_runs_work_dir() -> Path | None:
    """The work directory OWNER_MARK names, when no kubelet runs; None when the state in
    KUBELET_ROOT may be someone else's."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        named = OWNER_MARK.read_text().strip()
        if named.startswith("/") and not any(_command_line(pid)[:1] == [b"kubelet"] for pid in _pids()):
            return Path(named)
    return None


def _command_line(pid: int) -> list[bytes]:
    """The process's arguments, its program by base name; [] when it is gone."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return []
    return [os.path.basename(args[0]), *args[1:]]


def _kill_processes_of(work_dir: Path) -> None:
    """Every process whose command line names the work directory (the components, containerd's
    shims), then every process left in the pods' cgroups."""
    named = str(work_dir).encode()
    for pid in _pids():
        args = _command_line(pid)[1:]
        if pid != os.getpid() and any(a.endswith(named) or named + b"/" in a for a in args):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for procs in _kubepods_cgroup_files("cgroup.procs"):
        with contextlib.suppress(OSError):
            for pid_text in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_text), signal.SIGKILL)


def _unmount(work_dir: Path, keep_netns: set[str]) -> None:
    roots = (str(KUBELET_ROOT), str(work_dir / "containerd"), "/run/netns", "/var/run/netns")
    for _ in range(3):
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if any(line.split()[1] == r or line.split()[1].startswith(r + "/") for r in roots)
        ]
        mounts = [m for m in mounts if Path(m).name not in keep_netns]
        if not mounts:
            break
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", mount], capture_output=True, check=False)
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    for name in _netns() - keep_netns:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def _remove_bridge_and_chains() -> None:
    """The pod bridge and the two chains `_network_rules` adds, which carry this suite's names."""
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    for table, chain in (("nat", NAT_CHAIN), ("filter", FORWARD_CHAIN)):
        _delete_jumps_to("iptables", table, chain)
        subprocess.run(["iptables", "-w", "-t", table, "-F", chain], capture_output=True, check=False)
        subprocess.run(["iptables", "-w", "-t", table, "-X", chain], capture_output=True, check=False)


def _remove_state(work_dir: Path) -> None:
    _remove_kubepods_cgroups()
    for path in (KUBELET_ROOT, work_dir / "containerd", work_dir / "run", work_dir / "etcd"):
        shutil.rmtree(path, ignore_errors=True)
    for directory in CDI_DIRS:
        for spec in Path(directory).glob("k8s.*-claim_*"):
            spec.unlink(missing_ok=True)


def _remove_leftovers(work_dir: Path) -> None:
    """What a local cluster killed before its `stop` left: its processes, mounts, network and state.
    Its network namespaces stay (which were its own is not known); the chains the kubelet added
    stay too, and the next cluster takes them as the host's."""
    print(f"removing what a killed local cluster ({work_dir}) left on this machine", file=sys.stderr)
    _kill_processes_of(work_dir)
    _unmount(work_dir, keep_netns=_netns())
    _remove_bridge_and_chains()
    _remove_state(work_dir)
