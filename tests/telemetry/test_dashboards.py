"""deploy/monitoring: the Grafana dashboard and the rule files (dcgm-exporter compatibility, cost,
alerts) name only series that serve exports, with labels it sets."""

from __future__ import annotations

import json
import re

import yaml
from prometheus_client.parser import text_string_to_metric_families

from dradriver.metrics import StateCollector
from dradriver.telemetry.cost import CostTracker
from dradriver.telemetry.idle import IdlePolicy, IdleTracker
from dradriver.telemetry.model import DeviceSample, Holder, PodRef, ProcessSample, Reading, Target, pod_shares
from dradriver.telemetry.sampler import Snapshot, render
from tests.telemetry.monitoring import MONITORING

#: A series name, not a part of a recording rule's `level:metric:operations` name.
NAME = re.compile(r"(?<![\w:])(dradriver_[a-z_]+)(?![\w:])")
SELECTOR = re.compile(r"(?<![\w:])(dradriver_[a-z_]+)\{([^}]*)\}")
LABELS = re.compile(r'\b([a-z_]+)\s*(?:=~|!=|=)\s*"')


def exported() -> dict[str, set[str]]:
    """Every series name serve's telemetry can export, with its label names."""
    pod = PodRef("ml", "p", "0f3a5a54-5d9c-4d3e-9b1a-00000000000a")
    holder = Holder("ml", "c", "uid", (pod,), "mps")
    sample = DeviceSample(
        sm_util_percent=1.0,
        memory_util_percent=1.0,
        fb_used_bytes=1,
        fb_total_bytes=2,
        power_watts=1.0,
        temperature_celsius=1.0,
        sm_clock_hz=1.0,
        memory_clock_hz=1.0,
        throttle_reasons=frozenset({"gpu_idle"}),
        ecc_corrected=0,
        ecc_uncorrected=0,
        nvlink_up=(True,),
        processes=(ProcessSample(7, 1, 1.0),),
    )
    reading = Reading(Target("gpu-0", "GPU-0", "GPU-0", "gpu"), sample, [holder])
    reading.shares = pod_shares(sample, [holder], {7: pod.uid}.get)
    tracker = IdleTracker(IdlePolicy(50, 0))
    tracker.update(0, [reading])

    costs, _ = CostTracker({}).update(1.0, [reading])
    text = render(Snapshot(1.0, 0.01, [reading], costs), tracker.idle(1)).decode()
    found: dict[str, set[str]] = {}
    state = StateCollector(
        devices=lambda: [("gpu", "healthy")], prepared_claims=lambda: 1, registered=lambda: True
    )
    for family in [*state.collect(), *text_string_to_metric_families(text)]:
        for s in family.samples:
            found.setdefault(s.name, set()).update(s.labels)
    return found


def check(text: str, where: str) -> None:
    series = exported()
    names = set(NAME.findall(text))
    assert names, f"{where} names no dradriver series"
    assert names <= set(series), f"{where}: not exported: {sorted(names - set(series))}"
    every_label = set().union(*series.values()) | {"instance", "job", "__name__"}
    assert set(LABELS.findall(text)) <= every_label, where


def test_the_grafana_dashboard_queries_exported_series() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) == len(dashboard["panels"])
    check("\n".join(exprs), "grafana-dashboard.json")


def test_the_dcgm_compatibility_rules_record_from_exported_series() -> None:
    rules = yaml.safe_load((MONITORING / "dcgm-compat-rules.yaml").read_text())["groups"][0]["rules"]
    assert {r["record"] for r in rules} >= {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
    }
    check("\n".join(r["expr"] for r in rules), "dcgm-compat-rules.yaml")


def test_the_cost_and_alert_rules_read_exported_series() -> None:
    for name in ("cost-rules.yaml", "alert-rules.yaml"):
        rules = yaml.safe_load((MONITORING / name).read_text())["groups"][0]["rules"]
        text = "\n".join(r["expr"] for r in rules)
        series = exported()
        names = set(NAME.findall(text))
        assert names, f"{name} names no dradriver series"
        assert names <= set(series), f"{name}: not exported: {sorted(names - set(series))}"
        # Other selectors are kube-state-metrics' and kube-controller-manager's series.
        for metric, matchers in SELECTOR.findall(text):
            assert set(LABELS.findall(matchers)) <= series[metric] | {"instance", "job"}, (name, metric)
