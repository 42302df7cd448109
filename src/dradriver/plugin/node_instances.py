"""Another `dradriver serve` of the same driver on this node, whatever its directories.

The lock files catch a second instance that shares our state, plugins or registry directory. One
given none of them (a second DaemonSet with other hostPaths) shares no file with us, yet it would
publish the same node's pool and hand out the same GPUs. The node's process table is what both
share: with the host's /proc (`--proc-root`, as the DaemonSet mounts it) every process of the
node is listed there. Only instances that publish (have cluster access) clash: node-only ones
share nothing. An instance of a rolling update is no second instance: it holds our state
directory's lock too (shared), which /proc/locks shows.

Parsing is pure; `other_instances` is the thin reader of the proc files.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.flagenv import env_name


def _flag(words: Sequence[str], flag: str, environ: Mapping[str, str], envs: Sequence[str]) -> str | None:
    """A flag's value as `serve` resolves it: the command line, then its variables."""
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(f"{flag}="):
            return word.partition("=")[2]
    return next((environ[name] for name in (env_name(flag), *envs) if name in environ), None)


@dataclass(frozen=True)
class ServeIdentity:
    driver: str
    #: None: the host name.
    node: str | None
    #: Has cluster access (a kubeconfig or the pod's service account), so publishes the pool.
    publishes: bool


def _serve_arguments(argv: Sequence[str]) -> Sequence[str] | None:
    """The words after `dradriver` in a `dradriver serve` command line, or None for another one."""
    for i, word in enumerate(argv):
        if os.path.basename(word) == "dradriver" or (word == "dradriver" and i > 0 and argv[i - 1] == "-m"):
            rest = argv[i + 1 :]
            return rest if rest and rest[0] == "serve" else None
    return None


def serve_identity(argv: Sequence[str], environ: Mapping[str, str]) -> ServeIdentity | None:
    """Who a `dradriver serve` command line (`dradriver serve …` or `python -m dradriver serve
    …`) is, or None for any other command line."""
    rest = _serve_arguments(argv)
    if rest is None:
        return None
    return ServeIdentity(
        driver=_flag(rest, "--driver-name", environ, ()) or DEFAULT_DRIVER_NAME,
        node=_flag(rest, "--node-name", environ, ("NODE_NAME",)),
        publishes=bool(_flag(rest, "--kubeconfig", environ, ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"))),
    )


def flock_holders(locks: str, device: tuple[int, int], inode: int) -> set[int]:
    """The pids /proc/locks names as holding a flock on the file (`device`: major, minor)."""
    holders = set()
    for line in locks.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a blocked waiter's line has "->".
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        where = fields[5].split(":")
        if len(where) != 3 or not fields[4].isdigit():
            continue
        try:
            key = (int(where[0], 16), int(where[1], 16), int(where[2]))
        except ValueError:
            continue
        if key == (*device, inode):
            holders.add(int(fields[4]))
    return holders


def _environ(raw: bytes) -> dict[str, str]:
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _pids(proc_root: Path) -> Iterable[int]:
    try:
        return [int(entry.name) for entry in os.scandir(proc_root) if entry.name.isdigit()]
    except OSError:
        return []


def parent_pid(stat: str) -> int:
    """The parent pid in a /proc/<pid>/stat line (after the command name, which may hold spaces)."""
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _ancestry(proc_root: Path, pid: int) -> set[int]:
    """`pid` and its ancestors: a wrapper that started us (`timeout … dradriver serve`, tini)
    carries our command line and is no other instance."""
    chain = set()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        try:
            pid = parent_pid((proc_root / str(pid) / "stat").read_text())
        except (OSError, ValueError, IndexError):
            break
    return chain


def other_instances(proc_root: Path, driver: str, node: str, state_lock: Path) -> list[int]:
    """The pids (as `proc_root` numbers them) of the other `dradriver serve` processes that
    publish the pool of (`driver`, `node`) and do not hold `state_lock` (do not share our state)."""
    try:
        own = int(os.readlink(proc_root / "self"))
        st = os.stat(state_lock)
        sharing = flock_holders(
            (proc_root / "locks").read_text(), (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino
        )
    except (OSError, ValueError):
        return []  # no readable process table: the lock files are all there is
    found = []
    ours = _ancestry(proc_root, own)
    host = socket.gethostname().lower()
    for pid in _pids(proc_root):
        if pid in sharing or pid in ours:
            continue
        try:
            raw = (proc_root / str(pid) / "cmdline").read_bytes().split(b"\0")
            argv = [w.decode(errors="replace") for w in raw if w]
            if _serve_arguments(argv) is None:
                continue  # the environment is read only for a serve's command line
            raw_environ = (proc_root / str(pid) / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        other = serve_identity(argv, _environ(raw_environ))
        if other is not None and other.publishes and other.driver == driver and (other.node or host) == node:
            found.append(pid)
    return sorted(found)
