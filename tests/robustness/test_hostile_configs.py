"""Hostile opaque configs and claims (issue 40): huge exponents, huge mantissas, long strings,
deep nesting. Each is that claim's error naming the field, answered in milliseconds, and the
liveness probe (`dradriver healthcheck`) answers all along. Real `serve`, real gRPC, real files
and a loopback API server for what no file may hold."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare import config
from tests.helpers import (
    ServeProcess,
    allocated_claim,
    healthcheck,
    opaque,
    running_serve,
    short_tmpdir,
    uid,
    wait_for,
)
from tests.robustness.common import HANG_SECONDS
from tests.robustness.test_serve_lifecycle import api_server

#: The issue's bound is 100 ms (bench/RESULTS.md); asserted generously on a shared CI machine.
ANSWER_SECONDS = 1.0
MPS_FIELD = "parameters.sharing.mps"


def mps(**settings: object) -> dict[str, object]:
    return {
        "apiVersion": "gpu.dradriver.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mps": settings},
    }


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


#: name -> (opaque parameters, what the claim's error must say).
HOSTILE: dict[str, tuple[dict[str, object], str]] = {
    # The 154 bytes: Kubernetes accepts it (1n) and so do we, at once; the thread
    # percentage beside it is what fails the claim.
    "sub-nano": (
        mps(defaultPinnedDeviceMemoryLimit="1e-9999999", defaultActiveThreadPercentage=0),
        f"{MPS_FIELD}.defaultActiveThreadPercentage: Input should be greater than or equal to 1",
    ),
    "negative-sub-nano": (
        mps(defaultPinnedDeviceMemoryLimit="-1e-9999999"),
        f"{MPS_FIELD}.defaultPinnedDeviceMemoryLimit: Value error, must be greater than zero",
    ),
    "exponent-beyond-int32": (
        mps(defaultPinnedDeviceMemoryLimit="1e-2147483648"),
        f"{MPS_FIELD}.defaultPinnedDeviceMemoryLimit: Value error, unable to parse quantity's suffix",
    ),
    "exponent-digits": (
        mps(defaultPinnedDeviceMemoryLimit="1e" + "9" * 50),
        f"{MPS_FIELD}.defaultPinnedDeviceMemoryLimit: Value error, unable to parse quantity's suffix",
    ),
    "largest-exponent": (
        mps(defaultPinnedDeviceMemoryLimit="1e2147483647"),
        f"{MPS_FIELD}.defaultPinnedDeviceMemoryLimit: Value error, must be within ±9223372036854775807",
    ),
    "huge-mantissa": (
        mps(defaultPinnedDeviceMemoryLimit="9" * 5000),
        f"{MPS_FIELD}.defaultPinnedDeviceMemoryLimit: Value error, longer than 64 characters",
    ),
    "per-device-quantity": (
        mps(perDevicePinnedMemoryLimit={"gpu-0": "1e30"}),
        f"{MPS_FIELD}.perDevicePinnedMemoryLimit.gpu-0: Value error, must be within",
    ),
    "many-devices": (
        mps(perDevicePinnedMemoryLimit={f"gpu-{i}": "1Gi" for i in range(5000)}),
        f"{MPS_FIELD}.perDevicePinnedMemoryLimit: Value error, more than 1024 entries",
    ),
    "long-key": (
        mps(perDevicePinnedMemoryLimit={"g" * 100_000: "1Gi"}),
        f"{MPS_FIELD}.perDevicePinnedMemoryLimit.{'g' * 63}…",
    ),
    "long-kind": (
        {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "G" * 1_000_000},
        "parameters.kind: must be GpuConfig or MigDeviceConfig, not 'GGG",
    ),
    # As deep as a claim file may hold (100 levels in all).
    "deep": (
        {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": nested(88)},
        "parameters.sharing.a: Extra inputs are not permitted",
    ),
    "integer-digits": (
        mps(defaultActiveThreadPercentage=10**4000),
        f"{MPS_FIELD}.defaultActiveThreadPercentage: Input should be less than or equal to 100",
    ),
}


def hostile_claim(n: int, parameters: dict[str, object]) -> dict[str, object]:
    return allocated_claim(
        f"c{n}", uid(n), [{"request": "gpu", "device": f"gpu-{n % 8}"}], config=[opaque(parameters)]
    )


def while_probed(serve: ServeProcess, probes: int, work: Callable[[], None]) -> None:
    """Run `work` over and over while `probes` liveness probes run one after the other; every
    probe must find the plugin healthy, and `work` must have run during them."""
    results: list[subprocess.CompletedProcess[str]] = []
    prober = threading.Thread(target=lambda: results.extend(healthcheck(serve) for _ in range(probes)))
    prober.start()
    rounds = 0
    while prober.is_alive() or rounds == 0:
        work()
        rounds += 1
    prober.join()
    assert [(r.returncode, r.stderr) for r in results] == [(0, "")] * probes, results


def timed_errors(client: kubeletclient.DRAClient, refs: list[ClaimRef]) -> dict[str, tuple[float, str]]:
    """Each claim prepared in a call of its own: (seconds to the answer, the claim's error)."""
    answers = {}
    for ref in refs:
        start = time.perf_counter()
        response = client.prepare([ref], timeout=HANG_SECONDS)
        answers[ref.uid] = (time.perf_counter() - start, response.claims[ref.uid].error)
    return answers


def test_hostile_opaque_configs_are_field_errors_in_milliseconds_while_liveness_answers() -> None:
    cases = dict(enumerate(HOSTILE.values(), start=1))
    refs = [ClaimRef("default", f"c{n}", uid(n)) for n in cases]
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as client:
        for n, (parameters, _) in cases.items():
            (serve.claims_dir / f"c{n}.json").write_text(json.dumps(hostile_claim(n, parameters)))
        # The first fetch reads every file of the directory (megabytes here): done for a good
        # claim, so that the calls timed below time the configs, each checked for the first time.
        (serve.claims_dir / "good.yaml").write_text(
            yaml.safe_dump(allocated_claim("good", uid(99), [{"request": "gpu", "device": "gpu-7"}]))
        )
        good = ClaimRef("default", "good", uid(99))
        assert client.prepare([good], timeout=HANG_SECONDS).claims[good.uid].error == ""
        assert client.unprepare([good], timeout=HANG_SECONDS).claims[good.uid].error == ""

        def round_of_calls() -> None:
            for n, (seconds, error) in zip(cases, timed_errors(client, refs).values(), strict=True):
                message = cases[n][1]
                assert f"claim default/c{n}: invalid opaque config" in error, error
                assert message in error, (message, error[:500])
                assert len(error) < 1000, error[:500]
                assert seconds < ANSWER_SECONDS, (message, seconds)

        while_probed(serve, 1, round_of_calls)
        assert list(serve.cdi_dir.glob("*.json")) == []
    assert "Traceback" not in serve.log()


def test_a_hostile_consumed_capacity_is_that_claims_error() -> None:
    claim = allocated_claim(
        "c1",
        uid(1),
        [
            {
                "request": "gpu",
                "device": "gpu-1",
                "consumedCapacity": {"memory": "1e2147483647", "compute": "1"},
            }
        ],
    )
    with running_serve() as serve, kubeletclient.DRAClient(serve.dra_socket) as client:
        (serve.claims_dir / "claim.yaml").write_text(yaml.safe_dump(claim))
        ((seconds, error),) = timed_errors(client, [ClaimRef("default", "c1", uid(1))]).values()
        assert "claim default/c1" in error, error
        assert (
            "status.allocation.devices.results[0].consumedCapacity.memory: Value error, must be within"
            in error
        )
        assert seconds < ANSWER_SECONDS


def raw_claim_with_parameters(name: str, claim_uid: str, depth: int) -> bytes:
    """A claim whose opaque parameters nest `depth` levels, as text (no Python structure can)."""
    claim = allocated_claim(name, claim_uid, [{"request": "gpu", "device": "gpu-1"}], config=[opaque({})])
    text = json.dumps(claim).replace(
        '"parameters": {}', '"parameters": ' + '{"a": ' * depth + "{}" + "}" * depth
    )
    return text.encode()


def test_deeply_nested_claims_from_the_api_server_are_that_claims_error() -> None:
    with short_tmpdir() as root, api_server() as fake:
        # Deeper than we check (100 levels) and deeper than Python's JSON decoder recurses.
        for name, n, depth in (("deep", 1, 150), ("deeper", 2, 5000)):
            fake.raw_answers[f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}"] = (
                raw_claim_with_parameters(name, uid(n), depth)
            )
        kubeconfig = fake.write_kubeconfig(root / "kubeconfig")
        serve = ServeProcess(root, ["--kubeconfig", str(kubeconfig)], claims_from_files=False).start()
        try:
            wait_for(lambda: "driver ready" in serve.log(), HANG_SECONDS, "driver ready")
            refs = [ClaimRef("default", "deep", uid(1)), ClaimRef("default", "deeper", uid(2))]
            with kubeletclient.DRAClient(serve.dra_socket) as client:

                def round_of_calls() -> None:
                    deep, deeper = timed_errors(client, refs).values()
                    assert (
                        "claim default/deep: status.allocation.devices.config[0].opaque.parameters.a…: "
                        in deep[1]
                    )
                    assert "nested deeper than 100 levels (the limit)" in deep[1], deep[1]
                    assert "ResourceClaim default/deeper: GET" in deeper[1], deeper[1]
                    assert "cannot decode the answer: maximum recursion depth exceeded" in deeper[1], deeper[
                        1
                    ]
                    assert max(deep[0], deeper[0]) < ANSWER_SECONDS

                while_probed(serve, 1, round_of_calls)
        finally:
            serve.kill()
        assert "Traceback" not in serve.log()


