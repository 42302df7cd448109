"""YAML and JSON text -> JSON-like data, within limits, as the API server reads it (pure, no I/O).

PyYAML's own loaders are not safe for hostile input: the C composer recurses per nesting level
(60,000 levels crash the process), the Python one raises RecursionError at about 1,000, aliases
expand without bound once anything walks the data, duplicate keys silently keep the last value,
and timestamps, sets and binary become objects JSON cannot hold. So documents are built here
straight from libyaml's event stream, iteratively, with:

- a nesting limit and a limit on nodes (aliases count as what they expand to, so an alias
  bomb is refused before anything walks it);
- duplicate keys refused, as the API server's strict decoding does (merge keys `<<` still work);
- JSON semantics, as sigs.k8s.io/yaml converts YAML: keys become strings, timestamps stay
  strings, NaN and infinities are refused, tags other than the core ones are refused.

Building from events is also about five times faster than PyYAML's C loader with its Python
constructor, because plain scalars are resolved once per distinct value.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from yaml import MarkedYAMLError, YAMLError
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

from dradriver.nesting import MAX_DEPTH, too_deep

try:
    from yaml._yaml import CParser as _Parser
except ImportError:  # PyYAML without libyaml: the pure-Python parser, also iterative
    from yaml import SafeLoader as _Parser  # type: ignore[assignment]


@dataclass(frozen=True)
class Limits:
    """What one input file may hold. Nodes are scalars, lists and maps, aliases expanded."""

    max_bytes: int
    max_depth: int = MAX_DEPTH
    max_nodes: int = 250_000


#: Claims, classes, slices, profiles, configs: sized so the largest accepted YAML file loads in
#: about a second (bench/RESULTS.md); JSON parses ~10x faster and may be larger.
YAML_LIMITS = Limits(max_bytes=2 * 1024 * 1024)
JSON_LIMITS = Limits(max_bytes=8 * 1024 * 1024, max_nodes=1_000_000)


class ParseError(ValueError):
    """The text is not acceptable input; the message is one line without the file name."""


_CORE = "tag:yaml.org,2002:"
_MERGE = object()
_NO_KEY = object()
_MEMO_MAX = 10_000
#: First characters of plain scalars that may be something other than a string (PyYAML's
#: implicit resolvers, YAML 1.1: null, bool, int, float, timestamp, merge).
_RESOLVABLE = frozenset(Resolver.yaml_implicit_resolvers)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


class _ScalarResolver(SafeConstructor):
    """YAML 1.1 core-schema scalars with JSON semantics (timestamps stay text; no NaN)."""

    def __init__(self) -> None:
        super().__init__()
        self._plain: dict[str, Any] = {}

    def plain(self, value: str, mark: Any) -> Any:
        """A plain (unquoted, untagged) scalar, resolved as PyYAML's SafeLoader would."""
        cached = self._plain.get(value, _NO_KEY)
        if cached is not _NO_KEY:
            return cached
        tag = next(
            (
                tag
                for tag, regexp in Resolver.yaml_implicit_resolvers.get(value[:1], ())
                if regexp.match(value)
            ),
            _CORE + "str",
        )
        resolved = self.tagged(tag, value, mark)
        if len(self._plain) < _MEMO_MAX:
            self._plain[value] = resolved
        return resolved

    def tagged(self, tag: str, value: str, mark: Any) -> Any:
        line = mark.line + 1 if mark is not None else 0
        kind = tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag
        if kind in ("str", "timestamp", "value", "yaml"):
            return value
        if kind == "merge":
            return _MERGE
        if kind == "null":
            return None
        if kind == "bool":
            bool_value = self.bool_values.get(value.lower())
            if bool_value is None:
                raise ParseError(f"line {line}: {value!r} is not a boolean")
            return bool_value
        node = ScalarNode(tag, value)
        try:
            if kind == "int":
                return self.construct_yaml_int(node)
            if kind == "float":
                number = self.construct_yaml_float(node)
                if not math.isfinite(number):
                    raise ParseError(f"line {line}: {value!r}: NaN and infinities are not JSON numbers")
                return number
        except ValueError as err:
            if isinstance(err, ParseError):
                raise
            raise ParseError(f"line {line}: {value!r} is not a valid {kind}") from None
        raise ParseError(
            f"line {line}: unsupported YAML tag {tag!r} (only JSON-compatible values are allowed)"
        )


