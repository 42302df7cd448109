"""The DeviceClasses and example claims are complete and consistent with each other and the READMEs.

The API server checks each object alone; these tests check what it cannot: a pod naming a claim
the file does not define, a container naming a request that does not exist, a class nobody
ships, two examples with the same name (users apply the whole directory), a README table that
has drifted from the files. Allocation outcomes per fake profile are checked against
`dradriver dry-run` by a separate test.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dradriver.cli import main
from dradriver.offline.cel import CELCompileError, compile_selector
from dradriver.prepare.config import problems
from tests.deploy.manifests import (
    DEVICECLASSES,
    EXAMPLES,
    FAKE_PROFILES,
    OPTIONAL_DEVICECLASSES_DIR,
    OUTCOMES,
    PROFILE_FLAGS,
    QUOTA_EXAMPLES,
    ExampleRow,
    Manifest,
    claim_specs,
    class_table,
    deviceclass_files,
    deviceclasses,
    example_files,
    example_table,
    load_documents,
    pod_specs,
    render,
    request_selectors,
)

DRIVER = "gpu.dradriver.dev"
OPAQUE_KINDS = {"GpuConfig": "gpu", "MigDeviceConfig": "mig"}
#: Attribute and capacity domains a selector may look up: ours and the standard one.
DOMAINS = {DRIVER, "resource.kubernetes.io"}
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


def examples() -> list[tuple[Path, list[Manifest]]]:
    return [(path, load_documents(path)) for path in example_files()]


def namespace_of(obj: Manifest) -> str:
    namespace: str = obj["metadata"].get("namespace", "")
    return namespace


def cel_expressions(selectors: list[Manifest]) -> list[str]:
    return [s["cel"]["expression"] for s in selectors]


def selector_problems(expression: str) -> list[str]:
    found = []
    try:
        compile_selector(expression)
    except CELCompileError as err:
        found.append(f"does not compile: {err}")
    for domain in re.findall(r'device\.(?:attributes|capacity)\["([^"]+)"\]', expression):
        if domain not in DOMAINS:
            found.append(f"looks up unknown domain {domain!r}")
    return found


@pytest.mark.parametrize(
    "path",
    deviceclass_files()
    + deviceclass_files(OPTIONAL_DEVICECLASSES_DIR)
    + example_files()
    + sorted(QUOTA_EXAMPLES.glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_file_starts_with_a_comment_saying_what_it_shows(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# "), f"{path.name}: must open with a comment saying what it shows"
    assert len(first) > 20, f"{path.name}: the opening comment is too short to say anything"


def test_deviceclasses_select_on_our_driver() -> None:
    for name, cls in (deviceclasses() | deviceclasses(OPTIONAL_DEVICECLASSES_DIR)).items():
        expressions = cel_expressions(cls["spec"]["selectors"])
        assert any(f'device.driver == "{DRIVER}"' in e for e in expressions), (
            f"{name} does not select {DRIVER}"
        )
        for expression in expressions:
            assert not selector_problems(expression), f"DeviceClass {name}: {selector_problems(expression)}"
        for config in cls["spec"].get("config", []):
            check_opaque(config["opaque"], f"DeviceClass {name}", class_kind(cls))


def test_the_device_plugins_names_are_mapped_once_each() -> None:
    """nvidia.com/gpu for full GPUs (deviceclasses/); nvidia.com/mig-<profile> (a "+" written ".")
    for that profile (deviceclasses/optional/, which ResourceQuotas cap by profile too)."""
    mapped: dict[str, str] = {}
    for name, cls in (deviceclasses() | deviceclasses(OPTIONAL_DEVICECLASSES_DIR)).items():
        if (resource := cls["spec"].get("extendedResourceName")) is None:
            continue
        assert resource not in mapped, f"{resource} mapped by {mapped.get(resource)} and {name}"
        mapped[resource] = name
        (expression,) = cel_expressions(cls["spec"]["selectors"])
        if resource == "nvidia.com/gpu":
            assert class_kind(cls) == "gpu"
            continue
        (profile,) = re.findall(r'\.profile == "([^"]+)"', expression)
        assert class_kind(cls) == "mig"
        assert resource == f"nvidia.com/mig-{profile.replace('+', '.')}"
    assert "nvidia.com/gpu" in mapped
    assert {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb.me"} <= mapped.keys()


def class_kind(cls: Manifest) -> str:
    """'gpu' or 'mig': which device type a class selects (every class selects exactly one)."""
    expressions = " ".join(cel_expressions(cls["spec"]["selectors"]))
    kinds: set[str] = set(re.findall(r'\.type == "(\w+)"', expressions))
    assert len(kinds) == 1, f"DeviceClass {cls['metadata']['name']} selects types {kinds}"
    return kinds.pop()


def check_opaque(opaque: Manifest, where: str, device_type: str) -> None:
    """Decoded by the very models NodePrepareResources uses, and of the kind for its device type."""
    assert opaque["driver"] == DRIVER, f"{where}: opaque config for driver {opaque['driver']}"
    assert problems(opaque["parameters"]) == [], f"{where}: {problems(opaque['parameters'])}"
    assert OPAQUE_KINDS.get(opaque["parameters"]["kind"]) == device_type, (
        f"{where}: {opaque['parameters']['kind']} on {device_type}"
    )


def test_examples_are_self_contained() -> None:
    classes = deviceclasses()
    extended = {
        c["spec"]["extendedResourceName"] for c in classes.values() if "extendedResourceName" in c["spec"]
    }
    for path, documents in examples():
        where = path.name
        namespaces = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Namespace"}
        claims = {
            (namespace_of(d), d["metadata"]["name"]): d for d in documents if d["kind"] == "ResourceClaim"
        }
        templates = {
            (namespace_of(d), d["metadata"]["name"]): d
            for d in documents
            if d["kind"] == "ResourceClaimTemplate"
        }
        used: set[tuple[str, str]] = set()
        workloads = [(d, spec) for d in documents for spec in pod_specs(d)]
        assert workloads, f"{where}: no Pod, Job or Deployment uses the claim"
        for doc, pod in workloads:
            namespace = namespace_of(doc)
            if namespace:
                assert namespace in namespaces, f"{where}: namespace {namespace} is not in the file"
            pod_claims = {}
            for entry in pod.get("resourceClaims", []):
                if "resourceClaimName" in entry:
                    key = (namespace, entry["resourceClaimName"])
                    assert key in claims, f"{where}: pod claim {entry['name']} names a missing ResourceClaim"
                    pod_claims[entry["name"]] = claims[key]["spec"]
                else:
                    key = (namespace, entry["resourceClaimTemplateName"])
                    assert key in templates, f"{where}: pod claim {entry['name']} names a missing template"
                    pod_claims[entry["name"]] = templates[key]["spec"]["spec"]
                used.add(key)
            referenced = set()
            for container in pod["containers"]:
                for ref in container.get("resources", {}).get("claims", []):
                    assert ref["name"] in pod_claims, (
                        f"{where}: container {container['name']} names {ref['name']}"
                    )
                    referenced.add(ref["name"])
                    requests = {r["name"] for r in pod_claims[ref["name"]]["devices"]["requests"]}
                    if "request" in ref:
                        assert ref["request"] in requests, f"{where}: unknown request {ref['request']}"
                for resource in container.get("resources", {}).get("limits", {}):
                    if "/" in resource and not resource.startswith(("kubernetes.io/", "hugepages-")):
                        assert resource in extended, f"{where}: no shipped DeviceClass maps {resource}"
            assert referenced == set(pod_claims), f"{where}: pod claims no container uses"
        assert used == set(claims) | set(templates), f"{where}: claims no pod uses"


def test_example_claims_are_consistent() -> None:
    classes = deviceclasses()
    for path, documents in examples():
        namespaces = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Namespace"}
        for doc in documents:
            for spec in claim_specs(doc):
                where = f"{path.name} {doc['kind']} {doc['metadata']['name']}"
                request_classes = {}
                for name, class_name, selectors in request_selectors(spec):
                    assert class_name in classes, f"{where}: request {name} uses unknown class {class_name}"
                    request_classes[name] = class_name
                    for expression in cel_expressions(selectors):
                        assert not selector_problems(expression), f"{where}: {selector_problems(expression)}"
                names = set(request_classes) | {n.split("/")[0] for n in request_classes}
                for constraint in spec["devices"].get("constraints", []):
                    assert set(constraint["requests"]) <= names, f"{where}: constraint names unknown requests"
                for config in spec["devices"].get("config", []):
                    assert set(config["requests"]) <= names, f"{where}: config names unknown requests"
                    for request in config["requests"]:
                        device_type = class_kind(classes[request_classes[request]])
                        check_opaque(config["opaque"], where, device_type)
                for request in spec["devices"]["requests"]:
                    if request.get("exactly", {}).get("adminAccess"):
                        labels = namespaces[namespace_of(doc)]["metadata"]["labels"]
                        assert labels[ADMIN_ACCESS_LABEL] == "true", (
                            f"{where}: adminAccess needs {ADMIN_ACCESS_LABEL}"
                        )


def test_example_names_do_not_collide() -> None:
    """Users apply the whole directory at once; no two files may define the same object."""
    keys = Counter(
        (d["kind"], namespace_of(d), d["metadata"]["name"])
        for _path, documents in examples()
        for d in documents
        if d["kind"] != "Namespace"
    )
    assert [key for key, count in keys.items() if count > 1] == []


#: What the pods of an example can do on a fake-GPU cluster, given the dry-run outcome.
POD_OUTCOMES = {"satisfiable": {"Running", "Succeeded", "prepare fails"}, "unsatisfiable": {"Pending"}}


def test_example_containers_exit_promptly_on_sigterm() -> None:
    """A shell as PID 1 ignores SIGTERM: each long-running example container must trap it, or
    every `kubectl delete` waits out the whole grace period."""
    for path, documents in examples():
        for doc in documents:
            for spec in pod_specs(doc):
                for container in spec["containers"]:
                    script = " ".join(container.get("command", []) + container.get("args", []))
                    if "sleep" in script:
                        assert 'trap "exit 0" TERM' in script, f"{path.name}: {container['name']}"
                        assert script.rstrip().endswith("& wait"), f"{path.name}: {container['name']}"


def test_examples_table_covers_every_example() -> None:
    rows = example_table()
    files = {p.name for p in example_files()}
    for row in rows:
        assert row.file in files, f"README row names missing file {row.file}"
        profile, *flags = row.profile.split()
        assert profile in FAKE_PROFILES, f"{row.file}: unknown profile {profile}"
        assert set(flags) <= PROFILE_FLAGS, f"{row.file}: unknown flags {flags}"
        assert row.expected in OUTCOMES, f"{row.file}: expected outcome {row.expected!r}"
        pods = row.pod.split(", ")
        assert set(pods) <= POD_OUTCOMES[row.expected] | {"Running"}, f"{row.file}@{row.profile}: {row.pod!r}"
        # A satisfiable file runs everywhere; an unsatisfiable one leaves at least one pod waiting.
        assert ("Pending" in pods) == (row.expected == "unsatisfiable"), (
            f"{row.file}@{row.profile}: {row.pod!r}"
        )
        if len(pods) > 1:
            named = [d for path in [EXAMPLES / row.file] for d in load_documents(path) if d["kind"] == "Pod"]
            assert len(pods) == len(named), f"{row.file}@{row.profile}: one outcome per Pod of the file"
        assert row.shows, f"{row.file}: empty 'shows' cell"
    assert files == {row.file for row in rows}, (
        f"examples missing from the README: {files - {r.file for r in rows}}"
    )
    pairs = Counter((row.file, row.profile) for row in rows)
    assert [pair for pair, count in pairs.items() if count > 1] == []
    assert {row.expected for row in rows} == OUTCOMES, "the table should show both outcomes"


@pytest.mark.parametrize("directory", [DEVICECLASSES, OPTIONAL_DEVICECLASSES_DIR], ids=lambda d: d.name)
def test_deviceclasses_table_matches_the_files(directory: Path) -> None:
    shipped = {
        (doc["metadata"]["name"], path.name)
        for path in deviceclass_files(directory)
        for doc in load_documents(path)
    }
    assert {(row.name, row.file) for row in class_table(directory)} == shipped
    assert all(row.selects for row in class_table(directory))


def test_readmes_are_not_applied_as_manifests() -> None:
    """`kubectl apply -f <dir>` reads .yaml/.yml/.json only; nothing else in these dirs."""
    for directory in (DEVICECLASSES, OPTIONAL_DEVICECLASSES_DIR, EXAMPLES, QUOTA_EXAMPLES):
        others = {p.name for p in directory.iterdir() if p.is_file() and p.suffix != ".yaml"}
        assert others == {"README.md"}


@pytest.mark.parametrize("row", example_table(), ids=lambda r: f"{r.file}@{r.profile}")
def test_examples_table_matches_dry_run_and_validate(
    row: ExampleRow, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's expected outcome is what `dradriver dry-run` says on that fake profile, and
    `dradriver validate` accepts the file (run in-process through the real CLI entry point)."""
    path = str(EXAMPLES / row.file)
    assert main(["validate", path]) == 0, capsys.readouterr()
    capsys.readouterr()
    code = main(["dry-run", "--claim", path, "--fake-gpus", *row.profile.split(), "-o", "json"])
    report = capsys.readouterr().out
    assert code == {"satisfiable": 0, "unsatisfiable": 1}[row.expected], report


