"""Every DRADRIVER_* variable is checked exactly as its flag is, by the command that reads it;
NaN, infinite and negative durations, out-of-range XIDs, missing directories and unknown nodes
are errors rather than silent defaults or empty output with exit 0."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from dradriver.cli import build_parser
from dradriver.flagenv import env_name
from tests.helpers import short_tmpdir
from tests.robustness.common import assert_one_line_failure, dradriver


def _subcommands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _subcommands(sub, (*prefix, name))


def env_flags() -> list[tuple[tuple[str, ...], str, argparse.Action]]:
    """(command, variable, action) for every flag that reads a DRADRIVER_* variable."""
    found = []
    for command, sub in _subcommands(build_parser()):
        for action in sub._actions:
            long = [o for o in action.option_strings if o.startswith("--")]
            if long and f"env {env_name(long[0])}" in (action.help or ""):
                found.append((command, env_name(long[0]), action))
    return found


def test_every_command_reads_its_flags_from_the_environment() -> None:
    names = {name for _, name, _ in env_flags()}
    for name in ("DRADRIVER_TIMEOUT", "DRADRIVER_LOG_FORMAT", "DRADRIVER_SHUTDOWN_GRACE", "DRADRIVER_OUTPUT"):
        assert name in names


def test_a_bad_variable_of_another_command_does_not_break_this_one() -> None:
    result = dradriver("--version", env={"DRADRIVER_TIMEOUT": "abc", "DRADRIVER_LOG_FORMAT": "xml"})
    assert result.returncode == 0
    assert result.stdout.startswith("dradriver ")


#: A value the flag's own check refuses, per kind of flag.
def _bad_value(action: argparse.Action) -> str | None:
    if action.choices is not None:
        return "xml"
    if isinstance(action, argparse._StoreTrueAction):
        return "maybe"
    name = getattr(action.type, "__name__", "")
    return {
        "duration": "nan",
        "positive_duration": "0",
        "verbosity": "loud",
        "driver_name": "Bad_Name",
        "node_name": "Bad_Name",
        "existing_directory": "/nonexistent/dir",
        "probe_address": "nowhere",
    }.get(name)


#: What a command needs besides the flag under test, so that the flag is what fails.
REQUIRED = {
    ("cel", "eval"): ["-e", "true"],
    ("fake-event",): ["--device", "gpu-0", "--xid", "79"],
    ("validate",): ["examples/claims/single-gpu.yaml"],
    ("migrate",): ["examples/claims/single-gpu.yaml"],
}

BAD = [
    (command, name, "/".join(action.option_strings), value)
    for command, name, action in env_flags()
    if (value := _bad_value(action))
]


@pytest.mark.parametrize(
    ("command", "variable", "flags", "value"), BAD, ids=[f"{' '.join(c)}-{n}" for c, n, _, _ in BAD]
)
def test_a_bad_variable_is_the_error_its_flag_would_be(
    command: tuple[str, ...], variable: str, flags: str, value: str
) -> None:
    args = [*command, *REQUIRED.get(command, [])]
    from_env = dradriver(*args, env={variable: value})
    line = assert_one_line_failure(from_env, f"argument {flags} (from ${variable})")
    if value != "maybe":  # a switch takes no value on the command line
        flag_line = assert_one_line_failure(
            dradriver(*args, flags.rsplit("/", maxsplit=1)[-1], value), f"argument {flags}"
        )
        # The same check and the same words, plus where the value came from.
        assert (
            line.replace(f" (from ${variable})", "").split(": error: ")[1] == flag_line.split(": error: ")[1]
        )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DRADRIVER_TIMEOUT", "abc", "invalid duration 'abc'"),
        ("DRADRIVER_TIMEOUT", "-1", "invalid duration '-1'"),
        ("DRADRIVER_TIMEOUT", "inf", "invalid duration 'inf'"),
        ("DRADRIVER_LOG_FORMAT", "xml", "invalid choice: 'xml'"),
        ("DRADRIVER_VERBOSITY", "-3", "invalid verbosity '-3'"),
    ],
)
def test_named_examples(variable: str, value: str, message: str) -> None:
    assert_one_line_failure(dradriver("healthcheck", env={variable: value}), variable, message)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e400", "604801"])
def test_durations_must_be_finite_and_in_range(value: str) -> None:
    for flag in ("--shutdown-grace", "--stale-claim-grace"):
        assert_one_line_failure(
            dradriver("serve", "--fake-gpus", "t4x4", f"{flag}={value}"), flag, "invalid duration"
        )


def test_a_switch_flag_takes_true_or_false_only() -> None:
    assert_one_line_failure(
        dradriver("serve", "--fake-gpus", "t4x4", "--metrics-tenant-labels=maybe"),
        "--metrics-tenant-labels",
        "invalid value 'maybe': use true or false",
    )


@pytest.mark.parametrize("xid", ["-1", "2147483648", "99999999999999999999", "seventy"])
def test_out_of_range_xids_are_refused(xid: str) -> None:
    with short_tmpdir() as root:
        result = dradriver("fake-event", "--state-dir", str(root), "--device", "gpu-0", f"--xid={xid}")
        assert_one_line_failure(result, "--xid", "must be an integer from 0 to 2147483647")


def test_missing_directories_are_errors() -> None:
    assert_one_line_failure(dradriver("status", "--state-dir", "/nonexistent/state"), "no such directory")
    assert_one_line_failure(
        dradriver("serve", "--fake-gpus", "t4x4", "--claims-dir", "/nonexistent/claims"),
        "--claims-dir",
        "/nonexistent/claims: does not exist",
    )
    assert_one_line_failure(
        dradriver("serve", "--driver-root", "/nonexistent/driver", "--log-format", "console"),
        "--driver-root /nonexistent/driver: no such directory",
    )


def test_unknown_nodes_are_errors() -> None:
    slices = dradriver("slices", "--fake-gpus", "t4x4", "--node-name", "node-a", "-o", "json").stdout
    with short_tmpdir() as root:
        path = root / "slices.json"
        path.write_text(slices)
        assert_one_line_failure(
            dradriver("cel", "eval", "-e", "true", "--slices", str(path), "--node", "node-b"),
            "--node node-b: no device of the inventory is on this node (nodes: node-a)",
        )
        assert_one_line_failure(
            dradriver(
                "dry-run",
                "--claim",
                "examples/claims/single-gpu.yaml",
                "--slices",
                str(path),
                "--node",
                "nope",
            ),
            "--node nope",
        )
        # The node that is there works.
        assert (
            dradriver("cel", "eval", "-e", "true", "--slices", str(path), "--node", "node-a").returncode == 0
        )
