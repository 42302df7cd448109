"""dradriver.offline.migrate on single objects: what each field becomes, and what is refused with its path."""

from __future__ import annotations

from typing import Any

import yaml

from dradriver.offline.allocation.validation import validate_object
from dradriver.offline.migrate import Migration, migrate

DRIVER = "gpu.dradriver.dev"


def one(text: str, *more: str) -> Migration:
    objects = [yaml.safe_load(t) for t in (text, *more)]
    return migrate(objects, driver=DRIVER)[0]


def problems(migration: Migration) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in migration.problems]


def claim(requests: str, *, config: str = "", constraints: str = "", version: str = "v1") -> str:
    return f"""
apiVersion: resource.k8s.io/{version}
kind: ResourceClaim
metadata: {{name: c, namespace: default}}
spec:
  devices:
    requests: {requests}
    config: {config or "[]"}
    constraints: {constraints or "[]"}
"""


def gpu_config(parameters: str, requests: str = "[gpu]") -> str:
    return f"[{{requests: {requests}, opaque: {{driver: gpu.nvidia.com, parameters: {parameters}}}}}]"


GPU = "[{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]"
MIG = "[{name: mig, exactly: {deviceClassName: mig.nvidia.com}}]"


def test_nvidias_builtin_classes_are_replaced_by_ours() -> None:
    result = one("{apiVersion: resource.k8s.io/v1, kind: DeviceClass, metadata: {name: mig.nvidia.com}}")
    assert (result.outcome, result.replaced_by, result.outputs) == ("replaced", "mig.gpu.dradriver.dev", [])
    vfio = one("{apiVersion: resource.k8s.io/v1, kind: DeviceClass, metadata: {name: vfio.gpu.nvidia.com}}")
    assert problems(vfio) == [
        ("metadata.name", "VFIO passthrough has no equivalent in dradriver (GPUs are used through CDI)")
    ]


def test_a_custom_class_is_renamed_with_the_claims_that_use_it() -> None:
    cls = """
apiVersion: resource.k8s.io/v1beta1
kind: DeviceClass
metadata: {name: a100.gpu.nvidia.com}
spec:
  selectors:
  - cel:
      expression: >-
        device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'
"""
    user = claim("[{name: gpu, exactly: {deviceClassName: a100.gpu.nvidia.com}}]")
    migrated_class, migrated_claim = migrate([yaml.safe_load(cls), yaml.safe_load(user)], driver=DRIVER)
    (out,) = migrated_class.outputs
    assert out["apiVersion"] == "resource.k8s.io/v1"
    assert out["metadata"]["name"] == "a100.gpu.dradriver.dev"
    assert out["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.dradriver.dev' && device.attributes['gpu.dradriver.dev'].type == 'gpu'"
    )
    assert migrated_claim.outputs[0]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == (
        "a100.gpu.dradriver.dev"
    )
    assert validate_object(out, DRIVER) == []


def test_an_nvidia_class_migrate_does_not_know_is_a_problem() -> None:
    result = one(claim("[{name: ch, exactly: {deviceClassName: imex.nvidia.com}}]"))
    assert problems(result) == [
        (
            "spec.devices.requests[0].exactly.deviceClassName",
            "imex.nvidia.com is a DeviceClass of NVIDIA's driver that dradriver does not ship; if it is your "
            "own, migrate it together with this claim",
        )
    ]
    assert result.outputs == []


def test_v1beta1_claims_become_v1_with_first_available_kept() -> None:
    requests = """[{name: gpu, deviceClassName: gpu.nvidia.com, count: 2,
                   selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].minor < 4"}}]},
                  {name: any, firstAvailable: [{name: mig, deviceClassName: mig.nvidia.com},
                                               {name: gpu, deviceClassName: gpu.nvidia.com}]}]"""
    result = one(claim(requests, version="v1beta1"))
    (out,) = result.outputs
    assert out["apiVersion"] == "resource.k8s.io/v1"
    assert out["spec"]["devices"]["requests"] == [
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu.dradriver.dev",
                "count": 2,
                "selectors": [{"cel": {"expression": "device.attributes['gpu.dradriver.dev'].minor < 4"}}],
            },
        },
        {
            "name": "any",
            "firstAvailable": [
                {"name": "mig", "deviceClassName": "mig.gpu.dradriver.dev"},
                {"name": "gpu", "deviceClassName": "gpu.dradriver.dev"},
            ],
        },
    ]
    assert validate_object(out, DRIVER) == []
    # Paths name the input's fields.
    assert "spec.devices.requests[0].deviceClassName" in [c.path for c in result.changes]


