"""The CEL type checker, ported from cel-go checker/checker.go for the DRA environment.

It reports the compile errors the API server reports (undeclared references, undefined fields,
no matching overloads, non-bool results, mixed-type list and map literals, invalid regex and
duration/timestamp literals) and records each node's type and the overloads its call may use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dradriver.offline.cel import ast
from dradriver.offline.cel import types as t
from dradriver.offline.cel.decls import OPT_SELECT_OVERLOAD, Overload
from dradriver.offline.cel.parser import format_issue
from dradriver.offline.cel.values import UInt


class CheckError(Exception):
    def __init__(self, message: str, pos: tuple[int, int]) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


# The `device` variable (dynamic-resource-allocation cel/compile.go, deviceTypeV134ConsumableCapacity).
DEVICE_TYPE_NAME = "kubernetes.DRADevice"
DEVICE_TYPE = t.Type(t.Kind.STRUCT, DEVICE_TYPE_NAME)
ATTRIBUTES_TYPE = t.map_of(t.STRING, t.map_of(t.STRING, t.ANY))
CAPACITY_TYPE = t.map_of(t.STRING, t.map_of(t.STRING, t.QUANTITY))
DEVICE_FIELDS: dict[str, t.Type] = {
    "driver": t.STRING,
    "attributes": ATTRIBUTES_TYPE,
    "capacity": CAPACITY_TYPE,
    "allowMultipleAllocations": t.BOOL,
}
STRUCT_FIELDS: dict[str, dict[str, t.Type]] = {DEVICE_TYPE_NAME: DEVICE_FIELDS}
# With DRAListTypeAttributes the attribute values are dyn (deviceTypeV136ListTypeAttributes),
# so that lists can be ranged over; without it they are the `any` type.
LIST_ATTRIBUTES_STRUCT_FIELDS = {
    DEVICE_TYPE_NAME: {**DEVICE_FIELDS, "attributes": t.map_of(t.STRING, t.map_of(t.STRING, t.DYN))}
}

# Type identifiers of the standard environment (stdlib Types()) and the Kubernetes libraries.
TYPE_IDENTS: dict[str, t.Type] = {
    "bool": t.BOOL,
    "bytes": t.BYTES,
    "double": t.DOUBLE,
    "google.protobuf.Duration": t.DURATION,
    "int": t.INT,
    "list": t.list_of(t.param("A")),
    "map": t.map_of(t.param("A"), t.param("B")),
    "null_type": t.NULL,
    "string": t.STRING,
    "google.protobuf.Timestamp": t.TIMESTAMP,
    "type": t.TYPE,
    "uint": t.UINT,
    "net.IP": t.IP,
    "net.CIDR": t.CIDR,
    "optional_type": t.optional_of(t.param("A")),
}
# The protobuf wrapper messages of cel-go's default registry: wrapper(T), built by message literals.
WRAPPER_TYPES: dict[str, t.Type] = {
    "google.protobuf.BoolValue": t.BOOL,
    "google.protobuf.BytesValue": t.BYTES,
    "google.protobuf.DoubleValue": t.DOUBLE,
    "google.protobuf.FloatValue": t.DOUBLE,
    "google.protobuf.Int32Value": t.INT,
    "google.protobuf.Int64Value": t.INT,
    "google.protobuf.StringValue": t.STRING,
    "google.protobuf.UInt32Value": t.UINT,
    "google.protobuf.UInt64Value": t.UINT,
}
TYPE_IDENTS.update({name: t.wrapper_of(primitive) for name, primitive in WRAPPER_TYPES.items()})
_JSON_OBJECT = t.map_of(t.STRING, t.DYN)
_JSON_LIST = t.list_of(t.DYN)
# The other well-known messages of the registry, by what their literals build: Any the message it
# packs, the JSON messages JSON values (cel-go's checker maps them to these types), Empty itself.
MESSAGE_TYPES: dict[str, t.Type] = {
    "google.protobuf.Any": t.ANY,
    "google.protobuf.Struct": _JSON_OBJECT,
    "google.protobuf.ListValue": _JSON_LIST,
    "google.protobuf.Value": t.DYN,
    "google.protobuf.Empty": t.EMPTY,
}
TYPE_IDENTS.update(MESSAGE_TYPES)
# Enum values are int constants (the registry's only enum: NullValue).
ENUM_VALUES = {"google.protobuf.NullValue.NULL_VALUE": 0}
# checker.go getWellKnownTypeName: a message literal of a wrapper type looks its fields up in the
# message named by the kind (an Int32Value's in Int64Value).
_WELL_KNOWN_MESSAGES = {
    t.Kind.BOOL: "google.protobuf.BoolValue",
    t.Kind.BYTES: "google.protobuf.BytesValue",
    t.Kind.DOUBLE: "google.protobuf.DoubleValue",
    t.Kind.INT: "google.protobuf.Int64Value",
    t.Kind.STRING: "google.protobuf.StringValue",
    t.Kind.UINT: "google.protobuf.UInt64Value",
    t.Kind.NULL: "google.protobuf.NullValue",
    t.Kind.TIMESTAMP: "google.protobuf.Timestamp",
    t.Kind.DURATION: "google.protobuf.Duration",
}
# What the type provider's FindStructFieldType answers for a message literal's field (as probed on
# Kubernetes): the wrappers' `value`, a Timestamp's or Duration's `seconds` and `nanos`; the
# primitive types are found but have no fields; `map` takes any field; any other name is not found
# ("unexpected failed resolution").
_MESSAGE_FIELDS: dict[str, dict[str, t.Type]] = {
    **{_WELL_KNOWN_MESSAGES[p.kind]: {"value": p} for p in set(WRAPPER_TYPES.values())},
    **{
        _WELL_KNOWN_MESSAGES[k]: {"seconds": t.INT, "nanos": t.INT}
        for k in (t.Kind.TIMESTAMP, t.Kind.DURATION)
    },
    **{name: {} for name in ("bool", "bytes", "double", "int", "uint", "string", "list")},
    "google.protobuf.Any": {"type_url": t.STRING, "value": t.BYTES},
    "google.protobuf.Struct": {"fields": _JSON_OBJECT},
    "google.protobuf.ListValue": {"values": _JSON_LIST},
    "google.protobuf.Value": {
        "null_value": t.INT,
        "number_value": t.DOUBLE,
        "string_value": t.STRING,
        "bool_value": t.BOOL,
        "struct_value": _JSON_OBJECT,
        "list_value": _JSON_LIST,
    },
    "google.protobuf.Empty": {},
}


@dataclass
class CheckResult:
    types: dict[ast.Expr, t.Type] = field(default_factory=dict)
    overloads: dict[ast.Expr, list[Overload]] = field(default_factory=dict)
    # Names that resolve to a type identifier (e.g. `int` in `type(x) == int`).
    type_idents: dict[ast.Expr, t.Type] = field(default_factory=dict)
    # Names that resolve to an enum value (the planner makes them constants).
    enum_values: dict[ast.Expr, int] = field(default_factory=dict)
    # Calls written as `ns.fn(...)` that resolved to the global function `ns.fn`.
    qualified_calls: dict[ast.Expr, str] = field(default_factory=dict)


class _Scope:
    def __init__(self, parent: _Scope | None = None) -> None:
        self.parent = parent
        self.idents: dict[str, t.Type] = {}

    def lookup(self, name: str) -> t.Type | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.idents:
                return scope.idents[name]
            scope = scope.parent
        return None


class Checker(ast.Visitor[None]):
    """cel-go's checker: every problem is recorded and checking goes on with the error type, so
    that one expression reports all its errors, as the API server does."""

    def __init__(
        self,
        functions: dict[str, list[Overload]],
        variables: dict[str, t.Type],
        struct_fields: dict[str, dict[str, t.Type]] = STRUCT_FIELDS,
    ) -> None:
        self.functions = functions
        self.struct_fields = struct_fields
        self.scope = _Scope()
        self.scope.idents.update(variables)
        self.mapping = t.Mapping()
        self.result = CheckResult()
        self.errors: list[CheckError] = []
        self._type_var_counter = 0

    # -- entry point --------------------------------------------------------------------------

    def check(self, expr: ast.Expr) -> CheckResult:
        self._check(expr)
        for node, ty in list(self.result.types.items()):
            self.result.types[node] = t.substitute(self.mapping, ty, True)
        return self.result

    def _error(self, message: str, pos: tuple[int, int]) -> None:
        self.errors.append(CheckError(message, pos))

    # -- helpers ------------------------------------------------------------------------------

    def _set(self, node: ast.Expr, ty: t.Type) -> None:
        self.result.types[node] = ty

    def _get(self, node: ast.Expr) -> t.Type:
        return self.result.types[node]

    def _new_type_var(self) -> t.Type:
        name = f"_var{self._type_var_counter}"
        self._type_var_counter += 1
        return t.param(name)

    def _is_assignable(self, t1: t.Type, t2: t.Type) -> bool:
        mapping = t.is_assignable(self.mapping, t1, t2)
        if mapping is None:
            return False
        self.mapping = mapping
        return True

    def _lookup_ident(self, name: str) -> tuple[t.Type, bool] | None:
        found = self.scope.lookup(name)
        if found is not None:
            return found, False
        if name in TYPE_IDENTS:
            return t.type_of(TYPE_IDENTS[name]), True
        return None

    # -- expressions --------------------------------------------------------------------------

    def _check(self, e: ast.Expr) -> None:
        self.visit(e)

    def visit_literal(self, e: ast.Literal) -> None:
        self._set(e, _literal_type(e.value))

    def visit_ident(self, e: ast.Ident) -> None:
        name = e.name.removeprefix(".")
        found = self._lookup_ident(name)
        if found is None:
            self._set(e, t.ERROR)
            # A root-scoped name (`.x`) is reported as written.
            self._error(f"undeclared reference to '{e.name}' (in container '')", e.pos)
            return
        ty, is_type = found
        if is_type:
            self.result.type_idents[e] = TYPE_IDENTS[name]
        self._set(e, ty)

    def visit_select(self, e: ast.Select) -> None:
        qualified = qualified_name(e)
        if qualified is not None and not e.test_only:
            if qualified.removeprefix(".") in ENUM_VALUES:
                self.result.enum_values[e] = ENUM_VALUES[qualified.removeprefix(".")]
                self._set(e, t.INT)
                return
            found = self._lookup_ident(qualified)
            if found is not None and found[1]:
                self.result.type_idents[e] = TYPE_IDENTS[qualified]
                self._set(e, found[0])
                return
        result = self._check_select_field(e, e.operand, e.field)
        if e.test_only:
            result = t.BOOL
        self._set(e, t.substitute(self.mapping, result, False))

    def _check_select_field(
        self, e: ast.Expr, operand: ast.Expr, field_name: str, optional: bool = False
    ) -> t.Type:
        self._check(operand)
        operand_type, was_optional = t.unwrap_optional(t.substitute(self.mapping, self._get(operand), False))
        result = self._field_type(e, operand_type, field_name)
        # An optional operand, or `.?`, makes the selection optional.
        return t.optional_of(result) if was_optional or optional else result

    def _field_type(self, e: ast.Expr, operand_type: t.Type, field_name: str) -> t.Type:
        if operand_type.kind is t.Kind.MAP:
            return operand_type.params[1]
        if operand_type.kind is t.Kind.STRUCT:
            fields = self.struct_fields.get(operand_type.name, _MESSAGE_FIELDS.get(operand_type.name))
            if fields is None:
                self._error(f"unexpected failed resolution of '{operand_type.name}'", e.pos)
                return t.ERROR
            if field_name not in fields:
                self._error(f"undefined field '{field_name}'", e.pos)
                return t.ERROR
            return fields[field_name]
        if operand_type.kind is t.Kind.TYPE_PARAM:
            self._is_assignable(t.DYN, operand_type)
            return t.DYN
        if not t.is_dyn_or_error(operand_type):
            self._error(f"type '{t.format_type(operand_type)}' does not support field selection", e.pos)
        return t.DYN

    def visit_call(self, e: ast.Call) -> None:
        if e.function == ast.OPT_SELECT and e.target is None:
            operand, field = e.args
            assert isinstance(field, ast.Literal)
            result = self._check_select_field(e, operand, str(field.value), optional=True)
            self._set(e, t.substitute(self.mapping, result, False))
            self.result.overloads[e] = [OPT_SELECT_OVERLOAD]
            return
        for arg in e.args:
            self._check(arg)
        name = e.function
        if e.target is None:
            global_name = name.removeprefix(".")
            overloads = self.functions.get(global_name)
            if overloads is None:
                self._undeclared_function(e, name)  # cel-go names it as written
                return
            self._resolve(e, global_name, overloads, None)
            return
        qualified = qualified_name(e.target)
        if qualified is not None:
            candidate = f"{qualified}.{name}"
            if candidate in self.functions:
                self.result.qualified_calls[e] = candidate
                self._resolve(e, candidate, self.functions[candidate], None)
                return
        self._check(e.target)
        overloads = self.functions.get(name)
        if overloads is None:
            self._undeclared_function(e, name)
            return
        self._resolve(e, name, overloads, e.target)

    def _undeclared_function(self, e: ast.Call, name: str) -> None:
        self._set(e, t.ERROR)
        self._error(f"undeclared reference to '{name}' (in container '')", e.pos)

    def _resolve(self, e: ast.Call, name: str, overloads: list[Overload], target: ast.Expr | None) -> None:
        arg_types = ([self._get(target)] if target is not None else []) + [self._get(a) for a in e.args]
        args_nodes = ([target] if target is not None else []) + list(e.args)
        result_type: t.Type | None = None
        matched: list[Overload] = []
        for overload in overloads:
            if (target is None) == overload.member:
                continue
            if name in (ast.LOGICAL_AND, ast.LOGICAL_OR):
                failed = False
                for node, arg_type in zip(args_nodes, arg_types, strict=True):
                    if not self._is_assignable(arg_type, t.BOOL):
                        self._error(f"expected type 'bool' but found '{t.format_type(arg_type)}'", node.pos)
                        failed = True
                self.result.overloads[e] = [overload]
                self._set(e, t.ERROR if failed else t.BOOL)
                return
            signature = [overload.result, *overload.args]
            type_params = overload.type_params
            if type_params:
                subs = t.Mapping()
                for tp in type_params:
                    subs.add(tp, self._new_type_var())
                signature = [t.substitute(subs, ty, False) for ty in signature]
            candidate_args = signature[1:]
            if len(candidate_args) != len(arg_types):
                continue
            mapping = t.is_assignable_list(self.mapping, arg_types, candidate_args)
            if mapping is None:
                continue
            self.mapping = mapping
            matched.append(overload)
            fn_result = t.substitute(self.mapping, signature[0], False)
            if result_type is None:
                result_type = fn_result
            elif not t.is_dyn(result_type) and fn_result != result_type:
                result_type = t.DYN
        if result_type is None:
            shown = [t.format_type(t.substitute(self.mapping, a, True)) for a in arg_types]
            if target is not None:
                signature_text = f"{shown[0]}.({', '.join(shown[1:])})"
            else:
                signature_text = f"({', '.join(shown)})"
            self._error(f"found no matching overload for '{name}' applied to '{signature_text}'", e.pos)
            self._set(e, t.ERROR)
            return
        self.result.overloads[e] = matched
        self._set(e, result_type)

    def _join(self, node: ast.Expr, previous: t.Type | None, current: t.Type) -> t.Type:
        if previous is None:
            return current
        if self._is_assignable(previous, current):
            return t.most_general(previous, current)
        # Mixed element types join to dyn here; ValidateHomogeneousAggregateLiterals reports them,
        # but only for an expression that type-checked otherwise.
        return t.DYN

    def visit_list(self, e: ast.ListExpr) -> None:
        elem: t.Type | None = None
        for i, element in enumerate(e.elements):
            self._check(element)
            element_type = self._get(element)
            if i in e.optional_indices:
                element_type = self._optional_value(element, element_type)
            elem = self._join(element, elem, element_type)
        self._set(e, t.list_of(elem if elem is not None else self._new_type_var()))

    def visit_struct(self, e: ast.StructExpr) -> None:
        """checker.go checkCreateStruct, for the message types the checker knows (the
        well-known types)."""
        found = self._lookup_ident(e.type_name.removeprefix("."))
        if found is None:
            self._error(f"undeclared reference to '{e.type_name}' (in container '')", e.pos)
            self._set(e, t.ERROR)
            return
        declared, is_type = found
        type_name = e.type_name.removeprefix(".")
        result = t.ERROR
        if not is_type:
            if declared.kind is not t.Kind.ERROR:
                self._error(f"'{t.declared_name(declared)}' is not a type", e.pos)
        else:
            result = declared.params[0]
            if type_name in MESSAGE_TYPES:
                result = MESSAGE_TYPES[type_name]
            elif result.nullable or result.kind in (t.Kind.NULL, t.Kind.TIMESTAMP, t.Kind.DURATION):
                type_name = _WELL_KNOWN_MESSAGES[result.kind]
            else:
                self._error(f"'{t.declared_name(result)}' is not a message type", e.pos)
                result = t.ERROR
        self._set(e, result)
        for f in e.fields:
            self._check(f.value)
            field_type = self._message_field(type_name, f)
            value_type = self._get(f.value)
            if f.optional:
                value_type = self._optional_value(f.value, value_type)
            if not self._is_assignable(field_type, value_type):
                self._error(
                    f"expected type of field '{f.name}' is '{t.format_type(field_type)}' "
                    f"but provided type is '{t.format_type(value_type)}'",
                    f.pos,
                )

    def _message_field(self, type_name: str, f: ast.StructField) -> t.Type:
        """checker.go lookupFieldType."""
        if type_name == "map":
            return t.DYN
        fields = _MESSAGE_FIELDS.get(type_name)
        if fields is None:
            self._error(f"unexpected failed resolution of '{type_name}'", f.pos)
            return t.ERROR
        if f.name not in fields:
            self._error(f"undefined field '{f.name}'", f.pos)
            return t.ERROR
        return fields[f.name]

    def visit_map(self, e: ast.MapExpr) -> None:
        key_type: t.Type | None = None
        value_type: t.Type | None = None
        for i, (key, value) in enumerate(e.entries):
            self._check(key)
            key_type = self._join(key, key_type, self._get(key))
            self._check(value)
            entry_type = self._get(value)
            if i in e.optional_entries:
                entry_type = self._optional_value(value, entry_type)
            value_type = self._join(value, value_type, entry_type)
        if key_type is None or value_type is None:
            key_type, value_type = self._new_type_var(), self._new_type_var()
        self._set(e, t.map_of(key_type, value_type))

    def _optional_value(self, node: ast.Expr, ty: t.Type) -> t.Type:
        """`[?x]`, `{?k: x}`: x must be an optional; its value type is the element's."""
        value, was_optional = t.unwrap_optional(ty)
        if not was_optional and not t.is_dyn(value):
            expected = t.format_type(t.optional_of(value))
            self._error(f"expected type '{expected}' but found '{t.format_type(value)}'", node.pos)
        return value

    def visit_comprehension(self, e: ast.Comprehension) -> None:
        self._check(e.iter_range)
        self._check(e.accu_init)
        range_type = t.substitute(self.mapping, self._get(e.iter_range), False)
        accu_type = self._get(e.accu_init)
        self.scope = _Scope(self.scope)
        self.scope.idents[e.accu_var] = accu_type
        var2_type: t.Type | None = None
        if range_type.kind is t.Kind.LIST:
            var_type = range_type.params[0]
            if e.iter_var2:
                var2_type, var_type = var_type, t.INT
        elif range_type.kind is t.Kind.MAP:
            var_type = range_type.params[0]
            if e.iter_var2:
                var2_type = range_type.params[1]
        elif range_type.kind in (t.Kind.DYN, t.Kind.ERROR, t.Kind.TYPE_PARAM):
            # Not ANY: attribute values (google.protobuf.Any) cannot be iterated, which is why
            # 1.36 switched attributes to dyn when list attributes are enabled.
            self._is_assignable(t.DYN, range_type)
            var_type = t.DYN
            var2_type = t.DYN if e.iter_var2 else None
        else:
            self._error(
                f"expression of type '{t.format_type(range_type)}' cannot be range of a comprehension "
                "(must be list, map, or dynamic)",
                e.iter_range.pos,
            )
            var_type = t.ERROR
            var2_type = t.ERROR if e.iter_var2 else None
        self.scope = _Scope(self.scope)
        self.scope.idents[e.iter_var] = var_type
        if e.iter_var2 and var2_type is not None:
            self.scope.idents[e.iter_var2] = var2_type
        self._check(e.loop_condition)
        self._assert_type(e.loop_condition, t.BOOL)
        self._check(e.loop_step)
        self._assert_type(e.loop_step, accu_type)
        assert self.scope.parent is not None
        self.scope = self.scope.parent
        self._check(e.result)
        assert self.scope.parent is not None
        self.scope = self.scope.parent
        self._set(e, t.substitute(self.mapping, self._get(e.result), False))

    def _assert_type(self, node: ast.Expr, expected: t.Type) -> None:
        actual = self._get(node)
        if not self._is_assignable(expected, actual):
            self._error(
                f"expected type '{t.format_type(expected)}' but found '{t.format_type(actual)}'", node.pos
            )


