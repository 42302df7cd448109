"""Helm values written for NVIDIA's DRA driver chart, rewritten as values of dradriver's chart
(pure, no I/O).

`migrate_values(values, driver=...)` returns one `Migration`: its one output is a values file for
deploy/helm/dradriver holding only what differs from that chart's defaults; every NVIDIA value
given is either carried over (a `Change` naming our value in `target`), dropped with the reason
it is not needed, or a `Problem` saying it has no equivalent. Unknown keys and wrong types are
problems naming the key, never a crash. Values not given are NVIDIA's defaults and say nothing.

Read from NVIDIA's chart (kubernetes-sigs/dra-driver-nvidia-gpu, formerly
NVIDIA/k8s-dra-driver-gpu, `deployments/helm/*/values.yaml` and `pkg/featuregates`) at main
0f5a1bc2 (2026-11), with the keys earlier releases had (`maskNvidiaDriverParams`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.offline.migrate import nvidia
from dradriver.offline.migrate.translate import Migration

#: How `describe` and the report name a values file.
VALUES = "Helm values of NVIDIA's DRA driver chart"
#: NVIDIA's driver roots with a layout of their own in dradriver's chart (hostDriver.layout).
LAYOUTS = {"/": "host", "/run/nvidia/driver": "gpu-operator", "/home/kubernetes/bin/nvidia": "gke"}
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
#: dradriver's defaults for the values a migration may set (deploy/helm/dradriver/values.yaml).
OUR_DEFAULTS: dict[str, Any] = {
    "hostDriver.layout": "host",
    "serve.verbosity": 0,
    "serve.gpuShares.count": 4,
    "metrics.port": 8080,
    "metrics.networkPolicy.enabled": True,
    "kubelet.rootDir": DEFAULT_KUBELET_ROOT,
    "priorityClassName": "system-node-critical",
    "claimConfigPolicy.enabled": False,
}

_COMPUTE_DOMAIN_GATES = (
    "HostManagedIMEXDaemon",
    "NodeLocalFabricIPC",
    "IMEXDaemonsWithDNSNames",
    "ComputeDomainCliques",
    "CrashOnNVLinkFabricErrors",
)
_LOGGING_GATES = ("ContextualLogging", "LoggingAlphaOptions", "LoggingBetaOptions")
_PORT = re.compile(r"^[^:]*:(\d+)$")


class _Values(BaseModel):
    """A part of NVIDIA's values: the keys it documents, anything else kept aside (`model_extra`)."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)


class _Image(_Values):
    repository: str | None = None
    tag: str | None = None
    pull_policy: str | None = None


class _ServiceAccount(_Values):
    create: bool | None = None
    annotations: dict[str, str] | None = None
    name: str | None = None


class _Imex(_Values):
    mode: str | None = None
    isolation: str | None = None
    host_socket_path: str | None = None


class _ComputeDomains(_Values):
    enabled: bool | None = None
    imex: _Imex | None = None


class _Toggle(_Values):
    enabled: bool | None = None


class _Resources(_Values):
    gpus: _Toggle | None = None
    compute_domains: _ComputeDomains | None = None


class _PluginMetrics(_Values):
    enabled: bool | None = None
    gpu_http_endpoint: str | None = None
    compute_domain_http_endpoint: str | None = None
    metrics_path: str | None = None


class _GpusContainer(_Values):
    env: list[dict[str, Any]] | None = None
    security_context: dict[str, Any] | None = None
    resources: dict[str, Any] | None = None
    healthcheck_port: int | None = None


class _Containers(_Values):
    init: dict[str, Any] | None = None
    compute_domains: dict[str, Any] | None = None
    gpus: _GpusContainer | None = None


class _KubeletPlugin(_Values):
    metrics: _PluginMetrics | None = None
    priority_class_name: str | None = None
    update_strategy: dict[str, Any] | None = None
    pod_annotations: dict[str, str] | None = None
    pod_security_context: dict[str, Any] | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = None
    affinity: dict[str, Any] | None = None
    kubelet_registrar_directory_path: str | None = None
    kubelet_plugins_directory_path: str | None = None
    containers: _Containers | None = None
    network_policy: _Toggle | None = None


