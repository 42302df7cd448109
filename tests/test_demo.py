"""`make demo` runs the whole node flow on fake GPUs and says what happened."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_runs_the_node_flow_end_to_end() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRADRIVER_") and k != "KUBECONFIG"}
    result = subprocess.run(
        [sys.executable, "-m", "dradriver.demo"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    out = result.stdout
    assert result.returncode == 0, result.stderr + out
    assert "kubelet picked:     v1.DRAPlugin" in out
    assert "gpu-0=HEALTHY" in out
    assert (
        "single-gpu-demo (single-gpu.yaml): gpu-0 for requests ['gpu'] -> k8s.gpu.dradriver.dev/claim=" in out
    )
    assert "two-gpus-demo (two-gpus.yaml): gpu-2" in out
    assert "mps-demo (mps.yaml): gpu-4 for requests ['gpu']" in out  # the stand-in MPS daemon
    assert '"NVIDIA_VISIBLE_DEVICES=void"' in out
    assert "TimeSlicing(Long)" in out  # dradriver status shows the sharing applied
    assert "health stream: gpu-7 UNHEALTHY: XID 79 (GPU has fallen off the bus)" in out
    assert "errors: none; CDI specs left: none" in out
    assert "exit code 0; sockets left behind: none" in out
