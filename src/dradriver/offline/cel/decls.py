"""Function declarations: the overload signatures the checker resolves calls against.

Every function the Kubernetes DRA environment offers is declared here with the overloads cel-go
declares (common/stdlib/standard.go, ext/strings.go v2, ext/sets.go, ext/lists.go v3, and
k8s.io/apiserver pkg/cel/library: lists.go, regex.go, quantity.go, semverlib.go, format.go). The checker
resolves calls against these signatures; at runtime one implementation per function
(`functions.RUNTIME`) dispatches on the Python types of its arguments, which is where `dyn`
values meet their real type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dradriver.offline.cel import types as t
from dradriver.offline.cel.namedformat import FORMATS


@dataclass(frozen=True)
class Overload:
    id: str
    args: tuple[t.Type, ...]
    result: t.Type
    member: bool = False
    type_params: tuple[t.Type, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        found: list[t.Type] = []

        def walk(ty: t.Type) -> None:
            if ty.kind is t.Kind.TYPE_PARAM and ty not in found:
                found.append(ty)
            for p in ty.params:
                walk(p)

        for ty in (*self.args, self.result):
            walk(ty)
        object.__setattr__(self, "type_params", tuple(found))


def ov(overload_id: str, args: Sequence[t.Type], result: t.Type, *, member: bool = False) -> Overload:
    return Overload(overload_id, tuple(args), result, member)


A = t.param("A")
B = t.param("B")
T = t.param("T")
LIST_A = t.list_of(A)
MAP_AB = t.map_of(A, B)
STRING_LIST = t.list_of(t.STRING)

# Types usable with <, isSorted, min, max, sort (cel-go comparableTypes / k8s lists.go).
COMPARABLE = (
    ("int", t.INT),
    ("uint", t.UINT),
    ("double", t.DOUBLE),
    ("bool", t.BOOL),
    ("duration", t.DURATION),
    ("timestamp", t.TIMESTAMP),
    ("string", t.STRING),
    ("bytes", t.BYTES),
)
# The same types by cel-go's type names, which ext lists' sort overload ids use.
SORTABLE = tuple(
    ({"duration": "google.protobuf.Duration", "timestamp": "google.protobuf.Timestamp"}.get(n, n), ty)
    for n, ty in COMPARABLE
)
SUMMABLE = (("int", t.INT), ("uint", t.UINT), ("double", t.DOUBLE), ("duration", t.DURATION))


def _relational(prefix: str) -> list[Overload]:
    pairs = [
        ("bool", t.BOOL, t.BOOL),
        ("int64", t.INT, t.INT),
        ("int64_double", t.INT, t.DOUBLE),
        ("int64_uint64", t.INT, t.UINT),
        ("uint64", t.UINT, t.UINT),
        ("uint64_double", t.UINT, t.DOUBLE),
        ("uint64_int64", t.UINT, t.INT),
        ("double", t.DOUBLE, t.DOUBLE),
        ("double_int64", t.DOUBLE, t.INT),
        ("double_uint64", t.DOUBLE, t.UINT),
        ("string", t.STRING, t.STRING),
        ("bytes", t.BYTES, t.BYTES),
        ("timestamp", t.TIMESTAMP, t.TIMESTAMP),
        ("duration", t.DURATION, t.DURATION),
    ]
    return [ov(f"{prefix}_{name}", [a, b], t.BOOL) for name, a, b in pairs]


def _size_overloads() -> list[Overload]:
    out: list[Overload] = []
    for name, ty in (("bytes", t.BYTES), ("list", LIST_A), ("map", MAP_AB), ("string", t.STRING)):
        out.append(ov(f"size_{name}", [ty], t.INT))
        out.append(ov(f"{name}_size", [ty], t.INT, member=True))
    return out


TIMESTAMP_GETTERS = {
    "getFullYear": "year",
    "getMonth": "month",
    "getDayOfYear": "day_of_year",
    "getDayOfMonth": "day_of_month",
    "getDate": "date",
    "getDayOfWeek": "day_of_week",
    "getHours": "hours",
    "getMinutes": "minutes",
    "getSeconds": "seconds",
    "getMilliseconds": "milliseconds",
}
_DURATION_GETTERS = ("getHours", "getMinutes", "getSeconds", "getMilliseconds")


def _getter_overloads(name: str) -> list[Overload]:
    out = [
        ov(f"timestamp_to_{TIMESTAMP_GETTERS[name]}", [t.TIMESTAMP], t.INT, member=True),
        ov(f"timestamp_to_{TIMESTAMP_GETTERS[name]}_with_tz", [t.TIMESTAMP, t.STRING], t.INT, member=True),
    ]
    if name in _DURATION_GETTERS:
        out.append(ov(f"duration_to_{TIMESTAMP_GETTERS[name]}", [t.DURATION], t.INT, member=True))
    return out


V = t.param("V")
K = t.param("K")
OPTIONAL_V = t.optional_of(V)
# `x.?f` is checked like a field selection; this is the reference cel-go records for it.
OPT_SELECT_OVERLOAD = ov("select_optional_field", [t.DYN, t.STRING], OPTIONAL_V)


def declarations() -> dict[str, list[Overload]]:
    """Function name -> overloads, for every function of the DRA CEL environment we implement."""
    d: dict[str, list[Overload]] = {
        # -- operators (standard.go) -------------------------------------------------------
        "_?_:_": [ov("conditional", [t.BOOL, A, A], A)],
        "_&&_": [ov("logical_and", [t.BOOL, t.BOOL], t.BOOL)],
        "_||_": [ov("logical_or", [t.BOOL, t.BOOL], t.BOOL)],
        "!_": [ov("logical_not", [t.BOOL], t.BOOL)],
        "@not_strictly_false": [ov("not_strictly_false", [t.BOOL], t.BOOL)],
        "_==_": [ov("equals", [A, A], t.BOOL)],
        "_!=_": [ov("not_equals", [A, A], t.BOOL)],
        "_+_": [
            ov("add_bytes", [t.BYTES, t.BYTES], t.BYTES),
            ov("add_double", [t.DOUBLE, t.DOUBLE], t.DOUBLE),
            ov("add_duration_duration", [t.DURATION, t.DURATION], t.DURATION),
            ov("add_duration_timestamp", [t.DURATION, t.TIMESTAMP], t.TIMESTAMP),
            ov("add_timestamp_duration", [t.TIMESTAMP, t.DURATION], t.TIMESTAMP),
            ov("add_int64", [t.INT, t.INT], t.INT),
            ov("add_list", [LIST_A, LIST_A], LIST_A),
            ov("add_string", [t.STRING, t.STRING], t.STRING),
            ov("add_uint64", [t.UINT, t.UINT], t.UINT),
        ],
        "_/_": [
            ov("divide_double", [t.DOUBLE, t.DOUBLE], t.DOUBLE),
            ov("divide_int64", [t.INT, t.INT], t.INT),
            ov("divide_uint64", [t.UINT, t.UINT], t.UINT),
        ],
        "_%_": [ov("modulo_int64", [t.INT, t.INT], t.INT), ov("modulo_uint64", [t.UINT, t.UINT], t.UINT)],
        "_*_": [
            ov("multiply_double", [t.DOUBLE, t.DOUBLE], t.DOUBLE),
            ov("multiply_int64", [t.INT, t.INT], t.INT),
            ov("multiply_uint64", [t.UINT, t.UINT], t.UINT),
        ],
        "-_": [ov("negate_double", [t.DOUBLE], t.DOUBLE), ov("negate_int64", [t.INT], t.INT)],
        "_-_": [
            ov("subtract_double", [t.DOUBLE, t.DOUBLE], t.DOUBLE),
            ov("subtract_duration_duration", [t.DURATION, t.DURATION], t.DURATION),
            ov("subtract_int64", [t.INT, t.INT], t.INT),
            ov("subtract_timestamp_duration", [t.TIMESTAMP, t.DURATION], t.TIMESTAMP),
            ov("subtract_timestamp_timestamp", [t.TIMESTAMP, t.TIMESTAMP], t.DURATION),
            ov("subtract_uint64", [t.UINT, t.UINT], t.UINT),
        ],
        "_<_": _relational("less"),
        "_<=_": _relational("less_equals"),
        "_>_": _relational("greater"),
        "_>=_": _relational("greater_equals"),
        "_[_]": [
            ov("index_list", [LIST_A, t.INT], A),
            ov("index_map", [MAP_AB, A], B),
            ov("optional_list_index_int", [t.optional_of(t.list_of(V)), t.INT], OPTIONAL_V),
            ov("optional_map_index_value", [t.optional_of(t.map_of(K, V)), K], OPTIONAL_V),
        ],
        # -- optional types (cel-go cel/library.go optionalLib, latest version) -------------------
        "_[?_]": [
            ov("list_optindex_optional_int", [t.list_of(V), t.INT], OPTIONAL_V),
            ov("optional_list_optindex_optional_int", [t.optional_of(t.list_of(V)), t.INT], OPTIONAL_V),
            ov("map_optindex_optional_value", [t.map_of(K, V), K], OPTIONAL_V),
            ov("optional_map_optindex_optional_value", [t.optional_of(t.map_of(K, V)), K], OPTIONAL_V),
        ],
        "optional.of": [ov("optional_of", [V], OPTIONAL_V)],
        "optional.ofNonZeroValue": [ov("optional_ofNonZeroValue", [V], OPTIONAL_V)],
        "optional.none": [ov("optional_none", [], OPTIONAL_V)],
        "value": [ov("optional_value", [OPTIONAL_V], V, member=True)],
        "hasValue": [ov("optional_hasValue", [OPTIONAL_V], t.BOOL, member=True)],
        "or": [ov("optional_or_optional", [OPTIONAL_V, OPTIONAL_V], OPTIONAL_V, member=True)],
        "orValue": [ov("optional_orValue_value", [OPTIONAL_V, V], V, member=True)],
        "first": [ov("list_first", [t.list_of(V)], OPTIONAL_V, member=True)],
        "last": [ov("list_last", [t.list_of(V)], OPTIONAL_V, member=True)],
        "optional.unwrap": [ov("optional_unwrap", [t.list_of(OPTIONAL_V)], t.list_of(V))],
        "unwrapOpt": [ov("optional_unwrapOpt", [t.list_of(OPTIONAL_V)], t.list_of(V), member=True)],
        "@in": [ov("in_list", [A, LIST_A], t.BOOL), ov("in_map", [A, MAP_AB], t.BOOL)],
        "size": _size_overloads(),
        # -- conversions --------------------------------------------------------------------
        "type": [ov("type", [A], t.type_of(A))],
        "bool": [ov("bool_to_bool", [t.BOOL], t.BOOL), ov("string_to_bool", [t.STRING], t.BOOL)],
        "bytes": [ov("bytes_to_bytes", [t.BYTES], t.BYTES), ov("string_to_bytes", [t.STRING], t.BYTES)],
        "double": [
            ov("double_to_double", [t.DOUBLE], t.DOUBLE),
            ov("int64_to_double", [t.INT], t.DOUBLE),
            ov("string_to_double", [t.STRING], t.DOUBLE),
            ov("uint64_to_double", [t.UINT], t.DOUBLE),
        ],
        "duration": [
            ov("duration_to_duration", [t.DURATION], t.DURATION),
            ov("int64_to_duration", [t.INT], t.DURATION),
            ov("string_to_duration", [t.STRING], t.DURATION),
        ],
        "dyn": [ov("to_dyn", [A], t.DYN)],
        "int": [
            ov("int64_to_int64", [t.INT], t.INT),
            ov("double_to_int64", [t.DOUBLE], t.INT),
            ov("duration_to_int64", [t.DURATION], t.INT),
            ov("string_to_int64", [t.STRING], t.INT),
            ov("timestamp_to_int64", [t.TIMESTAMP], t.INT),
            ov("uint64_to_int64", [t.UINT], t.INT),
        ],
        "string": [
            ov("string_to_string", [t.STRING], t.STRING),
            ov("bool_to_string", [t.BOOL], t.STRING),
            ov("bytes_to_string", [t.BYTES], t.STRING),
            ov("double_to_string", [t.DOUBLE], t.STRING),
            ov("duration_to_string", [t.DURATION], t.STRING),
            ov("int64_to_string", [t.INT], t.STRING),
            ov("timestamp_to_string", [t.TIMESTAMP], t.STRING),
            ov("uint64_to_string", [t.UINT], t.STRING),
            ov("ip_to_string", [t.IP], t.STRING),
            ov("cidr_to_string", [t.CIDR], t.STRING),
        ],
        "timestamp": [
            ov("timestamp_to_timestamp", [t.TIMESTAMP], t.TIMESTAMP),
            ov("int64_to_timestamp", [t.INT], t.TIMESTAMP),
            ov("string_to_timestamp", [t.STRING], t.TIMESTAMP),
        ],
        "uint": [
            ov("uint64_to_uint64", [t.UINT], t.UINT),
            ov("double_to_uint64", [t.DOUBLE], t.UINT),
            ov("int64_to_uint64", [t.INT], t.UINT),
            ov("string_to_uint64", [t.STRING], t.UINT),
        ],
        # -- strings (standard.go) ------------------------------------------------------------
        "contains": [ov("contains_string", [t.STRING, t.STRING], t.BOOL, member=True)],
        "endsWith": [ov("ends_with_string", [t.STRING, t.STRING], t.BOOL, member=True)],
        "startsWith": [ov("starts_with_string", [t.STRING, t.STRING], t.BOOL, member=True)],
        "matches": [
            ov("matches", [t.STRING, t.STRING], t.BOOL),
            ov("matches_string", [t.STRING, t.STRING], t.BOOL, member=True),
        ],
        # -- ext strings v2 -------------------------------------------------------------------
        "charAt": [ov("string_char_at_int", [t.STRING, t.INT], t.STRING, member=True)],
        "indexOf": [
            ov("string_index_of_string", [t.STRING, t.STRING], t.INT, member=True),
            ov("string_index_of_string_int", [t.STRING, t.STRING, t.INT], t.INT, member=True),
            ov("list_a_index_of_int", [LIST_A, A], t.INT, member=True),
        ],
        "lastIndexOf": [
            ov("string_last_index_of_string", [t.STRING, t.STRING], t.INT, member=True),
            ov("string_last_index_of_string_int", [t.STRING, t.STRING, t.INT], t.INT, member=True),
            ov("list_a_last_index_of_int", [LIST_A, A], t.INT, member=True),
        ],
        "lowerAscii": [ov("string_lower_ascii", [t.STRING], t.STRING, member=True)],
        "upperAscii": [ov("string_upper_ascii", [t.STRING], t.STRING, member=True)],
        "replace": [
            ov("string_replace_string_string", [t.STRING, t.STRING, t.STRING], t.STRING, member=True),
            ov(
                "string_replace_string_string_int",
                [t.STRING, t.STRING, t.STRING, t.INT],
                t.STRING,
                member=True,
            ),
        ],
        "split": [
            ov("string_split_string", [t.STRING, t.STRING], STRING_LIST, member=True),
            ov("string_split_string_int", [t.STRING, t.STRING, t.INT], STRING_LIST, member=True),
        ],
        "substring": [
            ov("string_substring_int", [t.STRING, t.INT], t.STRING, member=True),
            ov("string_substring_int_int", [t.STRING, t.INT, t.INT], t.STRING, member=True),
        ],
        "trim": [ov("string_trim", [t.STRING], t.STRING, member=True)],
        "join": [
            ov("list_join", [STRING_LIST], t.STRING, member=True),
            ov("list_join_string", [STRING_LIST, t.STRING], t.STRING, member=True),
        ],
        "strings.quote": [ov("strings_quote", [t.STRING], t.STRING)],
        "format": [ov("string_format", [t.STRING, t.list_of(t.DYN)], t.STRING, member=True)],
        # -- ext sets -------------------------------------------------------------------------
        "sets.contains": [ov("list_sets_contains_list", [t.list_of(T), t.list_of(T)], t.BOOL)],
        "sets.equivalent": [ov("list_sets_equivalent_list", [t.list_of(T), t.list_of(T)], t.BOOL)],
        "sets.intersects": [ov("list_sets_intersects_list", [t.list_of(T), t.list_of(T)], t.BOOL)],
        # -- ext lists v3 ---------------------------------------------------------------------
        "slice": [ov("list_slice", [t.list_of(T), t.INT, t.INT], t.list_of(T), member=True)],
        "flatten": [
            ov("list_flatten", [t.list_of(t.list_of(T))], t.list_of(T), member=True),
            ov("list_flatten_int", [t.list_of(t.DYN), t.INT], t.list_of(t.DYN), member=True),
        ],
        "sort": [ov(f"list_{n}_sort", [t.list_of(ty)], t.list_of(ty), member=True) for n, ty in SORTABLE],
        "@sortByAssociatedKeys": [
            ov(f"list_{n}_sortByAssociatedKeys", [t.list_of(T), t.list_of(ty)], t.list_of(T), member=True)
            for n, ty in SORTABLE
        ],
        "lists.range": [ov("lists_range", [t.INT], t.list_of(t.INT))],
        "reverse": [ov("list_reverse", [t.list_of(T)], t.list_of(T), member=True)],
        "distinct": [ov("list_distinct", [t.list_of(T)], t.list_of(T), member=True)],
        "cel.@mapInsert": [
            ov("@mapInsert_map_key_value", [MAP_AB, A, B], MAP_AB),
            ov("@mapInsert_map_map", [MAP_AB, MAP_AB], MAP_AB),
        ],
        # -- kubernetes lists library ---------------------------------------------------------
        "isSorted": [
            ov(f"list_{n}_is_sorted_bool", [t.list_of(ty)], t.BOOL, member=True) for n, ty in COMPARABLE
        ],
        "sum": [ov(f"list_{n}_sum_{n}", [t.list_of(ty)], ty, member=True) for n, ty in SUMMABLE],
        "max": [ov(f"list_{n}_max_{n}", [t.list_of(ty)], ty, member=True) for n, ty in COMPARABLE],
        "min": [ov(f"list_{n}_min_{n}", [t.list_of(ty)], ty, member=True) for n, ty in COMPARABLE],
        # -- kubernetes regex library -----------------------------------------------------------
        "find": [ov("string_find_string", [t.STRING, t.STRING], t.STRING, member=True)],
        "findAll": [
            ov("string_find_all_string", [t.STRING, t.STRING], STRING_LIST, member=True),
            ov("string_find_all_string_int", [t.STRING, t.STRING, t.INT], STRING_LIST, member=True),
        ],
        # -- kubernetes quantity library ----------------------------------------------------------
        "quantity": [ov("string_to_quantity", [t.STRING], t.QUANTITY)],
        "isQuantity": [ov("is_quantity_string", [t.STRING], t.BOOL)],
        # Declared with cel.Overload, not MemberOverload: `sign(q)`, while `q.sign()` does not compile.
        "sign": [ov("quantity_sign", [t.QUANTITY], t.INT)],
        "isGreaterThan": [
            ov("quantity_is_greater_than", [t.QUANTITY, t.QUANTITY], t.BOOL, member=True),
            ov("semver_is_greater_than", [t.SEMVER, t.SEMVER], t.BOOL, member=True),
        ],
        "isLessThan": [
            ov("quantity_is_less_than", [t.QUANTITY, t.QUANTITY], t.BOOL, member=True),
            ov("semver_is_less_than", [t.SEMVER, t.SEMVER], t.BOOL, member=True),
        ],
        "compareTo": [
            ov("quantity_compare_to", [t.QUANTITY, t.QUANTITY], t.INT, member=True),
            ov("semver_compare_to", [t.SEMVER, t.SEMVER], t.INT, member=True),
        ],
        "asApproximateFloat": [ov("quantity_get_float", [t.QUANTITY], t.DOUBLE, member=True)],
        "asInteger": [ov("quantity_get_int", [t.QUANTITY], t.INT, member=True)],
        "isInteger": [ov("quantity_is_integer", [t.QUANTITY], t.BOOL, member=True)],
        "add": [
            ov("quantity_add", [t.QUANTITY, t.QUANTITY], t.QUANTITY, member=True),
            ov("quantity_add_int", [t.QUANTITY, t.INT], t.QUANTITY, member=True),
        ],
        "sub": [
            ov("quantity_sub", [t.QUANTITY, t.QUANTITY], t.QUANTITY, member=True),
            ov("quantity_sub_int", [t.QUANTITY, t.INT], t.QUANTITY, member=True),
        ],
        # -- kubernetes semver library (version 1: with the normalize flag) -------------------------
        "semver": [
            ov("string_to_semver", [t.STRING], t.SEMVER),
            ov("string_bool_to_semver", [t.STRING, t.BOOL], t.SEMVER),
        ],
        "isSemver": [
            ov("is_semver_string", [t.STRING], t.BOOL),
            ov("is_semver_string_bool", [t.STRING, t.BOOL], t.BOOL),
        ],
        "major": [ov("semver_major", [t.SEMVER], t.INT, member=True)],
        "minor": [ov("semver_minor", [t.SEMVER], t.INT, member=True)],
        "patch": [ov("semver_patch", [t.SEMVER], t.INT, member=True)],
        # -- kubernetes ip and cidr libraries -----------------------------------------------------
        "ip": [
            ov("string_to_ip", [t.STRING], t.IP),
            ov("cidr_ip", [t.CIDR], t.IP, member=True),
        ],
        "family": [ov("ip_family", [t.IP], t.INT, member=True)],
        "ip.isCanonical": [ov("ip_is_canonical", [t.STRING], t.BOOL)],
        "isUnspecified": [ov("ip_is_unspecified", [t.IP], t.BOOL, member=True)],
        "isLoopback": [ov("ip_is_loopback", [t.IP], t.BOOL, member=True)],
        "isLinkLocalMulticast": [ov("ip_is_link_local_multicast", [t.IP], t.BOOL, member=True)],
        "isLinkLocalUnicast": [ov("ip_is_link_local_unicast", [t.IP], t.BOOL, member=True)],
        "isGlobalUnicast": [ov("ip_is_global_unicast", [t.IP], t.BOOL, member=True)],
        "isIP": [ov("is_ip", [t.STRING], t.BOOL)],
        "cidr": [ov("string_to_cidr", [t.STRING], t.CIDR)],
        "containsIP": [
            ov("cidr_contains_ip_string", [t.CIDR, t.STRING], t.BOOL, member=True),
            ov("cidr_contains_ip_ip", [t.CIDR, t.IP], t.BOOL, member=True),
        ],
        "containsCIDR": [
            ov("cidr_contains_cidr_string", [t.CIDR, t.STRING], t.BOOL, member=True),
            ov("cidr_contains_cidr", [t.CIDR, t.CIDR], t.BOOL, member=True),
        ],
        "prefixLength": [ov("cidr_prefix_length", [t.CIDR], t.INT, member=True)],
        "masked": [ov("cidr_masked", [t.CIDR], t.CIDR, member=True)],
        "isCIDR": [ov("is_cidr", [t.STRING], t.BOOL)],
        # -- DRA (dynamic-resource-allocation cel/compile.go, 1.36) --------------------------------
        "includes": [ov("dra_includes_dyn_dyn", [t.DYN, t.DYN], t.BOOL, member=True)],
        # -- kubernetes url library ---------------------------------------------------------------
        "url": [ov("string_to_url", [t.STRING], t.URL)],
        "getScheme": [ov("url_get_scheme", [t.URL], t.STRING, member=True)],
        "getHost": [ov("url_get_host", [t.URL], t.STRING, member=True)],
        "getHostname": [ov("url_get_hostname", [t.URL], t.STRING, member=True)],
        "getPort": [ov("url_get_port", [t.URL], t.STRING, member=True)],
        "getEscapedPath": [ov("url_get_escaped_path", [t.URL], t.STRING, member=True)],
        "getQuery": [ov("url_get_query", [t.URL], t.map_of(t.STRING, STRING_LIST), member=True)],
        "isURL": [ov("is_url_string", [t.STRING], t.BOOL)],
        # -- kubernetes named-format library ------------------------------------------------------
        "format.named": [ov("format-named", [t.STRING], t.optional_of(t.FORMAT))],
        "validate": [ov("format-validate", [t.FORMAT, t.STRING], t.optional_of(STRING_LIST), member=True)],
        **{f"format.{key}": [ov(f"format.{key}", [], t.FORMAT)] for key in FORMATS},
    }
    for getter in TIMESTAMP_GETTERS:
        d[getter] = _getter_overloads(getter)
    return d


# Declared for new selectors only with DRAListTypeAttributes (off in 1.36); the scheduler's
# environment for stored selectors always has them.
GATED_FUNCTIONS = frozenset({"includes"})
