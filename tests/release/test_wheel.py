"""The sdist and wheel built from a fresh clone carry what the commands need, and the wheel,
installed with the locked dependencies into an empty venv outside the checkout, behaves as the
checkout does: `examples`, `dry-run`, `validate`, `cel eval`, `slices` and `version`."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.release.release import REPO, SHIPPED, checkout_dradriver, fresh_clone, git, run

#: Building the sdist and wheel, and a venv for them, takes a minute or more on a busy machine.
pytestmark = pytest.mark.timeout(900)


@dataclass(frozen=True)
class Dists:
    clone: Path
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    clone = fresh_clone(tmp_path_factory.mktemp("clone") / "dradriver")
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "build", "--quiet", "--outdir", str(out), str(clone)], cwd=out)
    assert built.returncode == 0, built.stderr[-3000:]
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return Dists(clone, sdist, wheel)


@pytest.fixture(scope="module")
def installed(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`dradriver` of an empty venv holding the wheel and the locked dependencies, nothing else.
    uv installs them (the dev extra's; pip would download every wheel again on each run)."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    uv = str(Path(sys.executable).parent / "uv")
    python = str(venv / "bin/python")
    lock = str(dists.clone / "requirements.lock")
    for step in (
        ["venv", "--quiet", "--python", sys.executable, str(venv)],
        ["pip", "install", "--quiet", "--python", python, "--require-hashes", "--no-deps", "-r", lock],
        ["pip", "install", "--quiet", "--python", python, "--no-deps", str(dists.wheel)],
        ["pip", "check", "--python", python],
    ):
        done = run([uv, *step], cwd=venv.parent)
        assert done.returncode == 0, f"uv {' '.join(step[:2])}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return [str(venv / "bin/dradriver")]


def test_wheel_carries_deviceclasses_and_examples_as_in_the_repository(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        for directory in SHIPPED:
            prefix = f"dradriver/data/{directory}/"
            shipped = {
                name.removeprefix(prefix): wheel.read(name)
                for name in wheel.namelist()
                if name.startswith(prefix) and "/" not in name.removeprefix(prefix)
            }
            in_repo = {p.name: p.read_bytes() for p in (REPO / directory).iterdir() if p.is_file()}
            assert sorted(shipped) == sorted(in_repo), directory
            assert shipped == in_repo, f"{directory}: the wheel's files differ from the repository's"


def test_license_and_notice_ship_in_wheel_and_sdist(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        for name in ("LICENSE", "NOTICE"):
            assert (
                wheel.read(f"dradriver-{dists.wheel.name.split('-')[1]}.dist-info/licenses/{name}")
                == (REPO / name).read_bytes()
            )
    with tarfile.open(dists.sdist) as sdist:
        names = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"LICENSE", "NOTICE", "setup.py", "src/dradriver/_build.json"} <= names
    assert {f"src/dradriver/data/{d}/README.md" for d in SHIPPED} <= names


def test_wheel_records_the_commit_it_was_built_from(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        recorded = json.loads(wheel.read("dradriver/_build.json"))
    assert recorded["commit"] == git(dists.clone, "rev-parse", "HEAD").strip()
    changed = git(dists.clone, "status", "--porcelain").strip()
    assert recorded["tree_state"] == ("dirty" if changed else "clean")


def test_version_reports_the_build_and_the_apis(dists: Dists, installed: list[str], tmp_path: Path) -> None:
    done = run([*installed, "version", "-o", "json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    from_wheel = json.loads(done.stdout)
    assert from_wheel["commit"] == git(dists.clone, "rev-parse", "HEAD").strip()
    checkout = run([*checkout_dradriver(), "version", "-o", "json"], cwd=tmp_path)
    from_checkout = json.loads(checkout.stdout)
    assert from_checkout["commit"] == git(REPO, "rev-parse", "HEAD").strip()
    for key in ("commit", "treeState", "python"):
        del from_wheel[key], from_checkout[key]
    assert from_wheel == from_checkout
    assert from_wheel["kubernetes"]["resourceAPI"] == "resource.k8s.io/v1"


def same_as_checkout(installed: list[str], args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command from the wheel and from the checkout; both must print the same."""
    from_wheel = run([*installed, *args], cwd=cwd)
    from_checkout = run([*checkout_dradriver(), *args], cwd=cwd)
    assert (from_wheel.returncode, from_wheel.stdout, from_wheel.stderr) == (
        from_checkout.returncode,
        from_checkout.stdout,
        from_checkout.stderr,
    ), f"dradriver {' '.join(args)} differs between the wheel and the checkout"
    return from_wheel


def test_examples_lists_and_prints_the_shipped_files(installed: list[str], tmp_path: Path) -> None:
    listing = same_as_checkout(installed, ["examples"], tmp_path)
    listed = [line.split()[0] for line in listing.stdout.splitlines()]
    assert listed == [f"{d}/{p.name}" for d in SHIPPED for p in sorted((REPO / d).glob("*.yaml"))]
    shown = same_as_checkout(installed, ["examples", "single-gpu"], tmp_path)
    assert shown.stdout == (REPO / "examples/claims/single-gpu.yaml").read_text()


def test_dry_run_allocates_an_example_with_the_builtin_classes(installed: list[str], tmp_path: Path) -> None:
    claim = tmp_path / "claim.yaml"
    claim.write_text(run([*installed, "examples", "two-gpus"], cwd=tmp_path).stdout)
    done = same_as_checkout(
        installed, ["dry-run", "--claim", str(claim), "--fake-gpus", "dgx-h100", "-o", "json"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["satisfiable"]
    assert len(result["nodes"][0]["claims"][0]["allocation"]) == 2


def test_validate_accepts_every_shipped_file(installed: list[str], tmp_path: Path) -> None:
    def files(root: Path) -> list[str]:
        return [str(p) for d in SHIPPED for p in sorted((root / d).glob("*.yaml"))]

    data = Path(run([*installed, "examples", "--path"], cwd=tmp_path).stdout.strip())
    assert not data.is_relative_to(REPO)
    done = run([*installed, "validate", *files(data)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    checkout = run([*checkout_dradriver(), "validate", *files(REPO)], cwd=tmp_path)
    assert (done.stdout, done.stderr) == (checkout.stdout, checkout.stderr)


def test_cel_eval_and_slices_match_the_checkout(installed: list[str], tmp_path: Path) -> None:
    expression = 'device.attributes["gpu.dradriver.dev"].productName.startsWith("NVIDIA H100")'
    evaluated = same_as_checkout(
        installed, ["cel", "eval", "-e", expression, "--fake-gpus", "dgx-h100", "-o", "json"], tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["summary"] == {"true": 8, "false": 0, "error": 0}
    slices = same_as_checkout(
        installed, ["slices", "--fake-gpus", "dgx-a100-mig", "--node-name", "node-1", "-o", "json"], tmp_path
    )
    assert slices.returncode == 0, slices.stderr
    assert json.loads(slices.stdout)