class NvidiaValues(_Values):
    """The top level of NVIDIA's values.yaml."""

    nvidia_driver_root: str | None = None
    nvidia_cdi_hook_path: str | None = Field(None, alias="nvidiaCDIHookPath")
    alt_proc_devices: str | None = None
    mask_nvidia_driver_params: bool | None = None
    name_override: str | None = None
    fullname_override: str | None = None
    namespace_override: str | None = None
    selector_labels_override: dict[str, str] | None = None
    gpu_resources_enabled_override: bool | None = None
    consumable_shares: str | int | None = None
    allow_default_namespace: bool | None = None
    resource_api_version: str | None = None
    image_pull_secrets: list[dict[str, Any]] | None = None
    image: _Image | None = None
    service_account: _ServiceAccount | None = None
    resources: _Resources | None = None
    feature_gates: dict[str, bool] | None = None
    log_verbosity: int | None = None
    webhook: dict[str, Any] | None = None
    controller: dict[str, Any] | None = None
    kubelet_plugin: _KubeletPlugin | None = None
    gpu_driver_config: dict[str, Any] | None = None


#: Top-level keys that mark a document as NVIDIA's values rather than something else.
TOP_LEVEL_KEYS = frozenset(info.alias or name for name, info in NvidiaValues.model_fields.items())


def is_nvidia_values(document: Mapping[str, Any]) -> bool:
    """A document without apiVersion and kind that holds at least one of NVIDIA's top-level values."""
    return "apiVersion" not in document and "kind" not in document and bool(TOP_LEVEL_KEYS & set(document))


@dataclass
class _Run:
    """One migration in progress: NVIDIA's values, what they become, and the record of each step."""

    given: NvidiaValues
    out: Migration
    ours: dict[str, Any]
    #: Our values set so far -> (the NVIDIA value that set it, the value).
    set_by: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def put(self, path: str, target: str, before: Any, after: Any, reason: str) -> None:
        """Set our value `target` (a dotted path); a default of ours is explained, not written."""
        earlier = self.set_by.setdefault(target, (path, after))
        if earlier[1] != after:
            self.refuse(path, f"gives {target} {after!r}, but {earlier[0]} gave it {earlier[1]!r}")
            return
        if OUR_DEFAULTS.get(target, object()) == after:
            reason = f"{reason}; the default of dradriver's chart, not written"
        else:
            node = self.ours
            *parents, leaf = target.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = after
        self.out.change(path, before, after, reason, target=target)

    def drop(self, path: str, before: Any, reason: str) -> None:
        self.out.change(path, before, None, reason)

    def refuse(self, path: str, message: str) -> None:
        self.out.problem(path, message)

    def unknown(self, path: str) -> None:
        self.refuse(
            path,
            "not a value of NVIDIA's chart that migrate knows (a typo, or a newer chart): "
            "no equivalent known",
        )

    @property
    def compute_domains_off(self) -> bool:
        resources = self.given.resources
        domains = resources.compute_domains if resources else None
        return domains is not None and domains.enabled is False

    def compute_domain_setting(self, path: str, before: Any) -> None:
        """A setting of NVIDIA's ComputeDomains: moot once they are off, else nothing can serve it."""
        if self.compute_domains_off:
            self.drop(path, before, "a ComputeDomain setting, and ComputeDomains are off")
        else:
            self.refuse(
                path,
                f"{nvidia.COMPUTE_DOMAINS}; set resources.computeDomains.enabled: false if this "
                "cluster does not use them",
            )


_Rule = Callable[[_Run, str, Any], None]


def _same(target: str, reason: str = "same meaning") -> _Rule:
    def rule(run: _Run, path: str, value: Any) -> None:
        run.put(path, target, value, value, reason)

    return rule


def _drop(reason: str) -> _Rule:
    def rule(run: _Run, path: str, value: Any) -> None:
        run.drop(path, value, reason)

    return rule


def _refuse_unless(empty: Callable[[Any], bool], message: str, reason: str) -> _Rule:
    """Dropped (with `reason`) where `empty(value)`, else a problem."""

    def rule(run: _Run, path: str, value: Any) -> None:
        if empty(value):
            run.drop(path, value, reason)
        else:
            run.refuse(path, message)

    return rule


def _compute_domains(run: _Run, path: str, value: Any) -> None:
    run.compute_domain_setting(path, value)


def _driver_root(run: _Run, path: str, value: str) -> None:
    root = value.rstrip("/") or "/"
    layout = LAYOUTS.get(root)
    if layout == "gpu-operator":
        run.put(
            path,
            "hostDriver.layout",
            value,
            layout,
            "the GPU operator's driver container; the plugin also leaves the node while the operator "
            "upgrades the host driver: hostDriver.gpuOperatorClient",
        )
    elif layout is not None:
        run.put(path, "hostDriver.layout", value, layout, f"the {layout} driver root {root}")
    else:
        run.put(path, "hostDriver.root", value, root, "a driver root of its own, with the host layout")


