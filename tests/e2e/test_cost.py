"""Cost per namespace, proven with a real Prometheus on the real cluster: the Debian `prometheus`
binary, run here with deploy/monitoring's rule files, scrapes the `fake` plugin pod every second
while pods of two namespaces run to completion; the namespace GPU-hours and the dcgm-compatible
series it computes match each claim's allocation (prepare to unprepare, from the plugin's log)
within one scrape plus one telemetry interval per pod; every rule evaluates and every dashboard
query is answered."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.plugin import DRIVER, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import wait_pods, wait_unprepared
from tests.helpers import free_port
from tests.telemetry.monitoring import RULE_FILES, dashboard_queries, tool

pytestmark = pytest.mark.cluster

SCRAPE_SECONDS = 1.0
TELEMETRY_SECONDS = 0.25
#: The devices' SM utilisation while the pods run, set on every fake GPU.
UTILIZATION = 40
#: Namespace -> its pods and how long each runs (s).
WORK = {"cost-a": {"a1": 6, "a2": 10}, "cost-b": {"b1": 8}}


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for namespace, pods in WORK.items():
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        docs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpu", "namespace": namespace},
                "spec": {
                    "spec": {
                        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
                    }
                },
            }
        )
        for name, seconds in pods.items():
            container = {"name": "app", "image": "busybox:1.37", "command": ["sleep", str(seconds)]}
            docs.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "restartPolicy": "Never",
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                        "containers": [container | {"resources": {"claims": [{"name": "gpu"}]}}],
                    },
                }
            )
    return docs


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        """The `data` of an API answer; a 400 (a query that does not parse) fails with its error."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{path} {params}: HTTP {err.code}: {err.read().decode()[:300]}") from None
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def value(self, expr: str, **labels: str) -> float | None:
        found = [float(r["value"][1]) for r in self.query(expr) if labels.items() <= r["metric"].items()]
        return found[0] if len(found) == 1 else None