def qualified_name(e: ast.Expr) -> str | None:
    if isinstance(e, ast.Ident):
        return e.name.removeprefix(".")
    if isinstance(e, ast.Select) and not e.test_only:
        prefix = qualified_name(e.operand)
        return None if prefix is None else f"{prefix}.{e.field}"
    return None


#: A literal's Python class -> its CEL type; bool before int and UInt before int (subclasses).
_LITERAL_TYPES: tuple[tuple[type, t.Type], ...] = (
    (type(None), t.NULL),
    (bool, t.BOOL),
    (UInt, t.UINT),
    (int, t.INT),
    (float, t.DOUBLE),
    (str, t.STRING),
    (bytes, t.BYTES),
)


def _literal_type(value: object) -> t.Type:
    for cls, ty in _LITERAL_TYPES:
        if isinstance(value, cls):
            return ty
    raise TypeError(f"unexpected literal {value!r}")  # pragma: no cover


def is_equivalent(a: t.Type, b: t.Type) -> bool:
    """cel-go Type.IsEquivalentType: same kind and name, equivalent parameters."""
    return (
        a.kind is b.kind
        and a.name == b.name
        and len(a.params) == len(b.params)
        and all(is_equivalent(x, y) for x, y in zip(a.params, b.params, strict=True))
    )