def test_constraints_follow_the_attribute_mapping() -> None:
    result = one(claim(GPU, constraints="[{matchAttribute: gpu.nvidia.com/productName}]"))
    assert result.outputs[0]["spec"]["devices"]["constraints"] == [
        {"matchAttribute": "gpu.dradriver.dev/productName"}
    ]
    mixed = one(
        claim(
            "[{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}},"
            " {name: nic, exactly: {deviceClassName: rdma.example.com}}]",
            constraints="[{requests: [gpu, nic], matchAttribute: gpu.nvidia.com/productName}]",
        )
    )
    ((path, message),) = problems(mixed)
    assert path == "spec.devices.constraints[0].matchAttribute"
    assert "also covers requests ['nic'] of other drivers" in message


def test_a_gpu_and_a_nic_aligned_on_the_standard_numa_node_are_translated() -> None:
    """resource.kubernetes.io/numaNode is published by both: NVIDIA's claim keeps its constraint."""
    result = one(
        claim(
            "[{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}},"
            " {name: nic, exactly: {deviceClassName: rdma.example.com}}]",
            constraints="[{requests: [gpu, nic], matchAttribute: resource.kubernetes.io/numaNode}]",
        )
    )
    assert problems(result) == []
    spec = result.outputs[0]["spec"]["devices"]
    assert spec["constraints"] == [
        {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/numaNode"}
    ]
    assert spec["requests"][1] == {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com"}}


def test_health_taint_tolerations() -> None:
    requests = """[{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, tolerations: [
        {key: gpu.nvidia.com/xid, operator: Equal, value: "79", effect: NoSchedule},
        {key: gpu.nvidia.com/gpu-lost, operator: Exists},
        {key: gpu.nvidia.com/unmonitored, operator: Exists},
        {key: example.com/other, operator: Exists}]}}]"""
    result = one(claim(requests))
    assert result.outputs[0]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] == [
        {"key": "gpu.dradriver.dev/unhealthy", "operator": "Equal", "value": "79", "effect": "NoSchedule"},
        {"key": "gpu.dradriver.dev/unhealthy", "operator": "Equal", "value": "gpu-lost"},
        {"key": "example.com/other", "operator": "Exists"},
    ]


def test_gpu_config_fields() -> None:
    parameters = """{apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig,
        sharing: {strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: 50,
        defaultPinnedDeviceMemoryLimit: 10Gi, multiUser: false,
        defaultPerDevicePinnedMemoryLimit: {GPU-0d8c7c1e-0000-0000-0000-000000000000: 20Gi}}}}"""
    result = one(claim(GPU, config=gpu_config(parameters)))
    assert problems(result) == []
    config = result.outputs[0]["spec"]["devices"]["config"][0]
    assert config == {
        "requests": ["gpu"],
        "opaque": {
            "driver": "gpu.dradriver.dev",
            "parameters": {
                "apiVersion": "gpu.dradriver.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {
                    "strategy": "MPS",
                    "mps": {
                        "defaultActiveThreadPercentage": 50,
                        "defaultPinnedDeviceMemoryLimit": "10Gi",
                        "perDevicePinnedMemoryLimit": {"GPU-0d8c7c1e-0000-0000-0000-000000000000": "20Gi"},
                    },
                },
            },
        },
    }
    assert validate_object(result.outputs[0], DRIVER) == []


def test_configs_without_an_equivalent() -> None:
    where = "spec.devices.config[0].opaque.parameters"
    nv = "apiVersion: resource.nvidia.com/v1beta1"

    def mps(fields: str) -> str:
        return f"{{{nv}, kind: GpuConfig, sharing: {{strategy: MPS, mpsConfig: {{{fields}}}}}}}"

    cases: list[tuple[str, str, str, str]] = [
        (GPU, mps("multiUser: true"), f"{where}.sharing.mpsConfig.multiUser", "multi-user MPS daemon"),
        (GPU, mps("defaultPerDevicePinnedMemoryLimit: {'0': 1Gi}"),
         f"{where}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]", "key by GPU UUID"),
        (GPU, mps("defaultActiveThreadPercentage: 0"),
         f"{where}.sharing.mps.defaultActiveThreadPercentage", "greater than or equal to 1"),
        (GPU, f"{{{nv}, kind: GpuConfig, sharing: {{strategy: TimeSlicing, extra: 1}}}}",
         f"{where}.sharing.extra", "Extra inputs are not permitted"),
        (MIG, f"{{{nv}, kind: MigDeviceConfig, sharing: {{strategy: TimeSlicing}}}}",
         f"{where}.sharing.strategy", "time-slicing on MIG devices has no equivalent"),
        (GPU, f"{{{nv}, kind: VfioDeviceConfig, iommu: {{}}}}", f"{where}.kind", "VFIO"),
        (GPU, "{apiVersion: resource.nvidia.com/v1alpha1, kind: GpuConfig}",
         f"{where}.apiVersion", "is not NVIDIA's resource.nvidia.com/v1beta1"),
    ]  # fmt: skip
    for requests, parameters, path, message in cases:
        result = one(claim(requests, config=gpu_config(parameters, "[gpu]" if requests == GPU else "[mig]")))
        assert any(p == path and message in m for p, m in problems(result)), (parameters, problems(result))
        assert result.outputs == []