def _key(value: Any, mark: Any) -> str:
    """Map keys become strings, as sigs.k8s.io/yaml turns YAML into JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    raise ParseError(f"line {_line(mark)}: a mapping key must be a scalar, not a {type(value).__name__}")


class _Frame:
    """A container being built."""

    __slots__ = ("anchor", "key", "key_mark", "merges", "value")

    def __init__(self, value: Any, anchor: str | None) -> None:
        self.value = value
        self.anchor = anchor
        self.key: Any = _NO_KEY
        self.key_mark: Any = None
        self.merges: list[Any] | None = None


def _line(mark: Any) -> int:
    return mark.line + 1 if mark is not None else 0


def _merged(frame: _Frame, mark: Any) -> dict[str, Any]:
    """Apply `<<` merge keys: explicit keys win, then earlier merged maps over later ones."""
    mapping: dict[str, Any] = frame.value
    for source in frame.merges or ():
        for item in source if isinstance(source, list) else [source]:
            if not isinstance(item, dict):
                raise ParseError(
                    f"line {_line(mark)}: a merge key (<<) needs a mapping or a list of mappings"
                )
            for key, value in item.items():
                mapping.setdefault(key, value)
    return mapping


def _shape(value: Any) -> tuple[int, int]:
    """(nodes, height) of a built value, walked iteratively; aliases inside count in full."""
    nodes = height = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        nodes += 1
        height = max(height, depth)
        if isinstance(item, dict):
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
    return nodes, height


def parse_yaml(text: str, limits: Limits = YAML_LIMITS) -> list[Any]:
    """Every document of a YAML stream as JSON-like data. Raises ParseError."""
    try:
        return _build(text, limits)
    except MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = " ".join(part for part in (err.context, err.problem) if part)
        raise ParseError(f"{where}invalid YAML: {what}") from None
    except YAMLError as err:
        raise ParseError("invalid YAML: " + " ".join(str(err).split())) from None


def _too_many(limits: Limits, mark: Any) -> ParseError:
    return ParseError(
        f"line {_line(mark)}: more than {limits.max_nodes} values (the limit), "
        "counting what aliases expand to"
    )


def _too_deep(limits: Limits, mark: Any) -> ParseError:
    return ParseError(f"line {_line(mark)}: nested deeper than {limits.max_depth} levels (the limit)")


def _build(text: str, limits: Limits) -> list[Any]:
    return _Builder(limits).build(text)


#: What an event adds: a finished node, its anchor and how many nodes it counts for; None when
#: it adds none.
_Placed = tuple[Any, str | None, int] | None


class _Builder:
    """Documents from one YAML stream's events: containers open on a stack, anchors per document.
    The event loop places scalars and finished nodes itself; the rarer events have a method each."""

    __slots__ = ("anchors", "documents", "limits", "open_anchors", "root", "scalars", "shapes", "stack")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.scalars = _ScalarResolver()
        self.documents: list[Any] = []
        self.root: Any = None
        self.stack: list[_Frame] = []
        self.anchors: dict[str, Any] = {}
        # anchor -> (nodes, height), when an alias first needs it
        self.shapes: dict[str, tuple[int, int]] = {}
        self.open_anchors: set[str] = set()

    def build(self, text: str) -> list[Any]:
        """The event loop; per node it does as little as it can (this is the hot path of every
        load), so scalars and the placing of every node stay inline."""
        get_event = _Parser(text).get_event
        scalars, stack, anchors, shapes = self.scalars, self.stack, self.anchors, self.shapes
        handlers: dict[type, Callable[[Any], _Placed]] = {
            MappingStartEvent: self.start,
            SequenceStartEvent: self.start,
            MappingEndEvent: self.end,
            SequenceEndEvent: self.end,
            AliasEvent: self.alias,
            DocumentStartEvent: self.document_start,
            DocumentEndEvent: self.document_end,
        }
        total = 0
        max_nodes = self.limits.max_nodes
        while True:
            event: Any = get_event()
            kind = type(event)
            if kind is ScalarEvent:
                value, tag = event.value, event.tag
                if tag is None:
                    if event.implicit[0] and value[:1] in _RESOLVABLE:  # else plain text: a string
                        value = scalars.plain(value, event.start_mark)
                elif tag != "!":  # "!": a non-specific tag, the text as it is
                    value = scalars.tagged(tag, value, event.start_mark)
                total += 1
                anchor = event.anchor
            elif kind is StreamEndEvent:
                return self.documents
            else:
                handle = handlers.get(kind)  # None: StreamStartEvent, nothing to do
                placed = handle(event) if handle is not None else None
                if placed is None:
                    continue
                value, anchor, nodes = placed
                total += nodes

            if total > max_nodes:
                raise _too_many(self.limits, event.start_mark)
            if anchor is not None:
                anchors[anchor] = value
                shapes.pop(anchor, None)
            if not stack:
                self.root = value
                continue
            parent = stack[-1]
            target = parent.value
            if type(target) is list:
                target.append(value)
            elif parent.key is _NO_KEY:
                parent.key = value
                parent.key_mark = event.start_mark
            else:
                _set_value(parent, value)

    def start(self, event: Any) -> _Placed:
        mapping = type(event) is MappingStartEvent
        if event.tag is not None and event.tag not in ("!", _CORE + ("map" if mapping else "seq")):
            raise ParseError(f"line {_line(event.start_mark)}: unsupported YAML tag {event.tag!r}")
        if len(self.stack) >= self.limits.max_depth:
            raise _too_deep(self.limits, event.start_mark)
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)
        self.stack.append(_Frame({} if mapping else [], event.anchor))
        return None

    def end(self, event: Any) -> _Placed:
        frame = self.stack.pop()
        value = frame.value if frame.merges is None else _merged(frame, event.start_mark)
        if frame.anchor is not None:
            self.open_anchors.discard(frame.anchor)
        return value, frame.anchor, 1

    def alias(self, event: Any) -> _Placed:
        name = event.anchor
        if name in self.open_anchors:
            raise ParseError(
                f"line {_line(event.start_mark)}: alias *{name} refers to a node that contains it"
            )
        if name not in self.anchors:
            raise ParseError(f"line {_line(event.start_mark)}: alias *{name} names no anchor")
        value = self.anchors[name]
        if name not in self.shapes:
            self.shapes[name] = _shape(value)
        nodes, height = self.shapes[name]
        if len(self.stack) + height > self.limits.max_depth:
            raise _too_deep(self.limits, event.start_mark)
        return value, None, nodes

    def document_start(self, _event: Any) -> _Placed:
        self.anchors.clear()  # anchors are per document
        self.shapes.clear()
        self.root = None
        return None

    def document_end(self, _event: Any) -> _Placed:
        self.documents.append(self.root)
        return None


def _set_value(parent: _Frame, value: Any) -> None:
    """A mapping's value for the key before it; `<<` keys collect maps to merge."""
    key = parent.key
    parent.key = _NO_KEY
    if key is _MERGE:
        if parent.merges is None:
            parent.merges = []
        parent.merges.append(value)
        return
    if type(key) is not str:
        key = _key(key, parent.key_mark)
    if key in parent.value:
        raise ParseError(f"line {_line(parent.key_mark)}: duplicate key {key!r}")
    parent.value[key] = value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ParseError(f"duplicate key {duplicate!r}")
    return mapping


