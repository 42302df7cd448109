"""Suggestions for the selector mistakes operators make most, each with a corrected expression.

The mistakes below either do not compile or, worse, silently match nothing or error on every
device (kubernetes-dra.md pitfalls 1, 16-18): a bare attribute name used as the domain,
`memory` looked up as an attribute although it is a capacity, `compute.major` (not a valid
attribute name; we publish `computeMajor`), and a version attribute compared with a string
(`attr == "1.0.0"` is a runtime error, `"1.0.0" == attr` is always false).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from dradriver.devicemodel import attributes as published
from dradriver.names import semver_error

STANDARD_DOMAIN = "resource.kubernetes.io"
VERSION_ATTRIBUTES = frozenset(a.name for a in published.ATTRIBUTES if a.type == "version")
#: Standard attributes dradriver publishes, by name under the standard domain.
STANDARD_ATTRIBUTES = frozenset(
    a.name.removeprefix(f"{STANDARD_DOMAIN}/")
    for a in published.ATTRIBUTES
    if a.name.startswith(f"{STANDARD_DOMAIN}/")
)
PUBLISHED_CAPACITIES = frozenset(published.CAPACITIES)

_Q = r"""(?P<q>["'])"""
_BARE_DOMAIN = re.compile(
    r"device\.(?P<map>attributes|capacity)\[\s*" + _Q + r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P=q)\s*\]"
)
_MEMORY_ATTRIBUTE = re.compile(
    r"device\.attributes\[\s*"
    + _Q
    + r"(?P<domain>[^\"']+)(?P=q)\s*\]\s*(?:\.memory\b|\[\s*[\"']memory[\"']\s*\])"
)
_COMPUTE_DOTTED = re.compile(r"\.compute\.(?P<part>major|minor)\b")
_COMPUTE_QUOTED = re.compile(r"""\[\s*(?P<q>["'])compute\.(?P<part>major|minor)(?P=q)\s*\]""")
_VERSION_ATTR = (
    r"(?P<attr>device\.attributes\[\s*[\"'][^\"']+[\"']\s*\]\.(?P<name>"
    + "|".join(sorted(VERSION_ATTRIBUTES))
    + r"))"
)
_VERSION_LEFT = re.compile(
    _VERSION_ATTR + r"\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<q>[\"'])(?P<text>[^\"']*)(?P=q)"
)
_VERSION_RIGHT = re.compile(r"(?P<q>[\"'])(?P<text>[^\"']*)(?P=q)\s*(?P<op>==|!=)\s*" + _VERSION_ATTR)
_QUANTITY_COMPARE = re.compile(
    r"(?P<attr>device\.capacity\[\s*[\"'][^\"']+[\"']\s*\]\.[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>==|!=|>=|<=|>|<)\s*"
    r"(?P<value>(?P<q>[\"'])[^\"']*(?P=q)|[0-9]+)"
)
_DOMAIN_LITERAL = re.compile(
    r"device\.(?:attributes|capacity)\[\s*" + _Q + r"(?P<domain>[a-z0-9.-]+\.[a-z0-9.-]+)(?P=q)"
)


@dataclass(frozen=True)
class Hint:
    """One suggestion: what is wrong and the expression with that mistake corrected."""

    message: str
    corrected: str


def _version_literal(text: str) -> str:
    """`semver("x")` for a strict version, `semver("x", true)` when it needs normalizing."""
    return f'semver("{text}")' if semver_error(text) is None else f'semver("{text}", true)'


def _relation(attr: str, op: str, other: str) -> str:
    if op == "==":
        return f"{attr} == {other}"
    if op == "!=":
        return f"{attr} != {other}"
    return f"{attr}.compareTo({other}) {op} 0"


def hints_for(expression: str, driver: str) -> list[Hint]:
    """Hints for the mistakes found in `expression`, for devices of `driver`."""
    found = [
        Hint(message, expression[: match.start()] + replacement + expression[match.end() :])
        for match, replacement, message in _rewrites(expression, driver)
    ]
    for match in _DOMAIN_LITERAL.finditer(expression):
        domain = match["domain"]
        if domain not in (driver, STANDARD_DOMAIN):
            found.append(
                Hint(
                    f'domain "{domain}" is not the domain of driver {driver}; its devices publish bare '
                    f'attribute names under "{driver}"',
                    expression.replace(f'"{domain}"', f'"{driver}"').replace(f"'{domain}'", f"'{driver}'"),
                )
            )
    return _unique(found)


def _rewrites(expression: str, driver: str) -> Iterator[tuple[re.Match[str], str, str]]:
    """The mistakes that rewriting one match corrects: the match, what replaces it, and why."""
    for match in _BARE_DOMAIN.finditer(expression):
        name, kind = match["name"], match["map"]
        if name in PUBLISHED_CAPACITIES and kind == "attributes":
            kind = "capacity"
        domain = STANDARD_DOMAIN if name in STANDARD_ATTRIBUTES else driver
        message = (
            f'"{name}" is an attribute name, not a domain: device.{match["map"]}["{name}"] is an '
            "empty map for every device; names are looked up under their domain"
        )
        yield match, f'device.{kind}["{domain}"].{name}', message
    for match in _MEMORY_ATTRIBUTE.finditer(expression):
        replacement = f'device.capacity["{match["domain"]}"].memory'
        message = (
            "memory is published as a capacity, not an attribute; compare it as a quantity, e.g. "
            f'{replacement}.compareTo(quantity("40Gi")) >= 0'
        )
        yield match, replacement, message
    for pattern in (_COMPUTE_DOTTED, _COMPUTE_QUOTED):
        for match in pattern.finditer(expression):
            part = match["part"]
            bare = "computeMajor" if part == "major" else "computeMinor"
            message = (
                f"`compute.{part}` is not an attribute name (a name is a C identifier, dots belong to "
                f"the domain); use the int attribute {bare} or cudaComputeCapability.{part}()"
            )
            yield match, f".{bare}" if pattern is _COMPUTE_DOTTED else f'["{bare}"]', message
    for match in _VERSION_LEFT.finditer(expression):
        message = (
            f"{match['name']} is a version (a semver value): comparing it with a string is a runtime "
            "error; compare with semver(...)"
        )
        yield match, _relation(match["attr"], match["op"], _version_literal(match["text"])), message
    for match in _VERSION_RIGHT.finditer(expression):
        message = (
            f"a string never equals the version attribute {match['name']}: this comparison is always "
            f"{'false' if match['op'] == '==' else 'true'}; compare with semver(...)"
        )
        yield match, _relation(match["attr"], match["op"], _version_literal(match["text"])), message
    for match in _QUANTITY_COMPARE.finditer(expression):
        value = match["value"].strip("\"'")
        message = "capacities are quantities: compare them with quantity(...), not with strings or numbers"
        yield match, _relation(match["attr"], match["op"], f'quantity("{value}")'), message


def _unique(hints: list[Hint]) -> list[Hint]:
    seen: set[tuple[str, str]] = set()
    out: list[Hint] = []
    for hint in hints:
        key = (hint.message, hint.corrected)
        if key not in seen:
            seen.add(key)
            out.append(hint)
    return out
