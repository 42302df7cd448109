"""Rewriting CEL selectors and qualified attribute names written for NVIDIA's driver (pure).

An expression is edited in place, token by token, so that its layout, comments and everything
that does not name NVIDIA's driver stay as written:

- `device.attributes["gpu.nvidia.com"].NAME` (also `["NAME"]`, `has(...)` and `"NAME" in ...`)
  becomes the dradriver attribute `migrate.nvidia` maps NAME to, in its domain;
- the same for `device.capacity[...]` and the standard domain's renamed attributes;
- the string `"gpu.nvidia.com"` anywhere else (`device.driver == ...`) becomes our driver name.

Whatever has no equivalent is a problem, never dropped. The result must compile and may look up
only attributes and capacities dradriver publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dradriver.devicemodel import attributes as published
from dradriver.devicemodel.attributes import DeviceType
from dradriver.offline.cel import CELCompileError, compile_selector
from dradriver.offline.cel.errors import COMPILATION_FAILED
from dradriver.offline.cel.parser import lex, literal_value
from dradriver.offline.migrate import nvidia

_ALL_TYPES: frozenset[DeviceType] = frozenset({"gpu", "mig"})


@dataclass
class Rewrite:
    """A rewritten expression, what changed (one line each) and what could not be translated."""

    expression: str
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


@dataclass(frozen=True)
class _Ref:
    """`device.attributes[domain]` or `device.capacity[domain]`, and the token naming the entry."""

    kind: str  # "attributes" | "capacity"
    domain_token: Any
    domain: str
    name_token: Any | None
    name: str | None


def _first_line(message: str) -> str:
    return message.removeprefix(COMPILATION_FAILED).splitlines()[0]


def _string_token(token: Any) -> str | None:
    if token.type not in ("STRING_LIT", "MLSTRING_LIT"):
        return None
    value = literal_value(token)
    return value if isinstance(value, str) else None


def _refs(tokens: list[Any]) -> list[_Ref]:
    found = []
    for i in range(len(tokens) - 5):
        t = tokens[i : i + 6]
        if not (
            t[0].type == "IDENT"
            and str(t[0]) == "device"
            and t[1].type == "DOT"
            and t[2].type == "IDENT"
            and str(t[2]) in ("attributes", "capacity")
            and t[3].type == "LSQB"
            and t[5].type == "RSQB"
        ):
            continue
        domain = _string_token(t[4])
        if domain is None:
            continue
        after = tokens[i + 6 : i + 9]
        name_token = None
        if len(after) >= 2 and after[0].type == "DOT" and after[1].type == "IDENT":
            if len(after) < 3 or after[2].type != "LPAR":  # not a method call on the map itself
                name_token = after[1]
        elif len(after) == 3 and after[0].type == "LSQB" and after[2].type == "RSQB":
            name_token = after[1] if _string_token(after[1]) is not None else None
        elif i >= 2 and tokens[i - 1].type == "IN":
            name_token = tokens[i - 2] if _string_token(tokens[i - 2]) is not None else None
        name = None if name_token is None else (_string_token(name_token) or str(name_token))
        found.append(_Ref(str(t[2]), t[4], domain, name_token, name))
    return found


def _span(token: Any) -> tuple[int, int]:
    return int(token.start_pos), int(token.end_pos)


def _quoted(token: Any, value: str) -> str:
    """`value` as a string literal in the quoting style of `token`."""
    text = str(token)
    prefix = text[: len(text) - len(text.lstrip("rR"))]
    body = text[len(prefix) :]
    quote = body[:3] if body[:3] in ('"""', "'''") else body[0]
    return f"{prefix}{quote}{value}{quote}"


def map_attribute(
    domain: str, name: str, driver: str, device_types: frozenset[DeviceType]
) -> tuple[str, str, str] | str:
    """(domain, name, note) of the dradriver attribute for NVIDIA's `domain`/`name`, or a problem.

    Names outside NVIDIA's domain and the standard one are returned unchanged (another driver's).
    """
    if domain == driver:
        return (
            (domain, name, "") if name in published.BY_NAME else f"dradriver publishes no attribute {name!r}"
        )
    if domain not in (nvidia.DRIVER, nvidia.STANDARD_DOMAIN):
        return domain, name, ""
    qualified = name if domain == nvidia.DRIVER else f"{domain}/{name}"
    known = nvidia.attribute(qualified)
    if known is None:
        if domain == nvidia.STANDARD_DOMAIN:
            return domain, name, ""  # a standard attribute of another driver, if any
        return f"NVIDIA's driver publishes no attribute {name!r} (and dradriver has no equivalent)"
    if name == "index" and "mig" in device_types:
        return nvidia.MIG_INDEX_NOTE
    if known.ours is None:
        return f"attribute {qualified}: {known.note}"
    new_domain, _, new_name = known.ours.rpartition("/")
    new_domain = new_domain or driver
    note = (
        f"{qualified} -> {known.ours}" + (f" ({known.note})" if known.note else "") if known.renamed else ""
    )
    return new_domain, new_name, note


