"""Every file input refuses hostile files with one line and exit 2: alias bombs, deep nesting
(60,000 levels crashed PyYAML's C loader), non-UTF-8, directories, FIFOs, devices, duplicate
keys, oversized files. Real subprocesses, one per command that reads the file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dradriver.files import FileInputError, load_documents
from dradriver.files.parse import JSON_LIMITS, YAML_LIMITS, ParseError, parse_json, parse_yaml
from tests.helpers import short_tmpdir
from tests.robustness.common import assert_one_line_failure, dradriver, snapshot

#: The issue's alias bomb: under 700 bytes, 9^9 strings once anything walks it.
ALIAS_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""

#: name -> (file content, what the one line must say)
HOSTILE: dict[str, tuple[bytes, str]] = {
    "alias-bomb.yaml": (ALIAS_BOMB.encode(), f"more than {YAML_LIMITS.max_nodes} values (the limit)"),
    "nested-60000.yaml": (b"[" * 60_000 + b"]" * 60_000, f"deeper than {YAML_LIMITS.max_depth} levels"),
    "nested-1000.yaml": (
        b"a:\n" + b"".join(b" " * (i + 1) + b"b:\n" for i in range(1000)),
        f"deeper than {YAML_LIMITS.max_depth} levels",
    ),
    "nested-60000.json": (b"[" * 60_000 + b"]" * 60_000, f"deeper than {JSON_LIMITS.max_depth} levels"),
    "latin1.yaml": (b"kind: Caf\xe9\n", "is not UTF-8 text (byte 0xe9 at offset 9)"),
    "duplicate.yaml": (b"kind: ResourceClaim\nkind: DeviceClass\n", "line 2: duplicate key 'kind'"),
    "duplicate.json": (b'{"kind": "a", "kind": "b"}', "duplicate key 'kind'"),
    "python-tag.yaml": (b"a: !!python/object/apply:os.system [id]\n", "unsupported YAML tag"),
    "recursive.yaml": (b"a: &a [*a]\n", "refers to a node that contains it"),
    "nan.yaml": (b"count: .nan\n", "NaN and infinities are not JSON numbers"),
    "huge.yaml": (b"#" * (YAML_LIMITS.max_bytes + 1), "is larger than 2 MiB (the limit for YAML files)"),
    "broken.yaml": (b"kind: [unclosed\n", "line 2, column 1: invalid YAML"),
}


def _write(directory: Path, name: str, content: bytes) -> Path:
    path = directory / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_loader_refuses_hostile_files_with_one_line(tmp_path: Path, name: str) -> None:
    content, message = HOSTILE[name]
    path = _write(tmp_path, name, content)
    with pytest.raises(FileInputError) as caught:
        load_documents(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_special_files_are_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "claims.yaml"
    os.mkfifo(fifo)  # nobody writes: opening it blocking would hang forever
    special = {
        fifo: "is a FIFO, not a regular file",
        tmp_path: "is a directory, not a regular file",
        Path("/dev/zero"): "is a character device, not a regular file",
        Path("/dev/null"): "is a character device, not a regular file",
        tmp_path / "missing.yaml": "cannot read: No such file or directory",
    }
    for path, message in special.items():
        with pytest.raises(FileInputError, match=message):
            load_documents(path)
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    with pytest.raises(FileInputError, match="is a character device"):
        load_documents(tmp_path / "zero.yaml")


def test_yaml_has_json_semantics_as_the_api_server_reads_it() -> None:
    [doc] = parse_yaml(
        "base: &base {a: 1, b: 2}\n"
        "merged:\n  <<: *base\n  b: 3\n"
        "when: 2024-05-01T10:00:00Z\n"
        "xids: {79: fatal, true: x, ~: y}\n"
        "words: [yes, 'yes', 0x1F, 1_000, 3.5]\n"
    )
    assert doc["merged"] == {"a": 1, "b": 3}
    assert doc["when"] == "2024-05-01T10:00:00Z"  # a string, as JSON has no timestamps
    assert doc["xids"] == {"79": "fatal", "true": "x", "null": "y"}  # keys become strings
    assert doc["words"] == [True, "yes", 31, 1000, 3.5]
    assert parse_yaml("---\na: 1\n---\n---\nb: 2\n") == [{"a": 1}, None, {"b": 2}]
    assert parse_json('{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


def test_limits_count_what_aliases_expand_to() -> None:
    # The same tree spelled out or through aliases costs the same against the node limit.
    small = "a: &a [1, 2, 3]\nb: [*a, *a, *a]\n"
    assert parse_yaml(small) == [{"a": [1, 2, 3], "b": [[1, 2, 3]] * 3}]
    nested = "a: &a " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 50 + "*a" + "]" * 50 + "\n"
    with pytest.raises(ParseError, match="nested deeper than 100 levels"):
        parse_yaml(nested)


def test_json_value_count_is_checked_before_building() -> None:
    many = "[" + ",".join(["{}"] * (JSON_LIMITS.max_nodes + 1)) + "]"
    with pytest.raises(ParseError, match=f"more than {JSON_LIMITS.max_nodes} values"):
        parse_json(many)


# -- the same files through every command that reads files ------------------------------------------

Command = Callable[[Path], list[str]]

COMMANDS: dict[str, Command] = {
    "validate": lambda f: ["validate", str(f)],
    "dry-run --claim": lambda f: ["dry-run", "--claim", str(f), "--fake-gpus", "t4x4"],
    "dry-run --class": lambda f: [
        "dry-run",
        "--claim",
        "examples/claims/single-gpu.yaml",
        "--class",
        str(f),
        "--fake-gpus",
        "t4x4",
    ],
    "cel eval --slices": lambda f: ["cel", "eval", "-e", "true", "--slices", str(f)],
    "slices --fake-gpus": lambda f: ["slices", "--fake-gpus", str(f)],
    "discover --fake-gpus": lambda f: ["discover", "--fake-gpus", str(f)],
    "serve --health-config": lambda f: ["serve", "--fake-gpus", "t4x4", "--health-config", str(f)],
    "serve --fake-gpus": lambda f: ["serve", "--fake-gpus", str(f)],
    "serve --kubeconfig": lambda f: ["serve", "--fake-gpus", "t4x4", "--kubeconfig", str(f)],
}

CASES = ["alias-bomb.yaml", "nested-60000.yaml", "nested-1000.yaml", "latin1.yaml", "duplicate.yaml"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name", CASES)
def test_every_file_input_refuses_hostile_files(command: str, name: str) -> None:
    content, message = HOSTILE[name]
    with short_tmpdir() as root:
        path = _write(root, name, content)
        args = COMMANDS[command](path)
        if args[0] == "serve":  # nothing may be created: the file is read before the sockets
            args += ["--kubelet-plugins-dir", str(root / "p"), "--kubelet-registry-dir", str(root / "r")]
            args += ["--log-format", "console"]
        before = snapshot(root)
        result = dradriver(*args, cwd=Path(__file__).parents[2])
        line = assert_one_line_failure(result, str(path), message)
        assert line.startswith(("dradriver", "error")), line
        assert snapshot(root) == before


@pytest.mark.parametrize("command", ["validate", "cel eval --slices", "serve --health-config"])
def test_special_files_through_the_cli(command: str) -> None:
    with short_tmpdir() as root:
        fifo = root / "in.yaml"
        os.mkfifo(fifo)
        for path, message in (
            (fifo, "is a FIFO"),
            (root, "is a directory"),
            (Path("/dev/zero"), "character device"),
        ):
            args = COMMANDS[command](path) + (
                ["--kubelet-plugins-dir", str(root / "p")] if "serve" in command else []
            )
            assert_one_line_failure(dradriver(*args, "--log-format", "console"), str(path), message)


def test_validate_names_the_real_problem() -> None:
    with short_tmpdir() as root:
        empty = _write(root, "empty.yaml", b"# nothing here\n---\n")
        assert_one_line_failure(dradriver("validate", str(empty)), "no objects in the file")
        claim = _write(
            root,
            "claim.yaml",
            b"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\n"
            b"spec:\n  devices:\n    requests:\n"
            b"    - {name: a, exactly: {deviceClassName: gpu.dradriver.dev, count: two}}\n"
            b"    - {name: b, exactly: {deviceClassName: gpu.dradriver.dev, count: 99999999999999999999}}\n"
            b"    - {name: c, exactly: {deviceClassName: gpu.dradriver.dev, count: -1}}\n",
        )
        result = dradriver("validate", str(claim))
        assert result.returncode == 1
        assert result.stdout.splitlines() == [
            f"{claim}:1:spec.devices.requests[0].exactly.count: "
            'Invalid value: "two": must be an integer, not a string',
            f"{claim}:1:spec.devices.requests[1].exactly.count: Invalid value: 99999999999999999999: "
            "must fit in a 64-bit integer (int64)",
            f"{claim}:1:spec.devices.requests[2].exactly.count: Invalid value: -1: must be greater than zero",
        ]
