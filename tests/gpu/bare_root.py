"""Run as a program, as root, in a private mount namespace (`unshare --mount --propagation
private`): a container with nothing of the host but a claim's CDI edits, without a runtime.

    python -m tests.gpu.bare_root EDITS_JSON ROOT [--read-only] [--host-image] -- ARGV...

EDITS_JSON holds {"env": [...], "deviceNodes": [...], "mounts": [...]} (a spec's edits merged)
and "imageEnv" (the image's own env, which the edits' env overrides name by name, as runtimes
do). In ROOT (a copy of an image's root filesystem) it makes what runc makes (/dev/null and the
other default nodes, /proc, a read-only /sys, /dev/shm), then the spec's device nodes and bind
mounts, optionally remounts the root read-only, and executes ARGV chrooted into it.

With --host-image, ROOT (an empty directory) becomes this host's own root with its host driver
taken out: an image that has the host's software (Python, PyTorch, a compiler) and nothing of the
driver but what the spec brings. /usr is an overlay in which the driver's files are deleted (the
host's stay as they are), /usr/local/nvidia is empty, and /etc/ld.so.cache is made again without
them, as an image's own cache is.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run(
    edits: dict[str, Any],
    root: Path,
    env: tuple[str, ...],
    command: tuple[str, ...],
    *,
    read_only: bool = False,
    host_image: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`command` in a bare container of `root` (changed: use a copy) with these edits and image env."""
    edits_file = root.parent / f"{root.name}.edits.json"
    edits_file.write_text(json.dumps({**edits, "imageEnv": list(env)}))
    flags = [*(["--read-only"] if read_only else []), *(["--host-image"] if host_image else [])]
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", "tests.gpu.bare_root"]
    argv += [str(edits_file), str(root), *flags, "--", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, cwd=REPO)


#: runc's default devices: (name, major, minor).
DEFAULT_DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9))


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _device(root: Path, node: dict[str, Any]) -> None:
    target = _inside(root, node["path"])
    target.parent.mkdir(parents=True, exist_ok=True)
    if "major" in node:
        device = os.makedev(node["major"], node["minor"])
    else:  # the runtime takes the numbers from the host's node
        device = os.stat(node.get("hostPath", node["path"])).st_rdev
    target.unlink(missing_ok=True)
    os.mknod(target, node.get("fileMode", 0o666) | stat.S_IFCHR, device)


def _bind(root: Path, mount: dict[str, Any]) -> None:
    source, target = Path(mount["hostPath"]), _inside(root, mount["containerPath"])
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        target.mkdir(exist_ok=True)
    elif not target.exists():
        target.touch()
    _mount("--bind", str(source), str(target))
    if "ro" in mount.get("options", []):
        _mount("-o", "remount,bind,ro", str(target))


#: The host driver's files in a library directory (NVIDIA's installer and packages name them so).
DRIVER_FILES = ("libcuda.so*", "libcudadebugger.so*", "libnvidia-*.so*")
DRIVER_TOOLS = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def _host_image(root: Path) -> None:
    """`root` as this host's root without its host driver (see --host-image)."""
    root.mkdir(exist_ok=True)
    _mount("--rbind", "/", str(root))
    _mount("-t", "tmpfs", "tmpfs", str(root / "tmp"))  # scratch, and the image's own /tmp
    # The checkout (and its .venv) stays where it is, also when it was cloned under /tmp.
    if REPO.is_relative_to("/tmp"):
        inside = root / REPO.relative_to("/")
        inside.mkdir(parents=True)
        _mount("--bind", str(REPO), str(inside))
    (root / "tmp/usr-upper").mkdir()
    (root / "tmp/usr-work").mkdir()
    options = f"lowerdir=/usr,upperdir={root}/tmp/usr-upper,workdir={root}/tmp/usr-work"
    _mount("-t", "overlay", "overlay", "-o", options, str(root / "usr"))
    for directory in (
        "usr/lib",
        "usr/lib64",
        *(str(d.relative_to(root)) for d in (root / "usr/lib").glob("*-linux-gnu")),
    ):
        for pattern in DRIVER_FILES:
            for found in (root / directory).glob(pattern):
                found.unlink()  # a whiteout in the overlay
    for tool in DRIVER_TOOLS:
        (root / "usr/bin" / tool).unlink(missing_ok=True)
    if (root / "usr/local/nvidia").is_dir():
        _mount("-t", "tmpfs", "tmpfs", str(root / "usr/local/nvidia"))
    # -X: make no links; the cache lands in the image's scratch /tmp and is bound over its own.
    subprocess.run(["ldconfig", "-X", "-r", str(root), "-C", "/tmp/ld.so.cache"], check=True)
    _mount("--bind", str(root / "tmp/ld.so.cache"), str(root / "etc/ld.so.cache"))


def main(argv: list[str]) -> int:
    split = argv.index("--")
    edits_file, root_dir, *flags = argv[:split]
    command = argv[split + 1 :]
    edits = json.loads(Path(edits_file).read_text())
    root = Path(root_dir)
    if "--host-image" in flags:
        _host_image(root)
    else:
        _mount("--bind", str(root), str(root))
    (root / "dev").mkdir(exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", str(root / "dev"))
    for name, major, minor in DEFAULT_DEVICES:
        _device(root, {"path": f"/dev/{name}", "major": major, "minor": minor})
    (root / "dev/shm").mkdir()
    _mount("-t", "tmpfs", "tmpfs", str(root / "dev/shm"))
    for directory in ("proc", "sys", "tmp"):
        (root / directory).mkdir(exist_ok=True)
    _mount("-t", "proc", "proc", str(root / "proc"))
    _mount("--rbind", "/sys", str(root / "sys"))
    _mount("-o", "remount,bind,ro", str(root / "sys"))
    for node in edits.get("deviceNodes", []):
        _device(root, node)
    for mount in edits.get("mounts", []):
        _bind(root, mount)
    if "--read-only" in flags:
        _mount("-o", "remount,bind,ro", str(root))
    env = dict(e.split("=", 1) for e in edits.get("imageEnv", [])) | dict(
        e.split("=", 1) for e in edits.get("env", [])
    )
    os.chroot(root)
    os.chdir("/")
    os.execve(command[0], command, env)
    return 127  # not reached: execve replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