@contextmanager
def prometheus(work: Path, target: str) -> Iterator[Prometheus]:
    """The Debian binary scraping `target` every second, evaluating the rules every second."""
    binary = tool("prometheus")
    config = {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS:g}s", "evaluation_interval": f"{SCRAPE_SECONDS:g}s"},
        "rule_files": [str(path) for path in RULE_FILES],
        "scrape_configs": [{"job_name": "dradriver", "static_configs": [{"targets": [target]}]}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        wait(lambda: _answers(server), 30, f"prometheus ready (log: {work / 'prometheus.log'})")
        wait(lambda: server.value('up{job="dradriver"}') == 1, 30, "prometheus scraping the plugin pod")
        yield server
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _answers(server: Prometheus) -> bool:
    try:
        with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def allocations(log: str) -> dict[str, float]:
    """Claim (`namespace/name`) -> seconds from its "prepared" to its "unprepared" log line."""
    times: dict[str, dict[str, float]] = {}
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") in {"prepared", "unprepared"}:
            at = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
            times.setdefault(entry["claim"], {})[entry["event"]] = at
    return {claim: t["unprepared"] - t["prepared"] for claim, t in times.items() if len(t) == 2}


def run_seconds(pod: dict[str, Any]) -> float:
    """What the container ran, as its status says (whole seconds)."""
    (status,) = pod["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    started, finished = (
        datetime.fromisoformat(terminated[k].replace("Z", "+00:00")) for k in ("startedAt", "finishedAt")
    )
    return (finished - started).total_seconds()


def test_a_real_prometheus_computes_gpu_hours_per_namespace_as_the_claims_were_held(
    real_cluster: RealCluster, fake_deployment: Deployment, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    tool("prometheus")
    real_cluster.require_local("Prometheus on this host scrapes the plugin pod's IP")
    fake_deployment.set_env(DRADRIVER_TELEMETRY_INTERVAL=f"{TELEMETRY_SECONDS:g}")
    devices = fake_deployment.devices()
    # The fake telemetry outlives the deployment (the node's state directory): idle again after.
    request.addfinalizer(lambda: fake_deployment.set_utilization(devices, 0))
    fake_deployment.set_utilization(devices, UTILIZATION)
    (plugin,) = fake_deployment.pods()
    docs = documents()
    with prometheus(tmp_path, f"{plugin['status']['podIP']}:8080") as server:
        try:
            real_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
            pods = wait_pods(
                real_cluster, docs, lambda p: p["status"].get("phase") == "Succeeded", 180, "the pods done"
            )
            wait_unprepared(fake_deployment)
            claims = {
                (p["metadata"]["namespace"], p["metadata"]["name"]): p["status"]["resourceClaimStatuses"][0][
                    "resourceClaimName"
                ]
                for p in pods
            }

            def logged() -> dict[str, float] | None:
                # An "unprepared" line follows the state wait_unprepared reads (it waits for the answer).
                held = allocations(fake_deployment.all_logs())
                return held if all(f"{ns}/{claim}" in held for (ns, _), claim in claims.items()) else None

            held = wait(logged, 30, "every claim's prepared and unprepared lines")
            truth = {key: held[f"{key[0]}/{claim}"] for key, claim in claims.items()}

            # Await the scrape that found the claims' series gone, then a rule evaluation after it.
            cost = 'dradriver_gpu_allocated_device_seconds_total{claim_namespace=~"cost-.*"}'
            wait(lambda: server.query(cost) == [], 30, "the claims' series gone from Prometheus")
            gone = time.time()  # Prometheus runs on this host: one clock
            hours = "namespace:dradriver_gpu_allocated_hours:increase1d"
            wait(
                lambda: (server.value(f"timestamp({hours})", namespace="cost-a") or 0) > gone,
                30,
                "a rule evaluation",
            )

            tolerance = SCRAPE_SECONDS + TELEMETRY_SECONDS
            figures: dict[str, Any] = {}
            for namespace, names in WORK.items():
                seconds = sum(truth[(namespace, n)] for n in names)
                allocated = (server.value(hours, namespace=namespace) or 0) * 3600
                busy = (
                    server.value("namespace:dradriver_gpu_busy_hours:increase1d", namespace=namespace) or 0
                ) * 3600
                efficiency = server.value("namespace:dradriver_gpu_efficiency:ratio1d", namespace=namespace)
                ran = sum(run_seconds(p) for p in pods if p["metadata"]["namespace"] == namespace)
                figures[namespace] = {
                    "held_s": round(seconds, 2),
                    "containers_ran_s": ran,
                    "prometheus_allocated_s": round(allocated, 2),
                    "prometheus_busy_s": round(busy, 2),
                    "efficiency": efficiency,
                }
                assert abs(allocated - seconds) <= tolerance * len(names), (namespace, figures)
                assert abs(busy - seconds * UTILIZATION / 100) <= tolerance * len(names), (namespace, figures)
                assert efficiency == pytest.approx(UTILIZATION / 100, abs=0.05), (namespace, figures)
                assert allocated >= ran - len(names)  # a claim is held at least while its pod runs

            # The dcgm-compatible series: a pod's, at its utilisation, for as long as its claim was held.
            for (namespace, name), seconds in truth.items():
                selector = f'DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}", pod="{name}"}}[10m]'
                (series,) = server.query(selector)
                stamps = [float(t) for t, _ in series["values"]]
                assert {float(v) for _, v in series["values"]} == {UTILIZATION}
                lasted = stamps[-1] - stamps[0] + SCRAPE_SECONDS
                figures[f"{namespace}/{name}"] = {
                    "held_s": round(seconds, 2),
                    "dcgm_series_s": round(lasted, 2),
                }
                assert abs(lasted - seconds) <= tolerance, (name, figures)

            rules = [r for g in server.get("/api/v1/rules")["groups"] for r in g["rules"]]
            assert len(rules) == sum(
                len(g["rules"]) for p in RULE_FILES for g in yaml.safe_load(p.read_text())["groups"]
            )
            assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
            for expr in dashboard_queries():
                server.query(expr)  # a query Prometheus cannot parse is a 400
            print(f"cost figures: {json.dumps(figures)}")  # bench/RESULTS.md, issue 39
        finally:
            real_cluster.kubectl(
                "delete", "-f", "-", "--wait=true", "--ignore-not-found", stdin=yaml.safe_dump_all(docs)
            )
