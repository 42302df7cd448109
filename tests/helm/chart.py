"""The chart as Helm renders it: the real Helm 4.3.1 (scripts/fetch_helm.py, or DRADRIVER_HELM),
kept off the user's files and any cluster."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import build_parser
from scripts.fetch_helm import HELM_ENV, FetchError, helm_path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "dradriver"
#: The documented values combinations (chart-testing's convention): each is linted and rendered.
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
#: The release name and namespace that give deploy/'s object names.
RELEASE = "dradriver"
NAMESPACE = "dradriver"

Manifest = dict[str, Any]


@functools.cache
def helm_binary() -> str:
    try:
        return helm_path()
    except (FetchError, OSError) as err:
        pytest.skip(f"helm not available ({HELM_ENV} unset and scripts/fetch_helm.py failed: {err})")


@functools.cache
def isolated_env() -> dict[str, str]:
    """Helm's cache, config and data in a directory of their own, and no cluster: an empty kubeconfig."""
    home = Path(tempfile.mkdtemp(prefix="dradriver-helm-"))
    atexit.register(shutil.rmtree, home, True)
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    return env | {
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(kubeconfig),
    }


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, env=isolated_env(), timeout=60, check=False
    )


@dataclass(frozen=True)
class Failure:
    """A helm command that failed: its exit code and the lines it wrote (symlink notices left out)."""

    code: int
    errors: str


def template_args(
    values: Manifest | None, files: tuple[Path, ...], namespace: str, chart: Path = CHART
) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", namespace]
    for path in files:
        args += ["--values", str(path)]
    for key, value in (values or {}).items():  # merged into the defaults, as a values file is
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def render(
    values: Manifest | None = None,
    *files: Path,
    namespace: str = NAMESPACE,
    tests: bool = False,
    chart: Path = CHART,
) -> list[Manifest]:
    """The objects `helm template` renders of the chart (or a packaged one); the `helm test`
    hooks only with `tests`."""
    done = helm(*template_args(values, files, namespace, chart))
    assert done.returncode == 0, f"helm template failed:\n{stderr_lines(done.stderr)}"
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return [o for o in objects if tests or not is_test_hook(o)]


def render_error(values: Manifest | None = None, *files: Path) -> Failure:
    """The failure of a `helm template` expected to fail."""
    done = helm(*template_args(values, files, NAMESPACE))
    assert done.returncode != 0, f"helm template accepted {values}"
    return Failure(done.returncode, stderr_lines(done.stderr))


def stderr_lines(stderr: str) -> str:
    """Helm's stderr without its notices about the chart's symlinked files."""
    return "\n".join(line for line in stderr.splitlines() if "found symbolic link" not in line).strip()


def is_test_hook(manifest: Manifest) -> bool:
    return bool(manifest["metadata"].get("annotations", {}).get("helm.sh/hook") == "test")


def by_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def only(objects: list[Manifest], kind: str) -> Manifest:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def plugin_container(objects: list[Manifest]) -> Manifest:
    container: Manifest = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    return container


def env_of(objects: list[Manifest]) -> dict[str, str]:
    """The plugin container's plain-value env vars."""
    return {e["name"]: e["value"] for e in plugin_container(objects)["env"] if "value" in e}


def serve_args(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `dradriver serve` parses from these env vars (and no others of ours)."""
    for name in os.environ:
        if name.startswith("DRADRIVER_") or name == "NODE_NAME":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return vars(build_parser().parse_args(["serve"]))
