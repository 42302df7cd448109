"""What the docs checks read from a Markdown page: its anchors, its links and its `dradriver` commands.

Pure functions of the page's text (no I/O): the test resolves the links and parses the commands.

- Anchors follow GitHub's rules for headings: the heading's text lowercased, every character but
  letters, digits, `_`, `-` and spaces removed, each space a `-`; a repeated anchor gets `-1`,
  `-2`, ... HTML `id=`/`name=` attributes are anchors too.
- Commands are read from fenced blocks whose info string starts with a shell language (```` ```sh ````,
  ```` ```console ````: only its `$ ` lines): every simple command (split at `|`, `&&`, `;`, `(`,
  ...) whose first word is `dradriver` (or a path ending in `/dradriver`, after `VAR=value`
  assignments, or after `--` as in `kubectl exec POD -- dradriver top`).
- A block that is deliberately not a runnable command line (a synopsis with `[...]` and `|`
  alternatives) carries the word `not-run` in its info string: ```` ```sh not-run ````. GitHub
  highlights by the first word only, so the marker is invisible to readers.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.token import Token

#: The info-string word that exempts a shell block from the command check.
NOT_RUN = "not-run"
SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})
#: Tokens that end one simple command and start the next.
_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "(", ")"})
_REDIRECTS = frozenset({">", ">>", "<", ">&", "&>"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_HTML_ID = re.compile(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""")

# GitHub renders CommonMark plus tables (links in table cells count).
_MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])


@dataclass(frozen=True)
class Link:
    target: str
    line: int


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Page:
    anchors: frozenset[str]
    links: tuple[Link, ...]
    commands: tuple[Command, ...]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def read_page(text: str) -> Page:
    tokens = _MARKDOWN.parse(text)
    seen: Counter[str] = Counter()
    anchors: set[str] = set()
    links: list[Link] = []
    commands: list[Command] = []
    for index, token in enumerate(tokens):
        line = token.map[0] + 1 if token.map else 0
        if token.type == "heading_open":
            base = slug(_plain_text(tokens[index + 1]))
            anchors.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
        elif token.type == "inline":
            for child in token.children or ():
                target = child.attrs.get("href") or child.attrs.get("src")
                if child.type in ("link_open", "image") and isinstance(target, str):
                    links.append(Link(target, line))
                elif child.type == "html_inline":
                    anchors.update(_HTML_ID.findall(child.content))
        elif token.type == "html_block":
            anchors.update(_HTML_ID.findall(token.content))
        elif token.type == "fence":
            words = token.info.split()
            if words and words[0] in SHELL_LANGUAGES and NOT_RUN not in words[1:]:
                console = words[0] == "console"
                # The fence's own line comes first: the block's text starts one line below it.
                found = shell_commands(token.content, console)
                commands.extend(Command(argv, line + 1 + offset) for offset, argv in found)
    return Page(frozenset(anchors), tuple(links), tuple(commands))


def _plain_text(inline: Token) -> str:
    """The text GitHub makes an anchor of: text and code spans, without markup."""
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))


def shell_commands(script: str, console: bool = False) -> Iterator[tuple[int, tuple[str, ...]]]:
    """(line offset in `script`, argv after `dradriver`) of every `dradriver` command in it."""
    for offset, line in _logical_lines(script):
        if console and not line.startswith("$ "):
            continue  # a console block's other lines are output
        lexer = shlex.shlex(line[2:] if console else line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        for words in _simple_commands(list(lexer)):
            argv = _dradriver_argv(words)
            if argv is not None:
                yield offset, argv


def _logical_lines(script: str) -> Iterator[tuple[int, str]]:
    """Lines with their backslash continuations joined, each with the offset of its first line."""
    start, parts = 0, list[str]()
    for offset, line in enumerate(script.split("\n")):
        if not parts:
            start = offset
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        yield start, " ".join(parts)
        parts = []


def _simple_commands(tokens: Sequence[str]) -> Iterator[list[str]]:
    words: list[str] = []
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
        elif token in _REDIRECTS:
            skip_next = True  # the redirection's file is not an argument
        elif token in _SEPARATORS:
            yield words
            words = []
        else:
            words.append(token)
    yield words


def _dradriver_argv(words: Sequence[str]) -> tuple[str, ...] | None:
    rest = list(words)
    while rest and _ASSIGNMENT.match(rest[0]):
        rest.pop(0)
    if "--" in rest and not _is_dradriver(rest[0] if rest else ""):
        rest = rest[rest.index("--") + 1 :]  # a command run by another, as `kubectl exec ... -- CMD`
    if rest and _is_dradriver(rest[0]):
        return tuple(rest[1:])
    return None


def _is_dradriver(word: str) -> bool:
    return word == "dradriver" or word.endswith("/dradriver")
