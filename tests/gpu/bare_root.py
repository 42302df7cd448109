"""Run as a program, as root, in a private mount namespace (`unshare --mount --propagation
private`): a container with nothing of the host but a claim's CDI edits, without a runtime.

    python -m tests.gpu.bare_root EDITS_JSON ROOT [--read-only] -- ARGV...

EDITS_JSON holds {"env": [...], "deviceNodes": [...], "mounts": [...]} (a spec's edits merged)
and "imageEnv" (the image's own env, which the edits' env overrides name by name, as runtimes
do). In ROOT (a copy of an image's root filesystem) it makes what runc makes (/dev/null and the
other default nodes, /proc, a read-only /sys, /dev/shm), then the spec's device nodes and bind
mounts, optionally remounts the root read-only, and executes ARGV chrooted into it.
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
) -> subprocess.CompletedProcess[str]:
    """`command` in a bare container of `root` (changed: use a copy) with these edits and image env."""
    edits_file = root.parent / f"{root.name}.edits.json"
    edits_file.write_text(json.dumps({**edits, "imageEnv": list(env)}))
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", "tests.gpu.bare_root"]
    argv += [str(edits_file), str(root), *(["--read-only"] if read_only else []), "--", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


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


def main(argv: list[str]) -> int:
    split = argv.index("--")
    edits_file, root_dir, *flags = argv[:split]
    command = argv[split + 1 :]
    edits = json.loads(Path(edits_file).read_text())
    root = Path(root_dir)
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