def _consumable_shares(run: _Run, path: str, value: str | int) -> None:
    text = str(value).strip()
    if text in ("", "disabled"):
        run.drop(path, value, "no consumable shares: dradriver's shares are off by default too")
    elif text == "unlimited":
        run.refuse(
            path,
            "unlimited consumable shares have no equivalent: a dradriver GPU has N shares "
            "(serve.gpuShares.count)",
        )
    elif text == "memory":
        run.put(
            path,
            "serve.gpuShares.enforcement",
            value,
            "unenforced",
            "GPUs shared by memory: dradriver's shares publish memory and computePercent, not held "
            "to them: unenforced; mps holds them with MPS",
        )
    elif text.isdigit() and int(text) > 0:
        run.put(
            path,
            "serve.gpuShares.enforcement",
            value,
            "unenforced",
            "GPUs shared N ways, not held to their share: unenforced; mps holds them with MPS",
        )
        run.put(path, "serve.gpuShares.count", value, int(text), "a share is 1/N of the GPU")
    else:
        run.refuse(path, f"{value!r} is not disabled, memory, unlimited or a positive integer")


def _resource_api_version(run: _Run, path: str, value: str) -> None:
    if value in ("", "resource.k8s.io/v1"):
        run.drop(path, value, "dradriver's chart renders resource.k8s.io/v1, the API of Kubernetes 1.34+")
    else:
        run.refuse(path, f"{value}: dradriver needs Kubernetes 1.34+, which serves resource.k8s.io/v1")


def _verbosity(run: _Run, path: str, value: int) -> None:
    run.put(path, "serve.verbosity", value, value, "the same scale: 4 adds debug events, 6 every gRPC call")


def _gpus_enabled(run: _Run, path: str, value: bool) -> None:
    if value:
        run.drop(path, value, "dradriver always serves GPUs")
    else:
        run.refuse(path, "GPUs off leaves only ComputeDomains, which dradriver does not serve")


def _image_repository(run: _Run, path: str, value: str) -> None:
    run.drop(
        path,
        value,
        "NVIDIA's image; dradriver's is ghcr.io/dradriver/dradriver: set image.repository to a mirror of it",
    )


def _service_account_create(run: _Run, path: str, value: bool) -> None:
    if value:
        run.drop(path, value, "dradriver's chart always makes its service account")
    else:
        run.refuse(path, "dradriver's chart always makes its own service account (its RBAC is bound to it)")


def _update_strategy(run: _Run, path: str, value: dict[str, Any]) -> None:
    if value.get("type") == "OnDelete":
        run.put(path, "updateStrategy", value, {"type": "OnDelete"}, "pods replaced only when deleted")
    else:
        run.drop(
            path,
            value,
            "dradriver rolls with maxSurge 1: the new pod takes over beside the old one, no gap; keep "
            "the chart's updateStrategy",
        )


def _kubelet_dir(suffix: str) -> _Rule:
    def rule(run: _Run, path: str, value: str) -> None:
        trimmed = value.rstrip("/")
        if not trimmed.endswith(f"/{suffix}"):
            run.refuse(
                path,
                f"{value}: not <kubelet root dir>/{suffix}, as dradriver's chart derives it",
            )
            return
        run.put(path, "kubelet.rootDir", value, trimmed.removesuffix(f"/{suffix}"), f"<root>/{suffix}")

    return rule


def _gpu_http_endpoint(run: _Run, path: str, value: str) -> None:
    match = _PORT.match(value)
    if match is None:
        run.refuse(path, f"{value!r}: dradriver's chart takes a port (metrics.port), on every address")
    else:
        run.put(path, "metrics.port", value, int(match.group(1)), "/metrics, /healthz and /readyz")


def _metrics_enabled(run: _Run, path: str, value: bool) -> None:
    run.drop(
        path,
        value,
        "dradriver always serves /metrics (its readiness probe is on that port); "
        "metrics.networkPolicy limits who may scrape",
    )


def _security_context(run: _Run, path: str, value: dict[str, Any]) -> None:
    if value in ({}, {"privileged": True}):
        run.drop(path, value, "dradriver's chart sets the container's securityContext itself")
    else:
        run.refuse(path, "dradriver's chart sets the container's securityContext itself; no value for it")


def _env(run: _Run, path: str, value: list[dict[str, Any]]) -> None:
    for i, item in enumerate(value):
        run.refuse(
            f"{path}[{i}]",
            f"{item.get('name', '(unnamed)')}: an environment variable of NVIDIA's plugin; dradriver's "
            "settings are serve.* (serve.extraEnv for variables of its own)",
        )