# -- a fuzzer over the config models: every answer bounded in time and size -------------------------

digits = st.text("0123456789", min_size=1, max_size=6000)
quantities = st.one_of(
    st.builds(
        lambda sign, whole, fraction, suffix: f"{sign}{whole}{fraction}{suffix}",
        st.sampled_from(["", "+", "-"]),
        digits,
        st.sampled_from(["", "."]) | digits.map(lambda d: f".{d}"),
        st.sampled_from(["", "n", "m", "k", "Ki", "Mi", "Gi", "Ei", "E"])
        | st.builds(
            lambda e, sign, exponent: f"{e}{sign}{exponent}",
            st.sampled_from(["e", "E"]),
            st.sampled_from(["", "+", "-"]),
            st.integers(min_value=0, max_value=10**30) | digits,
        ),
    ),
    st.text(max_size=200),
)
settings_values = st.one_of(
    quantities, st.integers(min_value=-(10**4000), max_value=10**4000), st.none(), st.booleans()
)
configs = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(["gpu.dradriver.dev/v1alpha1", "v1"]) | st.text(max_size=100_000),
        "kind": st.sampled_from(["GpuConfig", "MigDeviceConfig"]) | st.text(max_size=100_000),
        "sharing": st.fixed_dictionaries(
            {"strategy": st.sampled_from(["MPS", "TimeSlicing", "Other"])},
            optional={
                "mps": st.fixed_dictionaries(
                    {},
                    optional={
                        "defaultActiveThreadPercentage": settings_values,
                        "defaultPinnedDeviceMemoryLimit": settings_values,
                        "perDevicePinnedMemoryLimit": st.dictionaries(
                            st.text(max_size=300), settings_values, max_size=20
                        ),
                    },
                ),
                "timeSlicing": st.fixed_dictionaries({"interval": st.text(max_size=50)}),
            },
        ),
    }
)


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(configs)
def test_any_config_is_answered_in_bounded_time_and_size(parameters: dict[str, Any]) -> None:
    start = time.perf_counter()
    found = config.problems(parameters)
    assert time.perf_counter() - start < ANSWER_SECONDS
    assert len(found) <= config.MAX_PROBLEMS + 1
    assert all(len(path) + len(message) < 1000 for path, message in found), found