def test_other_drivers_configs_are_left_alone_and_compute_domains_refused() -> None:
    other = "[{opaque: {driver: net.example.com, parameters: {mtu: 9000}}}]"
    result = one(claim(GPU, config=other))
    assert result.outputs[0]["spec"]["devices"]["config"] == [
        {"opaque": {"driver": "net.example.com", "parameters": {"mtu": 9000}}}
    ]
    cd = "[{opaque: {driver: compute-domain.nvidia.com, parameters: {kind: ComputeDomainChannelConfig}}}]"
    assert problems(one(claim(GPU, config=cd)))[0][0] == "spec.devices.config[0].opaque.driver"


def pod(spec: str, kind: str = "Pod") -> str:
    return f"{{apiVersion: v1, kind: {kind}, metadata: {{name: p, namespace: team}}, spec: {spec}}}"


def test_device_plugin_limits_become_a_template_per_container() -> None:
    spec = """{initContainers: [{name: warm, image: x, resources: {limits: {nvidia.com/gpu: 1}}}],
               containers: [{name: a, image: x,
                             resources: {limits: {nvidia.com/gpu: 2, nvidia.com/mig-1g.10gb: 1, cpu: 1}}},
                            {name: b, image: x, resources: {limits: {nvidia.com/gpu: 0}}},
                            {name: c, image: x}]}"""
    result = one(pod(spec))
    warm, a, workload = result.outputs
    assert [t["metadata"] for t in (warm, a)] == [
        {"name": "p-warm-gpus", "namespace": "team"},
        {"name": "p-a-gpus", "namespace": "team"},
    ]
    assert a["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev", "count": 2}},
        {
            "name": "mig-1g-10gb",
            "exactly": {
                "deviceClassName": "mig.gpu.dradriver.dev",
                "selectors": [
                    {"cel": {"expression": 'device.attributes["gpu.dradriver.dev"].profile == "1g.10gb"'}}
                ],
            },
        },
    ]
    spec_out: dict[str, Any] = workload["spec"]
    assert spec_out["resourceClaims"] == [
        {"name": "warm-gpus", "resourceClaimTemplateName": "p-warm-gpus"},
        {"name": "a-gpus", "resourceClaimTemplateName": "p-a-gpus"},
    ]
    assert spec_out["containers"][0]["resources"] == {"limits": {"cpu": 1}, "claims": [{"name": "a-gpus"}]}
    assert spec_out["containers"][1]["resources"] == {}  # zero GPUs: nothing to ask for
    assert spec_out["initContainers"][0]["resources"] == {"claims": [{"name": "warm-gpus"}]}
    for template in (warm, a):
        assert validate_object(template, DRIVER) == []


def test_workload_kinds_keep_their_pod_template_paths() -> None:
    cronjob = one(
        pod(
            "{jobTemplate: {spec: {template: {spec: {containers: ["
            "{name: t, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]}}}}}",
            kind="CronJob",
        )
    )
    template, job = cronjob.outputs
    assert template["metadata"]["name"] == "p-t-gpus"
    assert job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["resourceClaims"] == [
        {"name": "t-gpus", "resourceClaimTemplateName": "p-t-gpus"}
    ]