#: NVIDIA's webhook settings besides `enabled`: a Deployment, its Service and certificates.
_WEBHOOK_KEYS = frozenset(
    {
        "replicas",
        "servicePort",
        "containerPort",
        "priorityClassName",
        "strategy",
        "podAnnotations",
        "podSecurityContext",
        "nodeSelector",
        "tolerations",
        "affinity",
        "containers",
        "serviceAccount",
        "failurePolicy",
        "tls",
    }
)


def _webhook(run: _Run, path: str, webhook: dict[str, Any]) -> None:
    for key, value in webhook.items():
        at = f"{path}.{key}"
        if key == "enabled" and isinstance(value, bool):
            run.put(
                at,
                "claimConfigPolicy.enabled",
                value,
                value,
                "opaque configs checked at claim creation, by a ValidatingAdmissionPolicy in the API server",
            )
        elif key == "enabled":
            run.refuse(at, f"Input should be a valid boolean (got {value!r})")
        elif key in _WEBHOOK_KEYS:
            run.drop(at, value, "a setting of NVIDIA's webhook pod; dradriver's check runs in the API server")
        else:
            run.unknown(at)


def _feature_gates(run: _Run, path: str, gates: dict[str, bool]) -> None:
    for name, on in gates.items():
        at = f"{path}.{name}"
        if name in ("TimeSlicingSettings", "MPSSupport"):
            run.drop(at, on, "dradriver always takes TimeSlicing and MPS settings in a claim's opaque config")
        elif name == "NVMLDeviceHealthCheck":
            run.drop(
                at,
                on,
                "dradriver always watches GPU health, XID events tainting the device; "
                "serve.healthConfig tunes or turns it off",
            )
        elif name == "DynamicMIG":
            run.put(at, "serve.partitionable", on, on, "MIG devices made when a claim is prepared")
        elif name == "ConsumableShares":
            if on and not run.given.consumable_shares:
                run.refuse(at, "consumable shares need a kind: set consumableShares (memory or N)")
            else:
                run.drop(at, on, "follows consumableShares")
        elif name in ("PassthroughSupport", "DeviceMetadata"):
            _off_or(run, at, on, nvidia.VFIO)
        elif name == "FabricManagerPartitioning":
            _off_or(run, at, on, f"{nvidia.BY_NAME['partition1'].note}: no equivalent")
        elif name == "DRAListTypeAttributes":
            _off_or(run, at, on, "dradriver publishes no list-valued attributes")
        elif name in _COMPUTE_DOMAIN_GATES:
            if on:
                run.compute_domain_setting(at, on)
            else:
                run.drop(at, on, "a ComputeDomain gate, off")
        elif name in _LOGGING_GATES:
            run.drop(at, on, "a logging gate of NVIDIA's Go programs; dradriver logs per serve.logFormat")
        else:
            run.refuse(
                at, "a feature gate of NVIDIA's driver that migrate does not know: no equivalent known"
            )


def _off_or(run: _Run, path: str, on: bool, message: str) -> None:
    if on:
        run.refuse(path, message)
    else:
        run.drop(path, on, "off: nothing to carry over")


def _empty(value: Any) -> bool:
    return value in (None, "", False, {}, [])


