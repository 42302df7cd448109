"""Property tests: arbitrary devices never make evaluation fail with anything but CELRuntimeError."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver.offline.cel import CELRuntimeError, Quantity, compile_selector, to_cel_device

DRIVER = "gpu.dradriver.dev"
A = 'device.attributes["gpu.dradriver.dev"]'
C = 'device.capacity["gpu.dradriver.dev"]'

SELECTORS = [
    compile_selector(e)
    for e in (
        "true",
        f'{A}.productName.startsWith("NVIDIA")',
        f"{A}.computeMajor >= 8",
        f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))',
        f'{A}.driverVersion == "550.0.0"',
        f'"x" == {A}.driverVersion',
        f'{C}.memory.compareTo(quantity("40Gi")) >= 0',
        f"{C}.memory.isInteger() && {C}.memory.asInteger() > 0",
        f"{C}.memory.asApproximateFloat() > 1.0",
        f'{C}.memory.add(quantity("1")).sub(1).isGreaterThan(quantity("0"))',
        f"has({A}.uuid) && {A}.uuid.size() > 3",
        f'"uuid" in {A} || {A}.type == "mig"',
        f"{A}.migCapable || !{A}.migEnabled",
        "device.attributes.all(domain, device.attributes[domain].size() >= 0)",
        "device.capacity.exists(d, device.capacity[d].size() > 1)",
        f'{A}.productName.lowerAscii().split(" ").exists(w, w.matches("^h[0-9]+$"))',
        f'{A}.productName.replace("A", "B").indexOf("B") >= 0',
        f"cel.bind(a, {A}, a.computeMajor * 2 + a.computeMinor > 10)",
        f"{A}.computeMajor / {A}.computeMinor > 1",
        f"[{A}.computeMajor, {A}.computeMinor].max() > 0",
        f'{A}.productName.find("[0-9]+") != ""',
        f"int({A}.productName) > 0",
        f"{A}.migCapable",
        f"{A}.productName",
        'device.attributes["resource.kubernetes.io"].numaNode == 0',
        "device.allowMultipleAllocations",
    )
]

NAMES = st.sampled_from(
    [
        "productName",
        "type",
        "uuid",
        "computeMajor",
        "computeMinor",
        "driverVersion",
        "migCapable",
        "migEnabled",
        "numaNode",
        "other.example.com/x",
        "gpu.dradriver.dev/uuid",
    ]
)

SCALAR = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.text(max_size=12),
    st.floats(allow_nan=True),
    st.none(),
)

ATTRIBUTE = st.one_of(
    st.builds(lambda v: {"int": v}, st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), SCALAR)),
    st.builds(lambda v: {"bool": v}, st.one_of(st.booleans(), SCALAR)),
    st.builds(lambda v: {"string": v}, st.one_of(st.text(max_size=20), SCALAR)),
    st.builds(
        lambda v: {"version": v},
        st.one_of(
            st.sampled_from(["550.54.15", "1.0.0-rc.1", "1.02.0", "v1", "", "9.0.0"]), st.text(max_size=8)
        ),
    ),
    st.builds(lambda v: {"ints": v}, st.lists(st.integers(), max_size=3)),
    st.dictionaries(st.text(max_size=5), SCALAR, max_size=2),
    SCALAR,
)

QUANTITY_TEXT = st.one_of(
    st.sampled_from(
        ["80Gi", "1.5Gi", "1000m", "0", "-1", "1e3", "1E-12", "9999999999999999999999G", "1ki", ""]
    ),
    st.from_regex(
        r"[+-]?[0-9]{0,25}(\.[0-9]{0,12})?([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]{1,3})?", fullmatch=True
    ),
    st.text(max_size=6),
)

CAPACITY = st.one_of(
    st.builds(lambda v: {"value": v}, QUANTITY_TEXT),
    st.builds(lambda v: {"value": v}, SCALAR),
    SCALAR,
)

DEVICES = st.fixed_dictionaries(
    {"name": st.text(max_size=10)},
    optional={
        "attributes": st.dictionaries(NAMES, ATTRIBUTE, max_size=8),
        "capacity": st.dictionaries(
            st.sampled_from(["memory", "other.example.com/memory"]), CAPACITY, max_size=2
        ),
        "allowMultipleAllocations": st.one_of(st.booleans(), st.none()),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DEVICES)
def test_evaluation_raises_only_cel_runtime_errors(device: dict[str, Any]) -> None:
    cel_device = to_cel_device(device, DRIVER)
    for selector in SELECTORS:
        try:
            result: object = selector.matches(cel_device, DRIVER)
        except CELRuntimeError as err:
            result = err.message
        assert isinstance(result, bool) or (isinstance(result, str) and result)


@settings(max_examples=200, deadline=None)
@given(QUANTITY_TEXT)
def test_quantity_parsing_either_succeeds_or_raises_value_error(text: str) -> None:
    try:
        quantity = Quantity.parse(text)
    except ValueError:
        return
    # What parses, round-trips through its exact decimal rendering.
    assert Quantity.parse(str(quantity)).compare(quantity) == 0
    assert quantity.compare(quantity) == 0