def test_gfd_selectors_that_cannot_move_into_a_claim() -> None:
    on_claims = pod(
        "{nodeSelector: {nvidia.com/gpu.product: Tesla-T4},"
        " resourceClaims: [{name: g, resourceClaimTemplateName: t}],"
        " containers: [{name: a, image: x, resources: {claims: [{name: g}]}}]}"
    )
    assert "put the selectors into the CEL selectors" in problems(one(on_claims))[0][1]
    preferred = pod(
        "{affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: ["
        "{weight: 1, preference: "
        "{matchExpressions: [{key: nvidia.com/gpu.product, operator: In, values: [Tesla-T4]}]}}]}},"
        " containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]}"
    )
    assert "firstAvailable" in problems(one(preferred))[0][1]
    mixed_terms = pod(
        "{affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: ["
        "{matchExpressions: [{key: nvidia.com/gpu.product, operator: In, values: [Tesla-T4]}]},"
        "{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [n1]}]}]}}},"
        " containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]}"
    )
    assert "terms are ORed" in problems(one(mixed_terms))[0][1]


def test_names_that_would_collide_are_problems() -> None:
    existing = (
        "{apiVersion: resource.k8s.io/v1, kind: ResourceClaimTemplate,"
        " metadata: {name: p-a-gpus, namespace: team}, spec: {spec: {devices: {requests: []}}}}"
    )
    workload = pod("{containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]}")
    result = migrate([yaml.safe_load(existing), yaml.safe_load(workload)], driver=DRIVER)[1]
    assert problems(result) == [
        ("spec.containers[0]", "a ResourceClaimTemplate 'p-a-gpus' already exists in this input")
    ]


def test_kinds_migrate_does_not_know_are_checked_for_nvidia_names() -> None:
    mpijob = """{apiVersion: kubeflow.org/v2beta1, kind: MPIJob, metadata: {name: j},
        spec: {mpiReplicaSpecs: {Worker: {template: {spec: {containers: [
        {name: w, image: x, resources: {limits: {nvidia.com/gpu: 2}}}]}}}}}}"""
    ((path, message),) = problems(one(mpijob))
    assert path == "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].resources.limits[nvidia.com/gpu]"
    assert "rewrite its pod templates" in message
    config_map = "{apiVersion: v1, kind: ConfigMap, metadata: {name: m}, data: {driver: gpu.nvidia.com}}"
    assert problems(one(config_map)) == [
        ("data.driver", "'gpu.nvidia.com' names NVIDIA's driver in a field migrate does not translate")
    ]
    plain = yaml.safe_load("{apiVersion: v1, kind: ConfigMap, metadata: {name: m}, data: {a: b}}")
    unchanged = migrate([plain], driver=DRIVER)[0]
    assert (unchanged.outcome, unchanged.outputs) == ("unchanged", [plain])


def test_an_extended_resource_mapped_by_a_class_of_the_input_stays() -> None:
    cls = """{apiVersion: resource.k8s.io/v1, kind: DeviceClass, metadata: {name: mig-1g-12gb.gpu.nvidia.com},
              spec: {extendedResourceName: nvidia.com/mig-1g.12gb, selectors: [{cel: {expression:
              "device.driver == 'gpu.nvidia.com' &&
               device.attributes['gpu.nvidia.com'].profile == '1g.12gb'"}}]}}"""
    workload = pod("{containers: [{name: a, image: x, resources: {limits: {nvidia.com/mig-1g.12gb: 1}}}]}")
    migrated_class, migrated_pod = migrate([yaml.safe_load(cls), yaml.safe_load(workload)], driver=DRIVER)
    assert migrated_class.outputs[0]["metadata"]["name"] == "mig-1g-12gb.gpu.dradriver.dev"
    assert migrated_class.outputs[0]["spec"]["extendedResourceName"] == "nvidia.com/mig-1g.12gb"
    assert migrated_pod.outcome == "unchanged"


def test_classic_dra_and_compute_domains_are_refused() -> None:
    classic = (
        "{apiVersion: resource.k8s.io/v1alpha2, kind: ResourceClaim, metadata: {name: c},"
        " spec: {resourceClassName: gpu.nvidia.com}}"
    )
    assert "classic DRA" in problems(one(classic))[0][1]
    parameters = (
        "{apiVersion: gpu.resource.nvidia.com/v1alpha1, kind: GpuClaimParameters, metadata: {name: p}}"
    )
    assert problems(one(parameters))[0][0] == "apiVersion"
    domain = "{apiVersion: resource.nvidia.com/v1beta1, kind: ComputeDomain, metadata: {name: d}}"
    assert problems(one(domain)) == [
        ("kind", "ComputeDomains (multi-node NVLink/IMEX) have no equivalent in dradriver")
    ]