_RULES: dict[str, _Rule] = {
    "nvidiaDriverRoot": _driver_root,
    "nvidiaCDIHookPath": _drop("dradriver's CDI specs run no nvidia-cdi-hook"),
    "altProcDevices": _refuse_unless(
        _empty,
        "a stand-in /proc/devices for NVIDIA's mock NVML has no equivalent; test clusters use "
        "hostDriver.layout fake",
        "not set",
    ),
    "maskNvidiaDriverParams": _refuse_unless(
        _empty,
        "masking the host driver's params (for nvkind) has no equivalent; dradriver makes the device "
        "nodes a claim needs only",
        "off",
    ),
    "nameOverride": _same("nameOverride"),
    "fullnameOverride": _same("fullnameOverride"),
    "namespaceOverride": _refuse_unless(
        _empty,
        "dradriver's chart installs into the release namespace: give it as helm install --namespace",
        "not set",
    ),
    "selectorLabelsOverride": _refuse_unless(
        _empty, "dradriver's chart keeps its selector labels (podLabels adds labels)", "not set"
    ),
    "gpuResourcesEnabledOverride": _drop("dradriver serves GPUs without a switch"),
    "consumableShares": _consumable_shares,
    "allowDefaultNamespace": _drop("dradriver's chart installs into whichever namespace is given"),
    "resourceApiVersion": _resource_api_version,
    "imagePullSecrets": _same("imagePullSecrets"),
    "image.repository": _image_repository,
    "image.tag": _drop("NVIDIA's release; empty image.tag is the chart's own version"),
    "image.pullPolicy": _same("image.pullPolicy"),
    "serviceAccount.create": _service_account_create,
    "serviceAccount.annotations": _same("serviceAccount.annotations"),
    "serviceAccount.name": _refuse_unless(
        _empty, "dradriver's chart names its service account itself (its RBAC is bound to it)", "not set"
    ),
    "resources.gpus.enabled": _gpus_enabled,
    "resources.computeDomains.enabled": _refuse_unless(
        lambda value: value is False, nvidia.COMPUTE_DOMAINS, "off: dradriver serves no ComputeDomains"
    ),
    "resources.computeDomains.imex": _compute_domains,
    "featureGates": _feature_gates,
    "logVerbosity": _verbosity,
    "webhook": _webhook,
    "controller": _compute_domains,
    "kubeletPlugin.metrics.enabled": _metrics_enabled,
    "kubeletPlugin.metrics.gpuHttpEndpoint": _gpu_http_endpoint,
    "kubeletPlugin.metrics.computeDomainHttpEndpoint": _compute_domains,
    "kubeletPlugin.metrics.metricsPath": _refuse_unless(
        lambda value: value == "/metrics", "dradriver serves metrics at /metrics only", "the same path"
    ),
    "kubeletPlugin.priorityClassName": _same("priorityClassName"),
    "kubeletPlugin.updateStrategy": _update_strategy,
    "kubeletPlugin.podAnnotations": _same("podAnnotations"),
    "kubeletPlugin.podSecurityContext": _refuse_unless(
        _empty, "dradriver's chart sets the pod's securityContext itself; no value for it", "empty"
    ),
    "kubeletPlugin.nodeSelector": _same("nodeSelector", "added to the GPU node affinity, as NVIDIA's"),
    "kubeletPlugin.tolerations": _same("tolerations", "replaces the chart's, which tolerate every taint"),
    "kubeletPlugin.affinity": _same("affinity", "replaces the chart's GPU node affinity, as NVIDIA's"),
    "kubeletPlugin.kubeletRegistrarDirectoryPath": _kubelet_dir("plugins_registry"),
    "kubeletPlugin.kubeletPluginsDirectoryPath": _kubelet_dir("plugins"),
    "kubeletPlugin.containers.init": _drop("dradriver's pod has no init container"),
    "kubeletPlugin.containers.computeDomains": _compute_domains,
    "kubeletPlugin.containers.gpus.env": _env,
    "kubeletPlugin.containers.gpus.securityContext": _security_context,
    "kubeletPlugin.containers.gpus.resources": _same("resources"),
    "kubeletPlugin.containers.gpus.healthcheckPort": _drop(
        "dradriver's probes call the DRA socket itself, with dradriver healthcheck: no port"
    ),
    "kubeletPlugin.networkPolicy.enabled": _same(
        "metrics.networkPolicy.enabled", "a NetworkPolicy in front of the metrics port"
    ),
    "gpuDriverConfig": _refuse_unless(
        _empty,
        "per-node default GPU configs (PerNodeGPUConfig) have no equivalent: put the config in the claims",
        "empty",
    ),
}


def migrate_values(values: Mapping[str, Any], *, driver: str = DEFAULT_DRIVER_NAME) -> Migration:
    """NVIDIA's Helm values as dradriver's; the Migration's one output is our values (empty when
    nothing differs from our chart's defaults), none when there is a problem."""
    out = Migration(values)
    try:
        given = NvidiaValues.model_validate(dict(values))
    except ValidationError as err:
        for error in err.errors():
            where = ".".join(str(part) for part in error["loc"])
            out.problem(where, f"{error['msg']} (got {error['input']!r})")
        return out
    ours: dict[str, Any] = {}
    if driver != DEFAULT_DRIVER_NAME:
        ours["driverName"] = driver
    run = _Run(given, out, ours)
    _walk(run, given, "")
    if not out.problems:
        out.outputs.append(ours)
    return out


def _walk(run: _Run, model: _Values, prefix: str) -> None:
    for name, info in type(model).model_fields.items():
        if name not in model.model_fields_set:
            continue
        path = prefix + (info.alias or name)
        value = getattr(model, name)
        rule = _RULES.get(path)
        if value is None:
            run.drop(path, None, "null: NVIDIA's default")
        elif rule is not None:
            rule(
                run,
                path,
                value.model_dump(by_alias=True, exclude_unset=True) if isinstance(value, _Values) else value,
            )
        else:
            assert isinstance(value, _Values), f"{path}: a value without a rule"
            _walk(run, value, f"{path}.")
    for key in model.model_extra or {}:
        run.unknown(f"{prefix}{key}")
