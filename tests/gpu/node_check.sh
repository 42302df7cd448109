#!/usr/bin/env bash
# tests/gpu and bench/bench_gpu on a GPU node, as root, for each driver root layout the plugin
# meets: the host's own (/), the GPU operator's (/run/nvidia/driver on the host, mounted
# elsewhere in the plugin's container) and GKE's (/home/kubernetes/bin/nvidia). The last two are
# bind mounts of the host's driver in a private mount namespace, gone when each run ends.
#
#   bash tests/gpu/node_check.sh OUT_DIR [LABEL=BASELINE_SRC ...]
#
# A fourth run starts from a /dev as a node has it moments after boot (the GPUs' nodes and
# nvidiactl, not yet nvidia-uvm's): prepare must make what the spec names.
# Dependencies come from the wheels in .whl/ when there is one (a node that cannot reach an index:
# docs/development.md, "Testing on a real GPU"), else from the interpreter. Each BASELINE_SRC, an
# earlier build's src/, is prepared beside this build by bench_gpu.
set -uo pipefail
out=${1:?usage: node_check.sh OUT_DIR [LABEL=BASELINE_SRC ...]}
shift
baselines=()
for b in "$@"; do baselines+=(--baseline-src "$b"); done
mkdir -p "$out"
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo" || exit 1
site=$(mktemp -d)
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl || exit 1
fi
export PYTHONPATH=$site:$repo/src:$repo PYTHONUNBUFFERED=1

echo "== the node"
uname -r
nvidia-smi --query-gpu=name,uuid,driver_version,mig.mode.current,compute_mode --format=csv,noheader
ls -l /dev/nvidia* 2>&1 | head -20
grep nvidia /proc/devices
for root in / /usr/local/nvidia; do
    echo "-- $root: $(find "$root"usr/lib/x86_64-linux-gnu "$root"lib64 -maxdepth 1 -name 'libnvidia-ml.so*' 2>/dev/null | head -3 | tr '\n' ' ')"
done
file -L "$(command -v nvidia-smi)" 2>/dev/null || head -c 200 "$(command -v nvidia-smi)"

# One layout: NAME, the commands (in the private mount namespace) that lay it out and export
# DRADRIVER_GPU_DRIVER_ROOT (and _MOUNT), and which tests (pytest -k) when not all.
layout() {
    local name=$1 setup=$2 select=${3:+-k \'$3\'}
    echo "== tests/gpu, driver root: $name"
    timeout 200 unshare --mount --propagation private bash -c "$setup && ls -l /dev/nvidia* \
        && python3 -m pytest tests/gpu -v -s -rA $select; rc=\$?; ls -l /dev/nvidia*; exit \$rc" \
        >"$out/tests-$name.log" 2>&1
    echo "exit $? ($name)"
    grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$out/tests-$name.log" | tail -15
}

host_root=/
[ -e /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 ] || [ -e /usr/lib64/libnvidia-ml.so.1 ] || host_root=/usr/local/nvidia
# Triton's check (PyTorch in an image made of this host) runs once, in the host's own layout.
layout host "export DRADRIVER_GPU_DRIVER_ROOT=$host_root"
[ "$host_root" = / ] || layout host-slash "export DRADRIVER_GPU_DRIVER_ROOT=/" "not triton"
layout operator "mkdir -p /run/nvidia/driver /driver-root && mount --rbind / /run/nvidia/driver \
    && mount --rbind / /driver-root && export DRADRIVER_GPU_DRIVER_ROOT=/run/nvidia/driver \
    DRADRIVER_GPU_DRIVER_ROOT_MOUNT=/driver-root" "not triton"
if [ -d /usr/local/nvidia/lib64 ]; then
    layout gke "mkdir -p /home/kubernetes/bin/nvidia && mount --rbind /usr/local/nvidia /home/kubernetes/bin/nvidia \
        && export DRADRIVER_GPU_DRIVER_ROOT=/home/kubernetes/bin/nvidia" "not triton"
else
    echo "== gke layout left out: no /usr/local/nvidia/lib64 on this node to lay it out from"
fi

layout fresh-dev "fresh=\$(mktemp -d) && mount -t tmpfs -o mode=755 tmpfs \$fresh \
    && cp -a /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/nvidiactl /dev/nvidia[0-9]* \$fresh/ \
    && mkdir \$fresh/shm && mount --bind \$fresh /dev && mount -t tmpfs tmpfs /dev/shm \
    && export DRADRIVER_GPU_DRIVER_ROOT=$host_root" "serve_prepares_a_real_gpu or every_image_layout"

echo "== bench_gpu"
timeout 120 python3 -m bench.bench_gpu --driver-root "$host_root" --rounds 400 --mps-rounds 30 --discover-runs 20 \
    "${baselines[@]}" 2>&1 | tee "$out/bench_gpu.log"
