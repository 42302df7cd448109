"""deploy/Dockerfile builds an image whose entrypoint is dradriver, running as a non-root user.

Needs podman or docker and the base image already present locally (the build installs the
package from this tree plus its dependencies from the package index, which CI may not reach);
skips naming whichever is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid

import pytest

from tests.deploy.manifests import DEPLOY, REPO

DOCKERFILE = DEPLOY / "Dockerfile"

#: The fake backend's MPS inside the image, as the `fake` overlay runs it (root, no capabilities,
#: read-only root filesystem, the state directory a writable mount): a stand-in control daemon
#: per claim starts, takes its settings and is gone after release.
MPS_CHECK = """
import json
from pathlib import Path
from types import SimpleNamespace
from dradriver.prepare.config import parse
from dradriver.backend.fake.sharing import FakeSharing
from dradriver.prepare.sharing_settings import mps_directory
sharing = FakeSharing(Path("/state"))
config = parse({"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}}})
sharing.apply("uid-1", config.sharing, [SimpleNamespace(name="gpu-0", uuid="GPU-0")])
mps = Path("/state/mps") / mps_directory("uid-1")
state = json.loads((mps / "pipe/dradriver-mps-standin.json").read_text())
assert state["defaultActiveThreadPercentage"] == 25, state
sharing.release("uid-1", "MPS", ["GPU-0"])
assert not mps.exists()
print("MPS stand-in ok")
"""


def base_image() -> str:
    text = DOCKERFILE.read_text()
    [tag] = re.findall(r"^ARG DEBIAN=(\S+)$", text, flags=re.MULTILINE)
    return f"debian:{tag}"


def container_tool() -> str:
    for tool in ("podman", "docker"):
        path = shutil.which(tool)
        if path and subprocess.run([path, "info"], capture_output=True, check=False).returncode == 0:
            return path
    pytest.skip("needs a working podman or docker to build deploy/Dockerfile")


def test_image_builds_and_runs_dradriver() -> None:
    tool = container_tool()
    base = base_image()
    if subprocess.run([tool, "image", "inspect", base], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"base image {base} is not available locally (pull it first: {tool} pull {base})")
    tag = f"localhost/dradriver-test:{uuid.uuid4().hex[:8]}"
    build = subprocess.run(
        [tool, "build", "-f", str(DOCKERFILE), "-t", tag, str(REPO)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    try:
        assert build.returncode == 0, f"image build failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
        version = subprocess.run(
            [tool, "run", "--rm", tag, "--version"], capture_output=True, text=True, check=False
        )
        assert version.stdout.startswith("dradriver "), version.stderr
        user = subprocess.run(
            [tool, "run", "--rm", "--entrypoint", "id", tag, "-u"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert user.stdout.strip() == "65532"
        serve_help = subprocess.run(
            [tool, "run", "--rm", tag, "serve", "--help"], capture_output=True, text=True, check=False
        )
        assert "--kubelet-plugins-dir" in serve_help.stdout
        mps = subprocess.run(
            [tool, "run", "--rm", "--read-only", "--user", "0", "--cap-drop", "ALL", "--tmpfs", "/state",
             "--entrypoint", "python", tag, "-c", MPS_CHECK],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        assert "MPS stand-in ok" in mps.stdout, mps.stderr
    finally:
        subprocess.run([tool, "rmi", "-f", tag], capture_output=True, check=False)


def test_build_context_admits_everything_the_dockerfile_copies() -> None:
    # .dockerignore shuts everything out ("*") and lets paths back in ("!path"): a COPY of
    # anything else fails the build, which test_image_builds_and_runs_dradriver sees only where
    # a base image is at hand.
    rules = [r.strip() for r in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [r for r in rules if r and not r.startswith("#")]
    assert rules[0] == "*"
    admitted = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from=") for w in words):
            copied |= {source.rstrip("/") for source in words[1:-1]}
    assert copied, "no COPY from the build context"
    assert copied <= admitted, f"COPY of paths .dockerignore keeps out: {sorted(copied - admitted)}"