def _no_constant(name: str) -> Any:
    raise ParseError(f"{name} is not a JSON number")


def parse_json(text: str, limits: Limits = JSON_LIMITS) -> Any:
    """One JSON document (strict: no duplicate keys, NaN or infinities). Raises ParseError."""
    # Count values before building them: an array of a million empty objects is small text
    # but hundreds of MB of Python objects.
    outside_strings = _JSON_STRING.sub("", text)
    values = sum(outside_strings.count(c) for c in ",[{") + 1
    if values > limits.max_nodes:
        raise ParseError(f"more than {limits.max_nodes} values (the limit)")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise ParseError(f"nested deeper than {limits.max_depth} levels (the limit)") from None
    except json.JSONDecodeError as err:
        raise ParseError(f"invalid JSON: {err}") from None
    _check_depth(data, limits)
    return data


def _check_depth(data: Any, limits: Limits) -> None:
    if too_deep(data, limits.max_depth) is not None:
        raise ParseError(f"nested deeper than {limits.max_depth} levels (the limit)")


def looks_like_json(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def parse_documents(text: str, *, json_text: bool | None = None) -> list[Any]:
    """All documents of YAML or JSON text (JSON when `json_text`, or when None and it starts
    like JSON). A JSON file holds one document; YAML may hold several."""
    if json_text if json_text is not None else looks_like_json(text):
        return [parse_json(text)]
    return parse_yaml(text)