def test_validate_accepts_every_device_class_and_the_rendered_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dradriver validate` (the API server's rules, our CEL, our opaque config) on everything shipped."""
    shipped = [*deviceclass_files(), *deviceclass_files(OPTIONAL_DEVICECLASSES_DIR)]
    assert main(["validate", *map(str, shipped)]) == 0, capsys.readouterr()
    rendered = tmp_path / "deploy.yaml"
    rendered.write_text(yaml.safe_dump_all(render("overlays/fake")))
    assert main(["validate", str(rendered)]) == 0, capsys.readouterr()


def test_quota_examples_close_every_other_class() -> None:
    """A quota counts each class under its own name: every example names every class dradriver
    ships (those it does not cap, at 0), so that no class is a way around it."""
    shipped = set(deviceclasses()) | set(deviceclasses(OPTIONAL_DEVICECLASSES_DIR))
    for path in sorted(QUOTA_EXAMPLES.glob("*.yaml")):
        [quota] = load_documents(path)
        named = {
            key.removesuffix(".deviceclass.resource.k8s.io/devices")
            for key in quota["spec"]["hard"]
            if key.endswith(".deviceclass.resource.k8s.io/devices")
        }
        assert named == shipped, f"{path.name}: {sorted(shipped ^ named)}"
        assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "0", path.name
