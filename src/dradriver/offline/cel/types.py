"""Static CEL types and the checker's type unification, ported from cel-go.

The rules mirror `cel-go/checker/types.go` (v0.26.0, the version Kubernetes 1.36 builds with):
`is_assignable` binds type parameters through a substitution mapping, `dyn` and
`google.protobuf.Any` are assignable both ways, and `most_general` picks the less specific of
two types when joining. Keeping the port close to the original is what makes our compile errors
(`found no matching overload ...`) appear exactly where the API server reports them.
"""

from __future__ import annotations

from enum import Enum


class Kind(Enum):
    ANY = "any"
    BOOL = "bool"
    BYTES = "bytes"
    DOUBLE = "double"
    DURATION = "duration"
    DYN = "dyn"
    ERROR = "error"
    INT = "int"
    LIST = "list"
    MAP = "map"
    NULL = "null_type"
    OPAQUE = "opaque"
    STRING = "string"
    STRUCT = "struct"
    TIMESTAMP = "timestamp"
    TYPE = "type"
    TYPE_PARAM = "type_param"
    UINT = "uint"


class Type:
    """A static CEL type: kind, name and type parameters (list element, map key/value, ...).

    Immutable; the hash is computed once because the checker hashes types constantly.
    """

    __slots__ = ("_hash", "free", "kind", "name", "nullable", "params")

    kind: Kind
    name: str
    params: tuple[Type, ...]
    #: A protobuf wrapper type (cel-go NewNullableType): the primitive's kind and name, but null
    #: is assignable to it.
    nullable: bool
    free: bool
    _hash: int

    def __init__(
        self, kind: Kind, name: str, params: tuple[Type, ...] = (), *, nullable: bool = False
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "nullable", nullable)
        object.__setattr__(self, "_hash", hash((kind.value, name, params, nullable)))
        # Whether a type parameter occurs inside: substitution leaves other types untouched.
        object.__setattr__(self, "free", kind is Kind.TYPE_PARAM or any(p.free for p in params))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Type is immutable")

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Type):
            return NotImplemented
        return (
            self._hash == other._hash
            and self.kind is other.kind
            and self.name == other.name
            and self.params == other.params
            and self.nullable == other.nullable
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Type({format_type(self)})"

    def __str__(self) -> str:
        return format_type(self)


def _simple(kind: Kind, name: str) -> Type:
    return Type(kind, name)


ANY = _simple(Kind.ANY, "google.protobuf.Any")
BOOL = _simple(Kind.BOOL, "bool")
BYTES = _simple(Kind.BYTES, "bytes")
DOUBLE = _simple(Kind.DOUBLE, "double")
DURATION = _simple(Kind.DURATION, "google.protobuf.Duration")
DYN = _simple(Kind.DYN, "dyn")
ERROR = _simple(Kind.ERROR, "error")
INT = _simple(Kind.INT, "int")
NULL = _simple(Kind.NULL, "null_type")
STRING = _simple(Kind.STRING, "string")
TIMESTAMP = _simple(Kind.TIMESTAMP, "google.protobuf.Timestamp")
UINT = _simple(Kind.UINT, "uint")
TYPE = _simple(Kind.TYPE, "type")

OPTIONAL_NAME = "optional_type"
EMPTY = Type(Kind.STRUCT, "google.protobuf.Empty")
QUANTITY = Type(Kind.STRUCT, "kubernetes.Quantity")
SEMVER = Type(Kind.STRUCT, "kubernetes.Semver")
URL = Type(Kind.STRUCT, "kubernetes.URL")
FORMAT = Type(Kind.STRUCT, "kubernetes.NamedFormat")
IP = Type(Kind.OPAQUE, "net.IP")
CIDR = Type(Kind.OPAQUE, "net.CIDR")


def list_of(elem: Type) -> Type:
    return Type(Kind.LIST, "list", (elem,))


def map_of(key: Type, value: Type) -> Type:
    return Type(Kind.MAP, "map", (key, value))


def optional_of(value: Type) -> Type:
    """cel-go's optional_type(T), an opaque type with one parameter."""
    return Type(Kind.OPAQUE, OPTIONAL_NAME, (value,))


def unwrap_optional(ty: Type) -> tuple[Type, bool]:
    """checker maybeUnwrapOptional: the value type of an optional type, and whether it was one."""
    if ty.kind is Kind.OPAQUE and ty.name == OPTIONAL_NAME and ty.params:
        return ty.params[0], True
    return ty, False


def wrapper_of(primitive: Type) -> Type:
    """wrapper(T): the type of a google.protobuf wrapper message (e.g. Int64Value for int)."""
    return Type(primitive.kind, primitive.name, primitive.params, nullable=True)


def type_of(param: Type) -> Type:
    """The type of a type value, e.g. `type(int)`."""
    return Type(Kind.TYPE, "type", (param,))


def param(name: str) -> Type:
    return Type(Kind.TYPE_PARAM, name)


def opaque(name: str, *params: Type) -> Type:
    return Type(Kind.OPAQUE, name, params)


def declared_name(t: Type) -> str:
    """cel-go Type.DeclaredTypeName: the runtime type name, or `wrapper(T)` for a wrapper type."""
    return f"wrapper({t.name})" if t.nullable else t.name


def is_exact(t1: Type, t2: Type) -> bool:
    """cel-go Type.IsExactType: kinds, names and parameters agree (a wrapper is its primitive)."""
    return (
        t1.kind is t2.kind
        and t1.name == t2.name
        and len(t1.params) == len(t2.params)
        and all(is_exact(p1, p2) for p1, p2 in zip(t1.params, t2.params, strict=True))
    )


def format_type(t: Type) -> str:
    """Render a type the way cel-go's FormatCELType does in checker messages."""
    if t.nullable:
        return declared_name(t)
    if t.kind is Kind.ANY:
        return "any"
    if t.kind is Kind.DURATION:
        return "duration"
    if t.kind is Kind.TIMESTAMP:
        return "timestamp"
    if t.kind is Kind.ERROR:
        return "!error!"
    if t.kind is Kind.NULL:
        return "null"
    if t.kind is Kind.TYPE_PARAM:
        return t.name
    if not t.params:
        return t.name
    return f"{t.name}({', '.join(format_type(p) for p in t.params)})"


def is_dyn(t: Type) -> bool:
    return t.kind in (Kind.DYN, Kind.ANY)


def is_dyn_or_error(t: Type) -> bool:
    return t.kind is Kind.ERROR or is_dyn(t)


class Mapping:
    """Type-parameter substitutions collected while checking one expression."""

    __slots__ = ("_subs",)

    def __init__(self, subs: dict[Type, Type] | None = None) -> None:
        self._subs: dict[Type, Type] = dict(subs or {})

    def find(self, t: Type) -> Type | None:
        return self._subs.get(t)

    def add(self, from_type: Type, to_type: Type) -> None:
        self._subs[from_type] = to_type

    def copy(self) -> Mapping:
        return Mapping(self._subs)


def _type_is_dyn_like(t: Type) -> bool:
    # cel-go's Type.isDyn also counts type parameters.
    return t.kind in (Kind.DYN, Kind.ANY, Kind.TYPE_PARAM)


def _is_assignable_type(target: Type, from_type: Type) -> bool:
    """cel-go's Type.IsAssignableType (defaultIsAssignableType, or NewNullableType's)."""
    if target.nullable:
        primitive = Type(target.kind, target.name, target.params)
        return from_type.kind is Kind.NULL or _is_assignable_type(primitive, from_type)
    if target == from_type or _type_is_dyn_like(target):
        return True
    if target.kind is not from_type.kind or target.name != from_type.name:
        return False
    if len(target.params) != len(from_type.params):
        return False
    return all(_is_assignable_type(tp, fp) for tp, fp in zip(target.params, from_type.params, strict=True))


def _is_equal_or_less_specific(t1: Type, t2: Type) -> bool:
    if is_dyn(t1) or t1.kind is Kind.TYPE_PARAM:
        return True
    if is_dyn(t2) or t2.kind is Kind.TYPE_PARAM:
        return False
    if t1.kind is not t2.kind:
        return False
    if t1.kind is Kind.OPAQUE:
        if t1.name != t2.name or len(t1.params) != len(t2.params):
            return False
        return all(_is_equal_or_less_specific(a, b) for a, b in zip(t1.params, t2.params, strict=True))
    if t1.kind is Kind.LIST:
        return _is_equal_or_less_specific(t1.params[0], t2.params[0])
    if t1.kind is Kind.MAP:
        return _is_equal_or_less_specific(t1.params[0], t2.params[0]) and _is_equal_or_less_specific(
            t1.params[1], t2.params[1]
        )
    if t1.kind is Kind.TYPE:
        return True
    return is_exact(t1, t2)


def most_general(t1: Type, t2: Type) -> Type:
    return t1 if _is_equal_or_less_specific(t1, t2) else t2


def _not_referenced_in(m: Mapping, t: Type, within: Type) -> bool:
    if is_exact(t, within):
        return False
    if within.kind is Kind.TYPE_PARAM:
        sub = m.find(within)
        return True if sub is None else _not_referenced_in(m, t, sub)
    if within.kind in (Kind.OPAQUE, Kind.LIST, Kind.MAP, Kind.TYPE):
        return all(_not_referenced_in(m, t, p) for p in within.params)
    return True


def _is_valid_type_substitution(m: Mapping, t1: Type, t2: Type) -> tuple[bool, bool]:
    if is_exact(t1, t2):
        return True, True
    sub = m.find(t2)
    if sub is not None:
        if is_exact(t1, sub):
            return True, True
        if _internal_is_assignable(m, t1, sub):
            new = most_general(t1, sub)
            if _not_referenced_in(m, t2, new):
                m.add(t2, new)
            return True, True
        return False, True
    if _not_referenced_in(m, t2, t1):
        m.add(t2, t1)
        return True, False
    return False, False


def _is_legacy_nullable(t: Type) -> bool:
    return t.kind in (Kind.OPAQUE, Kind.STRUCT, Kind.ANY, Kind.DURATION, Kind.TIMESTAMP)


def _is_assignable_null(t: Type) -> bool:
    return _is_legacy_nullable(t) or _is_assignable_type(t, NULL)


def _internal_is_assignable(m: Mapping, t1: Type, t2: Type) -> bool:
    if t2.kind is Kind.TYPE_PARAM:
        valid, has_sub = _is_valid_type_substitution(m, t1, t2)
        if valid:
            return True
        if has_sub:
            return False
    if t1.kind is Kind.TYPE_PARAM:
        valid, _ = _is_valid_type_substitution(m, t2, t1)
        return valid
    if is_dyn_or_error(t1) or is_dyn_or_error(t2):
        return True
    if t1.kind is Kind.NULL:
        return _is_assignable_null(t2)
    if t2.kind is Kind.NULL:
        return _is_assignable_null(t1)
    if t1.kind in (
        Kind.BOOL,
        Kind.BYTES,
        Kind.DOUBLE,
        Kind.INT,
        Kind.STRING,
        Kind.UINT,
        Kind.ANY,
        Kind.DURATION,
        Kind.TIMESTAMP,
        Kind.STRUCT,
    ):
        return _is_assignable_type(t2, t1)
    if t1.kind is Kind.TYPE:
        return t2.kind is Kind.TYPE
    if t1.kind in (Kind.OPAQUE, Kind.LIST, Kind.MAP):
        return (
            t1.kind is t2.kind
            and t1.name == t2.name
            and len(t1.params) == len(t2.params)
            and all(_internal_is_assignable(m, a, b) for a, b in zip(t1.params, t2.params, strict=True))
        )
    return False


def is_assignable(m: Mapping, t1: Type, t2: Type) -> Mapping | None:
    """Whether a value of type t2 may be used where t1 is expected; the extended mapping if so."""
    copy = m.copy()
    return copy if _internal_is_assignable(copy, t1, t2) else None


def is_assignable_list(m: Mapping, l1: list[Type], l2: list[Type]) -> Mapping | None:
    if len(l1) != len(l2):
        return None
    copy = m.copy()
    for a, b in zip(l1, l2, strict=True):
        if not _internal_is_assignable(copy, a, b):
            return None
    return copy


def substitute(m: Mapping, t: Type, type_param_to_dyn: bool) -> Type:
    if not t.free:
        return t
    sub = m.find(t)
    if sub is not None:
        return substitute(m, sub, type_param_to_dyn)
    if type_param_to_dyn and t.kind is Kind.TYPE_PARAM:
        return DYN
    if t.kind in (Kind.OPAQUE, Kind.LIST, Kind.MAP, Kind.TYPE) and t.params:
        return Type(t.kind, t.name, tuple(substitute(m, p, type_param_to_dyn) for p in t.params))
    return t
