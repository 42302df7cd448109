"""Fuzzing (hypothesis) over every file input, every DRADRIVER_* variable and the gRPC surface.

Bounded in time: a fixed number of derandomized examples per test. What must hold for every
example: no traceback (no exception escapes the command), no hang, no exit 0 on input that is
known to be bad, nothing on disk changed by a command that only reads, and for the daemon: an
answer for every claim, never INTERNAL, and the daemon still answers afterwards with nothing
left behind in the CDI or state directory.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver import kubeletclient
from dradriver.cli import build_parser, main
from dradriver.health.config import HealthConfigError, load_health_config
from dradriver.kube import KubeError, load_client
from dradriver.offline.allocation import parse_claim, parse_device_class
from dradriver.plugin.driver import ClaimRef
from tests.helpers import ServeProcess, allocated_claim, short_tmpdir, uid
from tests.robustness.common import REPO, snapshot
from tests.robustness.test_environment import REQUIRED, env_flags

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

# -- what files are made of ---------------------------------------------------------------------------

json_scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=25,
)


def _examples() -> list[Any]:
    docs: list[Any] = []
    for directory in (
        REPO / "examples" / "claims",
        REPO / "deviceclasses",
        REPO / "deviceclasses" / "optional",
    ):
        for path in sorted(directory.glob("*.yaml")):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


EXAMPLES = _examples()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(doc))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    """A real claim or class with one node replaced by any JSON value."""
    doc = draw(st.sampled_from(EXAMPLES))
    path = draw(st.sampled_from(list(_paths(doc))))
    return _replaced(doc, path, draw(json_values))


#: Known to be bad: not UTF-8, not YAML, over a limit, or JSON with duplicate keys.
bad_texts = st.one_of(
    st.binary(min_size=1, max_size=200).map(lambda b: b"\xff" + b),
    st.sampled_from(
        [b"a: [\n", b"{", b"a: b: c\n", b"- a\nb: c\n", b"\x00", b"a: &x [*x]\n", b"a: *nowhere\n"]
    ),
    st.integers(min_value=101, max_value=3000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(min_value=2, max_value=50).map(
        lambda n: b"{" + b",".join(b'"k": 1' for _ in range(n)) + b"}"
    ),
    st.sampled_from([b"a: 1\na: 2\n", b"x: .nan\n", b"x: !!binary aGk=\n", b"x: !foo y\n"]),
)
#: Anything at all: only "no crash, no hang, nothing written" is asserted.
any_texts = st.one_of(
    bad_texts,
    st.text(max_size=300).map(str.encode),
    mutated_documents().map(lambda d: yaml.safe_dump(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
)


def run_cli(*args: str) -> tuple[int, str]:
    """`main(args)` in this process, as the console script runs it: (exit code, stderr).
    Any exception other than argparse's SystemExit is a failure (a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, err.getvalue()


@contextlib.contextmanager
def input_file(content: bytes, suffix: str = ".yaml") -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        path = Path(tmp) / f"input{suffix}"
        path.write_bytes(content)
        before = snapshot(Path(tmp))
        yield path
        assert snapshot(Path(tmp)) == before, "a command that only reads changed the disk"


COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "validate": lambda f: ["validate", str(f)],
    "dry-run": lambda f: [
        "dry-run",
        "--claim",
        str(f),
        "--fake-gpus",
        "t4x4",
        "--class",
        str(REPO / "deviceclasses" / "gpu.yaml"),
    ],
    "cel eval": lambda f: ["cel", "eval", "-e", "device.driver == 'gpu.dradriver.dev'", "--slices", str(f)],
    "slices": lambda f: ["slices", "--fake-gpus", str(f)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@FUZZ
@given(content=bad_texts)
def test_bad_files_never_exit_0(command: str, content: bytes) -> None:
    with input_file(content) as path:
        code, stderr = run_cli(*COMMANDS[command](path))
    assert code == 2, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
@FUZZ
@given(content=any_texts, suffix=st.sampled_from([".yaml", ".json"]))
def test_any_file_gets_an_answer_not_a_traceback(command: str, content: bytes, suffix: str) -> None:
    with input_file(content, suffix) as path:
        code, stderr = run_cli(*COMMANDS[command](path))
    assert code in (0, 1, 2), stderr
    if code == 2:
        assert stderr.strip(), "exit 2 without saying why"


@FUZZ
@given(doc=mutated_documents())
def test_what_validate_passes_dry_run_accepts(doc: Any) -> None:
    """No exit 0 on input the scheduler's side would refuse: whatever `validate` passes, the
    allocation model (what dry-run and the simulator read) accepts too."""
    with input_file(json.dumps(doc).encode(), ".json") as path:
        code, stderr = run_cli("validate", str(path))
    assert code in (0, 1, 2), stderr
    if code == 0 and isinstance(doc, dict):
        parse = {"DeviceClass": parse_device_class}.get(str(doc.get("kind")), parse_claim)
        if doc.get("kind") in ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate"):
            parse(doc)  # raises InputError if validate was too lenient


@FUZZ
@given(content=any_texts)
def test_health_config_and_kubeconfig_files(content: bytes) -> None:
    with input_file(content) as path:
        for problem in (_raised(lambda: load_health_config(path)), _raised(lambda: load_client(str(path)))):
            if problem is not None:
                assert str(path) in problem
                assert "\n" not in problem


def _raised(call: Callable[[], object]) -> str | None:
    """The message of the one-line error `call` raises (HealthConfigError, KubeError), or None."""
    try:
        call()
    except (HealthConfigError, KubeError) as err:
        return str(err)
    return None


# -- every DRADRIVER_* variable, exactly as its flag ------------------------------------------------

ENV_FLAGS = [(command, name, action) for command, name, action in env_flags()]
env_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30
) | st.sampled_from(["nan", "inf", "-1", "1e999", "0", "10", "json", "console", "true", "no", "Gpu", "a.b"])


def _parse(argv: list[str]) -> tuple[str, Any]:
    err = io.StringIO()
    code: object = None
    with contextlib.redirect_stderr(err):
        try:
            return "ok", vars(build_parser().parse_args(argv))
        except SystemExit as exit_:
            code = exit_.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2
    assert len(lines) == 1, lines
    return "error", lines[0]


@settings(FUZZ, max_examples=150)
@given(index=st.integers(min_value=0, max_value=len(ENV_FLAGS) - 1), value=env_values)
def test_a_variable_is_checked_exactly_like_its_flag(index: int, value: str, monkeypatch_env: Any) -> None:
    command, name, action = ENV_FLAGS[index]
    required = REQUIRED.get(command, [])
    if required[:1] and required[0].startswith("-"):  # flag/value pairs: not the flag under test
        pairs = zip(required[::2], required[1::2], strict=True)
        required = [part for pair in pairs if pair[0] not in action.option_strings for part in pair]
    argv = [*command, *required]
    with monkeypatch_env({name: value}):
        from_env = _parse(argv)
    if isinstance(action, argparse._StoreTrueAction):
        assert from_env[0] == (
            "ok"
            if value.strip().lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}
            else "error"
        )
        return
    with monkeypatch_env({}):
        from_flag = _parse([*argv, f"{max(action.option_strings, key=len)}={value}"])
    if action.nargs == "+":  # a list flag takes one value per word on the command line
        return
    assert from_env[0] == from_flag[0], (from_env, from_flag)
    if from_env[0] == "ok":
        assert from_env[1][action.dest] == from_flag[1][action.dest]
    else:
        assert f"(from ${name})" in from_env[1]
        assert from_env[1].replace(f" (from ${name})", "") == from_flag[1]


@pytest.fixture
def monkeypatch_env() -> Callable[[dict[str, str]], contextlib.AbstractContextManager[None]]:
    """Set exactly these DRADRIVER_* variables (and no others) for a block."""

    @contextlib.contextmanager
    def only(values: dict[str, str]) -> Iterator[None]:
        saved = {k: v for k, v in os.environ.items() if k.startswith("DRADRIVER_") or k == "NODE_NAME"}
        for key in saved:
            del os.environ[key]
        os.environ.update(values)
        try:
            yield
        finally:
            for key in values:
                os.environ.pop(key, None)
            os.environ.update(saved)

    return only


# -- the gRPC surface of a running daemon ----------------------------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[ServeProcess]:
    with short_tmpdir() as root:
        serve = ServeProcess(root, ["--shutdown-grace", "2"]).start()
        try:
            yield serve
        finally:
            assert serve.stop() == 0
            assert "Traceback" not in serve.log()