def _map_capacity(domain: str, name: str, driver: str) -> tuple[str, str] | str:
    if domain == driver:
        return (domain, name) if name in published.CAPACITIES else f"dradriver publishes no capacity {name!r}"
    if domain != nvidia.DRIVER:
        return domain, name
    if name in nvidia.CAPACITIES:
        return driver, name
    key = "memorySlice" if nvidia.MEMORY_SLICE.fullmatch(name) else name
    reason = nvidia.UNSUPPORTED_CAPACITIES.get(key, "NVIDIA's driver publishes no such capacity")
    return f"capacity {name}: {reason}"


def _rename(
    ref: _Ref, name: str, driver: str, device_types: frozenset[DeviceType], out: Rewrite
) -> tuple[str, str] | None:
    """The (domain, name) a reference to entry `name` becomes, or None with the problem added
    to `out`."""
    if ref.kind != "attributes":
        capacity = _map_capacity(ref.domain, name, driver)
        if isinstance(capacity, str):
            out.problems.append(capacity)
            return None
        return capacity
    mapped = map_attribute(ref.domain, name, driver, device_types)
    if isinstance(mapped, str):
        out.problems.append(mapped)
        return None
    new_domain, new_name, note = mapped
    if note:
        out.note(note)
    return new_domain, new_name


def _driver_strings(
    tokens: list[Any], driver: str, in_refs: set[int], edits: dict[int, tuple[int, str]], out: Rewrite
) -> None:
    """String literals outside references that name NVIDIA's drivers: its GPU driver becomes
    `driver` (an edit); the others have no counterpart here (a problem)."""
    for token in tokens:
        value = _string_token(token)
        start, end = _span(token)
        if value is None or start in in_refs or start in edits:
            continue
        if value == nvidia.DRIVER:
            edits[start] = (end, _quoted(token, driver))
            out.note(f"driver {nvidia.DRIVER} -> {driver}")
        elif value == nvidia.COMPUTE_DOMAIN_DRIVER:
            out.problems.append(nvidia.COMPUTE_DOMAINS)
        elif value == "vfio":
            out.problems.append(nvidia.VFIO)


def rewrite(expression: str, *, driver: str, device_types: frozenset[DeviceType] = _ALL_TYPES) -> Rewrite:
    """The expression for dradriver (`driver`), for requests of these device types."""
    out = Rewrite(expression)
    try:
        tokens = lex(expression)
    except CELCompileError as err:
        out.problems.append(f"does not compile: {_first_line(err.message)}")
        return out
    edits: dict[int, tuple[int, str]] = {}
    in_refs: set[int] = set()
    for ref in _refs(tokens):
        in_refs.add(_span(ref.domain_token)[0])
        if ref.name is None or ref.name_token is None:
            if ref.domain == nvidia.DRIVER:
                out.problems.append(
                    f"device.{ref.kind}[{ref.domain_token!s}] is used as a whole map: name the "
                    "attribute so that it can be translated"
                )
            continue
        renamed = _rename(ref, ref.name, driver, device_types, out)
        if renamed is None:
            continue
        new_domain, new_name = renamed
        if new_domain != ref.domain:
            edits[ref.domain_token.start_pos] = (
                ref.domain_token.end_pos,
                _quoted(ref.domain_token, new_domain),
            )
            out.note(f"domain {ref.domain} -> {new_domain}")
        if new_name != ref.name:
            token = ref.name_token
            text = _quoted(token, new_name) if _string_token(token) is not None else new_name
            start, end = _span(token)
            edits[start] = (end, text)
    _driver_strings(tokens, driver, in_refs, edits, out)
    text = expression
    for start in sorted(edits, reverse=True):
        end, replacement = edits[start]
        text = text[:start] + replacement + text[end:]
    out.expression = text
    if not out.problems:
        try:
            compile_selector(text)
        except CELCompileError as err:
            out.problems.append(f"does not compile: {_first_line(err.message)}")
    return out


def rewrite_qualified(
    name: str, *, driver: str, device_types: frozenset[DeviceType]
) -> tuple[str, str] | str:
    """A constraint's qualified attribute (`gpu.nvidia.com/parentUUID`): (new name, note) or a problem."""
    domain, slash, bare = name.rpartition("/")
    if not slash:
        return name, ""
    mapped = map_attribute(domain, bare, driver, device_types)
    if isinstance(mapped, str):
        return mapped
    new_domain, new_name, note = mapped
    return f"{new_domain}/{new_name}", note
