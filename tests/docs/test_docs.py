"""The repository's Markdown holds together: every relative link and `#anchor` resolves, and every
`dradriver` command shown in a shell block parses with the CLI's own parser (as `--help` would
parse it: nothing runs, an unknown flag or a bad value fails). How a deliberately non-runnable
block is marked: tests/docs/markdown.py."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

from dradriver.cli import build_parser
from tests.deploy.manifests import markdown_table
from tests.docs.markdown import Command, Page, read_page, shell_commands

REPO = Path(__file__).resolve().parents[2]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files() -> list[str]:
    """Every Markdown file of the tree, committed or about to be (git's view: nothing ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(name for name in listed if (REPO / name).is_file())


@cache
def page(name: str) -> Page:
    return read_page((REPO / name).read_text(encoding="utf-8"))


def link_problem(source: str, target: str) -> str | None:
    """Why `target`, linked from the file `source` (relative to the repository), does not resolve."""
    if _SCHEME.match(target) or target.startswith("//"):
        return None  # another site (https:, mailto:): not ours to check offline
    path, _, anchor = target.partition("#")
    if path.startswith("/"):
        return "absolute path: link relative to the file"
    resolved = os.path.normpath(os.path.join(os.path.dirname(source), unquote(path))) if path else source
    if resolved.startswith(".."):
        return "points outside the repository"
    if not (REPO / resolved).exists():
        return f"{resolved} does not exist"
    if anchor and resolved.endswith(".md") and unquote(anchor) not in page(resolved).anchors:
        return f"{resolved} has no anchor #{anchor}"
    return None


def parse_problem(command: Command) -> str | None:
    """The CLI's error for `dradriver ARGV`, or None when it parses."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli_parser().parse_args(list(command.argv))
        except SystemExit as exit_:
            if exit_.code not in (0, None):  # 0: `--help` shown
                return stderr.getvalue().strip() or f"exit {exit_.code}"
    return None


@cache
def cli_parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands parse as a reader would type them: no DRADRIVER_* of this shell fills a flag, and
    relative paths are the repository's (the docs show commands run from a checkout)."""
    for name in list(os.environ):
        if name.startswith("DRADRIVER_") or name in ("NODE_NAME", "KUBECONFIG"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(REPO)


def test_every_relative_link_and_anchor_resolves() -> None:
    files = markdown_files()
    assert {"README.md", "docs/README.md"} <= set(files)
    problems = [
        f"{name}:{link.line}: ({link.target}) {problem}"
        for name in files
        for link in page(name).links
        if (problem := link_problem(name, link.target)) is not None
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.usefixtures("clean_env")
def test_every_documented_command_parses() -> None:
    checked = 0
    problems: list[str] = []
    for name in markdown_files():
        for command in page(name).commands:
            checked += 1
            if (problem := parse_problem(command)) is not None:
                problems.append(f"{name}:{command.line}: dradriver {' '.join(command.argv)}\n    {problem}")
    assert not problems, "\n".join(problems)
    assert checked, "no command found: is the block extraction broken?"


def test_the_flag_table_of_serve_is_the_cli_s() -> None:
    """docs/install.md's table of `serve` flags lists every flag `serve` takes, and no other."""
    rows = markdown_table(REPO / "docs" / "install.md", ["flag", "default", "meaning"])
    documented = {word.strip("`") for flags, _default, _meaning in rows for word in flags.split(", ")}
    subcommands = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = subcommands.choices["serve"]
    taken = {flag for action in serve._actions for flag in action.option_strings} - {"-h", "--help"}
    assert documented == taken


# -- the checks themselves catch what they are for ---------------------------------------------------

PAGE = """\
# Flags of `dradriver serve`

## Shares of a GPU (`--gpu-shares`)

## Shares of a GPU (`--gpu-shares`)

<a id="custom"></a>

See [this](#flags-of-dradriver-serve), [that](other.md#x) and [a site](https://example.com).

| a | [cell](#shares-of-a-gpu---gpu-shares-1) |
| --- | --- |

```sh
dradriver dry-run --claim c.yaml --fake-gpus dgx-h100 | jq . > out.json
NODE_NAME=n1 dradriver slices \\
    --partitionable   # a comment
kubectl -n dradriver exec ds/x -- dradriver top
POD=$(kubectl get pods -o name); echo "not dradriver"
```

```console
$ .venv/bin/dradriver version -o json
dradriver version: output, not a command
```

```sh not-run
dradriver dry-run --claim FILE [--class FILE] (--slices FILE | --cluster)
```
"""


def test_anchors_follow_githubs_rules() -> None:
    anchors = read_page(PAGE).anchors
    assert anchors == {
        "flags-of-dradriver-serve",
        "shares-of-a-gpu---gpu-shares",
        "shares-of-a-gpu---gpu-shares-1",
        "custom",
    }


def test_links_are_found_in_text_and_tables() -> None:
    targets = [link.target for link in read_page(PAGE).links]
    assert targets == [
        "#flags-of-dradriver-serve",
        "other.md#x",
        "https://example.com",
        "#shares-of-a-gpu---gpu-shares-1",
    ]


def test_a_broken_link_or_anchor_is_named() -> None:
    assert link_problem("docs/x.md", "../README.md") is None
    assert link_problem("docs/x.md", "https://example.com/a#b") is None
    assert link_problem("docs/x.md", "nowhere.md") == "docs/nowhere.md does not exist"
    missing_anchor = link_problem("README.md", "docs/README.md#no-such-heading")
    assert missing_anchor == "docs/README.md has no anchor #no-such-heading"
    assert link_problem("README.md", "../outside.md") == "points outside the repository"


def test_commands_are_the_dradriver_words_of_shell_blocks() -> None:
    commands = read_page(PAGE).commands
    assert [(c.line, c.argv) for c in commands] == [
        (15, ("dry-run", "--claim", "c.yaml", "--fake-gpus", "dgx-h100")),
        (16, ("slices", "--partitionable")),
        (18, ("top",)),
        (23, ("version", "-o", "json")),
    ]


@pytest.mark.usefixtures("clean_env")
def test_an_unknown_flag_or_a_bad_value_fails_the_parse() -> None:
    ((_, bad_flag),) = shell_commands("dradriver slices --no-such-flag")
    ((_, bad_value),) = shell_commands("dradriver serve --rescan-interval -1")
    ((_, good),) = shell_commands("dradriver serve --rescan-interval 0 --gpu-shares mps:0,1")
    assert "unrecognized arguments: --no-such-flag" in (parse_problem(Command(bad_flag, 1)) or "")
    assert "'-1' must not be negative" in (parse_problem(Command(bad_value, 1)) or "")
    assert parse_problem(Command(good, 1)) is None
