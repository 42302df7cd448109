"""files.write: a replace that readers see whole, on the filesystems the node has."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from dradriver.files import write
from dradriver.files.write import is_temp_name, write_atomically, write_files_atomically


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("durable", [False, True])
def test_a_write_replaces_the_content_and_leaves_nothing_else(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "checkpoint.json"
    write_atomically(target, b"first", mode=0o600, durable=durable)  # nothing to swap with yet
    old_inode = target.stat().st_ino
    write_atomically(target, b"second", mode=0o600, durable=durable)
    assert target.read_bytes() == b"second"
    assert target.stat().st_ino != old_inode  # a new file took the name: readers see one or the other
    assert oct(target.stat().st_mode & 0o777) == oct(0o600)
    assert names(tmp_path) == ["checkpoint.json"]


def test_the_swap_is_taken_where_the_kernel_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if write._renameat2 is None:
        pytest.skip("this libc has no renameat2")
    swaps: list[bool] = []
    exchange = write._exchange

    def counted(dir_fd: int, tmp: str, name: str) -> bool:
        swaps.append(exchange(dir_fd, tmp, name))
        return swaps[-1]

    monkeypatch.setattr(write, "_exchange", counted)
    target = tmp_path / "spec.json"
    write_atomically(target, b"a", mode=0o644, durable=False)
    write_atomically(target, b"b", mode=0o644, durable=False)
    assert swaps == [False, True]  # no target the first time: a rename; then a swap
    assert target.read_bytes() == b"b"
    assert names(tmp_path) == ["spec.json"]


@pytest.mark.parametrize("err", [errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_filesystem_that_cannot_swap_gets_a_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    def refuse(*_args: object) -> int:
        ctypes.set_errno(err)
        return -1

    monkeypatch.setattr(write, "_renameat2", refuse)
    target = tmp_path / "health.json"
    write_atomically(target, b"old", mode=0o644, durable=False)
    write_atomically(target, b"new", mode=0o644, durable=False)
    assert target.read_bytes() == b"new"
    assert names(tmp_path) == ["health.json"]


def test_a_failed_swap_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_args: object) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    target = tmp_path / "checkpoint.json"
    write_atomically(target, b"kept", mode=0o600, durable=False)
    monkeypatch.setattr(write, "_renameat2", fail)
    with pytest.raises(OSError, match="Input/output error") as raised:
        write_atomically(target, b"lost", mode=0o600, durable=False)
    assert raised.value.errno == errno.EIO
    assert target.read_bytes() == b"kept"
    assert names(tmp_path) == ["checkpoint.json"]


def test_a_crash_between_the_swap_and_the_unlink_leaves_the_old_content_as_a_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What start-up's leftover cleanup (`is_temp_name`) removes; the target is whole and new."""
    if write._renameat2 is None:
        pytest.skip("this libc has no renameat2")
    target = tmp_path / "checkpoint.json"
    write_atomically(target, b"old", mode=0o600, durable=False)
    real_unlink = os.unlink

    def crash(path: str, *, dir_fd: int | None = None) -> None:
        raise SystemExit("killed")  # the process ends before the old file is unlinked

    monkeypatch.setattr(os, "unlink", crash)
    with pytest.raises(SystemExit):
        write_atomically(target, b"new", mode=0o600, durable=False)
    monkeypatch.setattr(os, "unlink", real_unlink)
    leftovers = [n for n in names(tmp_path) if n != "checkpoint.json"]
    assert target.read_bytes() == b"new"
    assert len(leftovers) == 1
    assert is_temp_name(leftovers[0], "checkpoint.json")
    assert (tmp_path / leftovers[0]).read_bytes() == b"old"


def test_many_files_are_written_and_replaced(tmp_path: Path) -> None:
    files = {f"claim-{i}.json": f"v1-{i}".encode() for i in range(3)}
    assert write_files_atomically(tmp_path, files, mode=0o644) == {}
    assert (
        write_files_atomically(tmp_path, {k: v.replace(b"v1", b"v2") for k, v in files.items()}, mode=0o644)
        == {}
    )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {
        f"claim-{i}.json": f"v2-{i}".encode() for i in range(3)
    }


def test_a_directory_in_the_targets_place_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "claim_gpu.json").mkdir()
    (tmp_path / "claim_gpu.json" / "inside").write_text("theirs")
    with pytest.raises(IsADirectoryError):
        write_atomically(tmp_path / "claim_gpu.json", b"ours", mode=0o644, durable=False)
    (tmp_path / "claim_gpu.json" / "inside").unlink()  # an empty one: a swap would succeed
    with pytest.raises(IsADirectoryError):
        write_atomically(tmp_path / "claim_gpu.json", b"ours", mode=0o644, durable=False)
    assert (tmp_path / "claim_gpu.json").is_dir()
    assert names(tmp_path) == ["claim_gpu.json"]


def test_an_interpreter_that_cannot_load_libc_renames(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dlopen(*_args: object, **_kwargs: object) -> None:
        raise OSError("dynamic loading not supported")

    monkeypatch.setattr(ctypes, "CDLL", no_dlopen)
    assert write._libc_renameat2() is None
