"""The release's packaged chart with the real Helm on the real cluster, as an operator runs it:
`helm install` with the fake GPUs, an example claim Running and `helm test` passing; `helm
upgrade` to a new image tag, a surge rollout under a stream of pods with claims in which no pod
fails to start; `helm rollback`; and `helm uninstall`, after which no object of the chart is
left, the node's ResourceSlices included. Prints the figures of bench/RESULTS.md."""

from __future__ import annotations

import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from scripts.build_image import IMAGE_REPOSITORY, version
from tests.e2e.plugin import DAEMONSET, DRIVER, NAMESPACE, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.test_upgrade import PodStream, claim_template, phase  # noqa: F401 (a fixture)
from tests.e2e.workloads import wait_unprepared
from tests.helm.chart import RELEASE, helm_binary, isolated_env, render, stderr_lines
from tests.release.release import ReleaseDirectory

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/claims/single-gpu.yaml"
FAKE = {"hostDriver": {"layout": "fake"}}
#: The profile the fake layout publishes by default (values.yaml fakeGpus.profile): 8 GPUs.
FAKE_DEVICES = 8
UPGRADE_TAG = f"{version()}-helm-upgrade"


def helm(cluster: RealCluster, *args: str, timeout: float = 300) -> str:
    env = isolated_env() | {"KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{stderr_lines(done.stderr)}\n{done.stdout}"
    return done.stdout


def left_behind(cluster: RealCluster, objects: list[dict[str, Any]]) -> list[str]:
    """Which of these objects still exist (each looked up by kind and name)."""
    by_namespace: dict[str, list[str]] = defaultdict(list)
    for obj in objects:
        by_namespace[obj["metadata"].get("namespace", NAMESPACE)].append(
            f"{obj['kind']}/{obj['metadata']['name']}"
        )
    found: list[str] = []
    for namespace, names in by_namespace.items():
        done = cluster.kubectl("-n", namespace, "get", *names, "--ignore-not-found", "-o", "name")
        found += done.stdout.split()
    return found


def plugin_image(cluster: RealCluster) -> str:
    daemonset = cluster.get_json("daemonset", "-n", NAMESPACE, DAEMONSET)
    return str(daemonset["spec"]["template"]["spec"]["containers"][0]["image"])  # type: ignore[index]


@pytest.mark.usefixtures("claim_template")
def test_install_test_upgrade_rollback_uninstall(
    real_cluster: RealCluster, release: ReleaseDirectory
) -> None:
    local = real_cluster.require_local("the upgrade's second image tag is tagged in the node's containerd")
    chart = str(release.chart)
    client = real_cluster.client()
    deployment = Deployment(real_cluster, release, "helm")
    ours = render(FAKE, chart=release.chart, tests=True)
    real_cluster.kubectl("create", "namespace", NAMESPACE)
    real_cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
    real_cluster.log_sources["plugin"] = deployment.logs
    try:
        # Install: the node's slices, then the example's pod Running on a fake GPU.
        started = time.monotonic()
        # --wait, as an operator installs: the plugin pod Ready, i.e. registered with the kubelet
        # (slices alone can be published a moment before the kubelet has registered the plugin).
        helm(
            real_cluster,
            *("install", RELEASE, chart, "-n", NAMESPACE, "--set", "hostDriver.layout=fake"),
            *("--wait", "--timeout", "180s"),
            timeout=240,
        )
        wait(lambda: len(deployment.devices()) == FAKE_DEVICES, 180, "the node's slices published")
        slices_after = time.monotonic() - started
        real_cluster.kubectl("apply", "-f", str(EXAMPLE))
        wait(lambda: phase(client, "single-gpu") == "Running", 180, "the example's pod Running")
        running_after = time.monotonic() - started
        assert plugin_image(real_cluster) == release.manifest["image"]["pinned"]
        helm(real_cluster, "test", RELEASE, "-n", NAMESPACE, "--timeout", "180s", timeout=240)

        # Upgrade to another tag of the image: a surge rollout while pods with claims keep coming.
        local.ctr(
            "images", "tag", "--force", f"{IMAGE_REPOSITORY}:{version()}", f"{IMAGE_REPOSITORY}:{UPGRADE_TAG}"
        )
        old_pod = deployment.pod()
        stream = PodStream(client, interval=1.0)
        stream.start()
        try:
            wait(lambda: len(stream.names) >= 3, 60, "the stream to get going")
            started = time.monotonic()
            helm(
                real_cluster,
                *("upgrade", RELEASE, chart, "-n", NAMESPACE, "--reuse-values"),
                *("--set", f"image.tag={UPGRADE_TAG}", "--set", "image.digest="),
            )

            most_plugin_pods = deployment.wait_replaced(old_pod)
            upgraded_after = time.monotonic() - started
            count = len(stream.names)
            wait(lambda: len(stream.names) >= count + 3, 60, "the stream to go on after the upgrade")
        finally:
            stream.stop()
        stream.assert_all_prepared(real_cluster)
        assert most_plugin_pods == 2, "the upgrade did not surge"
        assert plugin_image(real_cluster) == f"{IMAGE_REPOSITORY}:{UPGRADE_TAG}"
        keeper = client.request("GET", "/api/v1/namespaces/default/pods/single-gpu")
        assert keeper["status"]["phase"] == "Running"
        assert keeper["status"]["containerStatuses"][0]["restartCount"] == 0

        # Rollback to the installed revision: the pinned image again.
        helm(real_cluster, "rollback", RELEASE, "1", "-n", NAMESPACE, "--wait", "--timeout", "180s")
        deployment.wait_ready()
        assert plugin_image(real_cluster) == release.manifest["image"]["pinned"]

        real_cluster.kubectl("delete", "-f", str(EXAMPLE), "--wait=true", "--timeout=120s")
        wait_unprepared(deployment, timeout=120)
        print(
            f"helm install -> {FAKE_DEVICES} devices published: {slices_after:.1f} s; -> the example's pod "
            f"Running: {running_after:.1f} s; helm upgrade -> new plugin pod serving, old gone: "
            f"{upgraded_after:.1f} s ({len(stream.names)} pods with claims streamed, none failed)"
        )
    finally:
        real_cluster.log_sources.pop("plugin", None)
        real_cluster.kubectl("delete", "-f", str(EXAMPLE), "--ignore-not-found", "--wait=true", check=False)
        try:
            helm(real_cluster, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "180s")
            # Nothing of ours stays: every object the chart renders, and (the kubelet wipes a
            # driver's slices 30 s after its plugin is gone for good) the node's ResourceSlices.
            assert left_behind(real_cluster, ours) == []
            wait(lambda: deployment.slices() == [], 120, f"no ResourceSlice of {DRIVER} left")
        finally:
            real_cluster.kubectl(
                "delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", check=False
            )