#: Protobuf strings are UTF-8: anything but lone surrogates.
wire_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)
refs = st.builds(
    ClaimRef,
    namespace=st.sampled_from(["default"]) | wire_text,
    name=st.sampled_from(["fuzz-0", "fuzz-1", "fuzz-2"]) | wire_text,
    uid=st.sampled_from([uid(0), uid(1), uid(2)]) | wire_text,
)


@st.composite
def claim_files(draw: st.DrawFn) -> list[Any]:
    """Three claims as the scheduler would leave them, each possibly with one node replaced."""
    claims: list[Any] = []
    for i in range(3):
        claim = allocated_claim(f"fuzz-{i}", uid(i), [{"request": "gpu", "device": f"gpu-{i}"}])
        if draw(st.booleans()):
            path = draw(st.sampled_from(list(_paths(claim))))
            claim = _replaced(claim, path, draw(json_values))
        claims.append(claim)
    return claims


def _prepare(client: kubeletclient.DRAClient, claims: list[ClaimRef]) -> tuple[Any, Any]:
    """(response, None), or (None, the RpcError) when the whole call failed."""
    try:
        return client.prepare(claims), None
    except grpc.RpcError as err:
        return None, err


@settings(FUZZ, max_examples=30, suppress_health_check=list(HealthCheck))
@given(claims=claim_files(), calls=st.lists(st.lists(refs, max_size=4), min_size=1, max_size=3))
def test_the_daemon_answers_every_claim_and_stays_consistent(
    daemon: ServeProcess, claims: list[Any], calls: list[list[ClaimRef]]
) -> None:
    state = daemon.plugins_dir / daemon.driver
    (daemon.claims_dir / "fuzz.yaml").write_text(yaml.safe_dump_all(claims))
    with kubeletclient.DRAClient(daemon.dra_socket) as client:
        prepared: dict[str, ClaimRef] = {}
        for call in calls:
            response, failure = _prepare(client, call)
            if failure is not None:
                # The Go helper's whole-call failures (claim not allocated, replaced, not found).
                assert failure.code() == grpc.StatusCode.UNKNOWN, failure
                continue
            assert set(response.claims) == {ref.uid for ref in call}
            prepared |= {ref.uid: ref for ref in call if response.claims[ref.uid].error == ""}
        unprepared = client.unprepare(list(prepared.values()))
        assert all(entry.error == "" for entry in unprepared.claims.values())
        assert dict(client.unprepare([]).claims) == {}  # still answering
    assert list(daemon.cdi_dir.glob("*")) == []
    names = {p.name for p in state.iterdir()}
    expected = {"checkpoint.json", "boot_id", "health.json", "serve.lock", "state.lock", "dra.sock"}
    assert names <= expected | {"device-metadata"}, names
    assert not any((state / "device-metadata").glob("*"))
    checkpoint = json.loads((state / "checkpoint.json").read_text())
    assert checkpoint["data"]["claims"] == {}


def test_claims_dir_files_of_any_shape(daemon: ServeProcess) -> None:
    """Hostile claim files: the claims they could hold fail one by one, the daemon answers on."""
    contents = (
        b"\xff\xfe",
        b"[" * 5000,
        b"a: &a [*a]\n",
        b"kind: ResourceClaim\nmetadata: 5\n",
        b"- 1\n- 2\n",
    )
    with kubeletclient.DRAClient(daemon.dra_socket) as client:
        for content in contents:
            (daemon.claims_dir / "fuzz.yaml").write_bytes(content)
            response, failure = _prepare(client, [ClaimRef("default", "absent", uid(7))])
            if failure is not None:  # no unreadable file could hold it: plainly not found
                assert failure.code() == grpc.StatusCode.UNKNOWN
                assert "not found" in str(failure.details())
                continue
            assert "fuzz.yaml" in response.claims[uid(7)].error, content
        assert dict(client.unprepare([]).claims) == {}


def test_a_value_that_would_break_the_line_is_echoed_escaped() -> None:
    """str.splitlines ends a line at \\x1e or \\u2028 too: the error stays one line."""
    for value in ("\x1e", "a\u2028b", "c\r\nd"):
        outcome, line = _parse(["serve", "--node-name", "n", f"--claims-dir={value}"])
        assert outcome == "error"
        assert value.encode("unicode_escape").decode() in line
