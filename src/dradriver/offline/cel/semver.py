"""The `kubernetes.Semver` CEL type: blang/semver v4 parsing and ordering.

Kubernetes' semver library (`k8s.io/apiserver/pkg/cel/library/semverlib.go`) wraps
`github.com/blang/semver/v4`; parsing, the error texts and the comparison below follow that
package, and `normalize=true` follows the library's `normalizeAndParse`.
"""

from __future__ import annotations

from dataclasses import dataclass

_NUMBERS = frozenset("0123456789")
_ALPHANUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789")
_UINT64_MAX = 2**64 - 1


class SemverError(ValueError):
    """A string that blang/semver does not accept."""


def _contains_only(text: str, allowed: frozenset[str]) -> bool:
    return all(ch in allowed for ch in text)


def _has_leading_zeroes(text: str) -> bool:
    return len(text) > 1 and text[0] == "0"


def _parse_uint(text: str) -> int:
    # strconv.ParseUint(text, 10, 64); callers have checked the characters already.
    if not text:
        raise SemverError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    value = int(text)
    if value > _UINT64_MAX:
        raise SemverError(f'strconv.ParseUint: parsing "{text}": value out of range')
    return value


def _parse_number(text: str, part: str) -> int:
    if not _contains_only(text, _NUMBERS):
        raise SemverError(f"Invalid character(s) found in {part} number {_go_quote(text)}")
    if _has_leading_zeroes(text):
        raise SemverError(f"{part.capitalize()} number must not contain leading zeroes {_go_quote(text)}")
    return _parse_uint(text)


def _go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class _PreRelease:
    number: int | None
    text: str

    @classmethod
    def parse(cls, text: str) -> _PreRelease:
        if not text:
            raise SemverError("Prerelease is empty")
        if _contains_only(text, _NUMBERS):
            if _has_leading_zeroes(text):
                raise SemverError(
                    f"Numeric PreRelease version must not contain leading zeroes {_go_quote(text)}"
                )
            return cls(_parse_uint(text), text)
        if _contains_only(text, _ALPHANUM):
            return cls(None, text)
        raise SemverError(f"Invalid character(s) found in prerelease {_go_quote(text)}")

    def compare(self, other: _PreRelease) -> int:
        if self.number is not None and other.number is None:
            return -1
        if self.number is None and other.number is not None:
            return 1
        if self.number is not None and other.number is not None:
            return (self.number > other.number) - (self.number < other.number)
        return (self.text > other.text) - (self.text < other.text)


@dataclass(frozen=True, eq=False)
class Semver:
    """A semantic version as Kubernetes CEL sees it. Equality ignores build metadata."""

    major: int
    minor: int
    patch: int
    pre: tuple[_PreRelease, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, *, normalize: bool = False) -> Semver:
        """blang `semver.Parse`, or the library's `normalizeAndParse` when normalize is true."""
        if normalize:
            text = _normalize(text)
        if not text:
            raise SemverError("Version string empty")
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise SemverError("No Major.Minor.Patch elements found")
        major = _parse_number(parts[0], "major")
        minor = _parse_number(parts[1], "minor")
        patch_text = parts[2]
        build: list[str] = []
        pre_texts: list[str] = []
        if "+" in patch_text:
            patch_text, build_text = patch_text.split("+", 1)
            build = build_text.split(".")
        if "-" in patch_text:
            patch_text, pre_text = patch_text.split("-", 1)
            pre_texts = pre_text.split(".")
        patch = _parse_number(patch_text, "patch")
        pre = tuple(_PreRelease.parse(p) for p in pre_texts)
        for item in build:
            if not item:
                raise SemverError("Build meta data is empty")
            if not _contains_only(item, _ALPHANUM):
                raise SemverError(f"Invalid character(s) found in build meta data {_go_quote(item)}")
        return cls(major, minor, patch, pre, tuple(build))

    def compare(self, other: Semver) -> int:
        """blang `Version.Compare`: -1, 0 or 1; build metadata is ignored."""
        for mine, theirs in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if mine != theirs:
                return 1 if mine > theirs else -1
        if not self.pre and not other.pre:
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        for mine_pre, their_pre in zip(self.pre, other.pre, strict=False):
            result = mine_pre.compare(their_pre)
            if result:
                return result
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(p.text for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"semver({str(self)!r})"


def _normalize(text: str) -> str:
    """`normalizeAndParse` before parsing: drop a leading v, leading zeros, fill minor/patch."""
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or stripped[0] not in _NUMBERS:
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(ch in parts[-1] for ch in "+-"):
            raise SemverError("short version cannot contain PreRelease/Build meta data")
        parts.extend("0" * (3 - len(parts)))
    return ".".join(parts)