class PanicError(CheckError):
    """An expression on which the Kubernetes CEL library itself panics."""


def _first_param(ty: t.Type, pos: tuple[int, int]) -> t.Type:
    """`Parameters()[0]` of an optional element's type. A dyn element has none, and cel-go
    v0.26.0's homogeneousAggregateLiteralValidator indexes it anyway: the API server's request
    fails with a recovered panic and the scheduler crashes, so no such selector can be used."""
    if not ty.params:
        raise PanicError(
            "an optional element of type dyn makes the Kubernetes CEL library panic "
            "(cel-go v0.26.0 homogeneous aggregate validator); give it an optional type",
            pos,
        )
    return ty.params[0]


def validate_aggregates(root: ast.Expr, result: CheckResult) -> list[CheckError]:
    """ValidateHomogeneousAggregateLiterals, run on the final (substituted) types."""
    try:
        return _validate_aggregates(root, result)
    except PanicError as panic:
        return [panic]


def _validate_aggregates(root: ast.Expr, result: CheckResult) -> list[CheckError]:
    errors: list[CheckError] = []
    # The string format validator exempts everything inside a `format` call.
    exempt = {
        inner
        for node in walk(root)
        if isinstance(node, ast.Call) and node.function == "format"
        for inner in walk(node)
        if inner is not node
    }
    for node in walk(root):
        if node in exempt:
            continue
        if isinstance(node, ast.ListExpr):
            first: t.Type | None = None
            for i, element in enumerate(node.elements):
                ty = result.types[element]
                if i in node.optional_indices:
                    ty = _first_param(ty, element.pos)
                if first is None:
                    first = ty
                elif not is_equivalent(first, ty):
                    errors.append(
                        CheckError(
                            f"expected type '{t.format_type(first)}' but found '{t.format_type(ty)}'",
                            element.pos,
                        )
                    )
                    break
        elif isinstance(node, ast.MapExpr):
            key_type: t.Type | None = None
            value_type: t.Type | None = None
            for i, (key, value) in enumerate(node.entries):
                kt, vt = result.types[key], result.types[value]
                if i in node.optional_entries:
                    vt = _first_param(vt, value.pos)
                if key_type is None or value_type is None:
                    key_type, value_type = kt, vt
                    continue
                # Unlike a list's, every key and value of a map that differs is reported.
                if not is_equivalent(key_type, kt):
                    errors.append(
                        CheckError(
                            f"expected type '{t.format_type(key_type)}' but found '{t.format_type(kt)}'",
                            key.pos,
                        )
                    )
                if not is_equivalent(value_type, vt):
                    errors.append(
                        CheckError(
                            f"expected type '{t.format_type(value_type)}' but found '{t.format_type(vt)}'",
                            value.pos,
                        )
                    )
    return errors


def walk(root: ast.Expr) -> list[ast.Expr]:
    """All nodes, parents before children (iterative: expressions may nest deeply)."""
    out: list[ast.Expr] = []
    stack = [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(children(node)))
    return out


def children(node: ast.Expr) -> list[ast.Expr]:
    if isinstance(node, ast.Select):
        return [node.operand]
    if isinstance(node, ast.Call):
        return ([node.target] if node.target is not None else []) + list(node.args)
    if isinstance(node, ast.ListExpr):
        return list(node.elements)
    if isinstance(node, ast.MapExpr):
        return [x for entry in node.entries for x in entry]
    if isinstance(node, ast.StructExpr):
        return [f.value for f in node.fields]
    if isinstance(node, ast.Comprehension):
        return [node.iter_range, node.accu_init, node.loop_condition, node.loop_step, node.result]
    return []


def issues_text(expression: str, issues: list[CheckError]) -> str:
    """All issues in source order (a stable sort, as cel-go's Errors.ToDisplayString)."""
    ordered = sorted(issues, key=lambda issue: issue.pos)
    return "\n".join(format_issue(expression, issue.message, issue.pos) for issue in ordered)
