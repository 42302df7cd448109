"""Turn a checked expression tree into nested Python closures, and run them.

Why closures: cel-python's interpreter walks its parse tree on every evaluation (hundreds of µs
per device) and its transpiling runner keeps per-evaluation state in module globals, which is
not thread-safe. Here every node becomes one small function, all per-evaluation state lives in
an `Activation` created per call, and the compiled program itself is immutable, so one program
serves any number of threads.

Semantics follow cel-go's interpreter (interpreter/interpretable.go, attributes.go): errors are
values that `&&`, `||` and comprehension loops may absorb; unknown map keys are `no such key`
errors; comprehension accumulators are initialised lazily; and a cost counter modelled on
cel-go's runtime cost tracker stops evaluation once it exceeds the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

from dradriver.offline.cel import ast
from dradriver.offline.cel import types as t
from dradriver.offline.cel.checker import MESSAGE_TYPES, CheckResult, qualified_name
from dradriver.offline.cel.cost import STRUCT_CREATE
from dradriver.offline.cel.errors import CostLimitError, EvalError
from dradriver.offline.cel.functions import (
    ERROR_ARGUMENT,
    ERROR_RESULT_COSTS,
    OVERLOAD_COSTS,
    OVERLOAD_PRICED,
    RUNTIME,
    SIZED,
    STRING_TRAVERSAL_COST_FACTOR,
    UNRESOLVED_COSTS,
    bound,
    compile_regex,
    list_sum,
    matches,
)
from dradriver.offline.cel.messages import new_message
from dradriver.offline.cel.semver import Semver
from dradriver.offline.cel.times import Duration, Timestamp
from dradriver.offline.cel.values import (
    EMPTY_MAP,
    OPTIONAL_NONE,
    DefaultingMap,
    OpaqueValue,
    Optional,
    TypeValue,
    UInt,
    build_map,
    equal,
    format_value,
    is_list,
    iterate,
    map_find,
    size_of,
    type_name,
)
from dradriver.quantity import Quantity

# The runtime cost limit of DRA selectors (resourceapi.CELSelectorExpressionMaxCost).
COST_LIMIT = 1_000_000
COST_LIMIT_MESSAGE = "operation cancelled: actual cost limit exceeded"

LIST_CREATE_COST = 10  # common.ListCreateBaseCost
MAP_CREATE_COST = 30  # common.MapCreateBaseCost


class Activation:
    """Per-evaluation state: variable slots and the cost spent so far."""

    __slots__ = ("cost", "has_root", "limit", "slots")

    def __init__(self, slot_count: int, limit: int) -> None:
        self.slots: list[Any] = [None] * slot_count
        self.cost = 0
        self.limit = limit
        # The has() whose attribute's root has been resolved (see Compiler.visit_select).
        self.has_root: object | None = None


Eval = Callable[[Activation], Any]


class _Err:
    """An error value held in a comprehension accumulator."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


_UNINIT = object()
DEVICE_SLOT = 0


def check_budget(act: Activation) -> None:
    if act.cost > act.limit:
        raise CostLimitError(COST_LIMIT_MESSAGE)


# -- field selection and indexing (attributes.go refQualify) ------------------------------------------


def select_field(obj: Any, name: str) -> Any:
    tobj = type(obj)
    if tobj is dict:
        try:
            return obj[name]
        except KeyError:
            raise EvalError(f"no such key: {name}") from None
    if tobj is DefaultingMap:
        return obj.get(name, EMPTY_MAP)
    if isinstance(obj, Mapping):
        if name in obj:
            return obj[name]
        raise EvalError(f"no such key: {name}")
    if is_list(obj):
        raise EvalError("unsupported index type 'string' in list")
    raise EvalError(f"no such key: {name}")


def index_value(obj: Any, key: Any) -> Any:
    if type(key) is str:
        return select_field(obj, key)
    if type(key) not in _QUALIFIER_KEY_TYPES:
        # newQualifier, for a key computed at run time (constant ones fail when planned).
        raise EvalError(f"invalid qualifier type: {qualifier_type_name(key)}")
    if isinstance(obj, Mapping):
        found, value = map_find(obj, key)
        if found:
            return value
        if type(obj) is DefaultingMap:
            return EMPTY_MAP
        # Go's %v of a types.Uint: the bare number.
        raise EvalError(f"no such key: {int(key) if type(key) is UInt else format_value(key)}")
    if is_list(obj):
        tk = type(key)
        if tk is int or tk is UInt:
            i = int(key)
        elif tk is float:
            if not key.is_integer():
                raise EvalError(f"unsupported index value {format_value(key)} in list")
            i = int(key)
        else:
            raise EvalError(f"unsupported index type '{_runtime_type(key)}' in list")
        if 0 <= i < len(obj):
            return obj[i]
        raise EvalError(f"index out of bounds: {int(key) if tk is UInt else format_value(key)}")
    raise EvalError(f"no such key: {format_value(key)}")


# A qualifier: (is a field name, the key, is optional).
Step = tuple[bool, Any, bool]
_INDEXES = (ast.INDEX, ast.OPT_SELECT, ast.OPT_INDEX)


def _present(obj: Any, key: Any) -> tuple[bool, Any]:
    """refQualify with a presence test: a missing map key or list index is absent, not an error,
    and so is any key of a value that has no keys at all."""
    if type(key) is not str and type(key) not in _QUALIFIER_KEY_TYPES:
        raise EvalError(f"invalid qualifier type: {qualifier_type_name(key)}")
    if type(obj) is DefaultingMap:
        return True, obj.get(key, EMPTY_MAP) if type(key) is str else index_value(obj, key)
    if isinstance(obj, Mapping):
        if type(key) is str:
            return (True, obj[key]) if key in obj else (False, None)
        return map_find(obj, key)
    if is_list(obj):
        try:
            return True, index_value(obj, key)
        except EvalError as err:
            if err.message.startswith("index out of bounds"):
                return False, None
            raise
    return False, None


def qualify(a: Activation, obj: Any, steps: list[Step]) -> Any:
    """attributes.go applyQualifiers: an optional operand is unwrapped and makes every qualifier
    optional; from the first optional qualifier on, a missing key ends the walk with
    optional.none(), and only the qualifiers that found something are charged."""
    optional = False
    if type(obj) is Optional:
        if not obj.has_value:
            return OPTIONAL_NONE
        obj, optional = obj.value, True
    for is_field, key, step_optional in steps:
        optional = optional or step_optional
        if optional:
            found, value = _present(obj, key)
            if not found:
                return OPTIONAL_NONE
            a.cost += 1
            obj = value
        else:
            a.cost += 1
            obj = select_field(obj, key) if is_field else index_value(obj, key)
    return Optional(obj) if optional else obj


def _runtime_type(value: Any) -> str:
    return type_name(value)


def _test_field(a: Activation, obj: Any, name: str) -> bool:
    """A presence test at the end of an attribute: an optional value (an optional qualifier on
    the way, or an optional operand) is tested inside, and the test, like the optional
    qualifiers, is charged only when it finds the field."""
    if type(obj) is Optional:
        if obj.has_value and has_field(obj.value, name):
            return True
        a.cost -= 1
        return False
    return has_field(obj, name)


def has_field(obj: Any, name: str) -> bool:
    if type(obj) is DefaultingMap:
        return True
    if isinstance(obj, Mapping):
        return name in obj
    if is_list(obj):
        raise EvalError("unsupported index type 'string' in list")
    return False


# -- the compiler -------------------------------------------------------------------------------------


class ProgramError(Exception):
    """cel-go's planner failed (a constant conversion that errors): "program instantiation failed"."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_NOT_CONSTANT = object()
# overloads.IsTypeConversionFunction: with a constant argument, OptOptimize evaluates these while
# planning, so `int("12x")` fails at compile time and `int("12")` costs nothing at run time.
_CONVERSIONS = frozenset(
    {"bool", "bytes", "double", "duration", "dyn", "int", "string", "timestamp", "type", "uint"}
)


#: How cel-go's newQualifier names the Go type of an index it cannot use (`%T`).
_QUALIFIER_TYPE_NAMES: dict[type, str] = {
    type(None): "types.Null",
    bytes: "types.Bytes",
    Duration: "types.Duration",
    Timestamp: "types.Timestamp",
    tuple: "*types.baseList",
    TypeValue: "*types.Type",
    Semver: "cel.Semver",
    Quantity: "cel.Quantity",
    Optional: "*types.Optional",
}
_QUALIFIER_KEY_TYPES = (int, UInt, bool, float)


def qualifier_type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "*types.baseMap"
    return _QUALIFIER_TYPE_NAMES.get(type(value), f"types.{type(value).__name__}")


class Compiler(ast.Visitor[Eval]):
    def __init__(self, check: CheckResult, variables: dict[str, int]) -> None:
        self.check = check
        self._constants: dict[ast.Expr, Any] = {}
        # Roots of the has() chains being compiled (by node id), each with its has()'s token.
        self._has_roots: dict[int, object] = {}
        self.scope: dict[str, tuple[int, Eval | None]] = {
            name: (slot, None) for name, slot in variables.items()
        }
        self.slot_count = max(variables.values(), default=-1) + 1

    def _type_value(self, e: ast.Ident | ast.Select) -> TypeValue:
        ty = self.check.type_idents[e]
        name = str(qualified_name(e)).removeprefix(".")
        if ty.nullable or (name in MESSAGE_TYPES and ty is not t.EMPTY):
            # A wrapper's or JSON message's name is no runtime type (its values have the type of
            # the value they hold), nor is Any's.
            raise ProgramError(f"reference to undefined type: {qualified_name(e)}")
        return TypeValue(_type_value_name(ty))

    def new_slot(self) -> int:
        self.slot_count += 1
        return self.slot_count - 1

    def constant(self, e: ast.Expr) -> Any:
        """The value cel-go's OptOptimize planner folds this node into, or _NOT_CONSTANT
        (decorators.go: literals, lists and maps of constants, conversions of a constant)."""
        if e in self._constants:
            return self._constants[e]
        value: Any = _NOT_CONSTANT
        if isinstance(e, ast.Literal):
            value = e.value
        elif isinstance(e, ast.Ident | ast.Select) and e in self.check.type_idents:
            value = self._type_value(e)
        elif e in self.check.enum_values:
            value = self.check.enum_values[e]
        elif isinstance(e, ast.ListExpr) and not e.optional_indices:
            items = [self._nested_constant(el) for el in e.elements]
            if all(item is not _NOT_CONSTANT for item in items):
                value = tuple(items)
        elif isinstance(e, ast.MapExpr) and not e.optional_entries:
            pairs = [(self._nested_constant(k), self._nested_constant(v)) for k, v in e.entries]
            if all(k is not _NOT_CONSTANT and v is not _NOT_CONSTANT for k, v in pairs):
                value = _ConstantMap(pairs)
        elif isinstance(e, ast.Call) and e.target is None and len(e.args) == 1:
            name = self.check.qualified_calls.get(e, e.function.removeprefix("."))
            argument = self.constant(e.args[0]) if name in _CONVERSIONS and name in RUNTIME else _NOT_CONSTANT
            if isinstance(argument, _ConstantMap) and argument.error is None:
                # A conversion of a constant map literal folds too: dyn() to that map itself.
                argument = argument if name == "dyn" else argument.value
            if isinstance(argument, _ConstantMap):
                value = argument if name == "dyn" and argument.error is None else _NOT_CONSTANT
            elif argument is not _NOT_CONSTANT:
                try:
                    value = RUNTIME[name][0](argument)
                except EvalError as err:
                    raise ProgramError(err.message) from None
        self._constants[e] = value
        return value

    def _nested_constant(self, e: ast.Expr) -> Any:
        """A constant inside a list or map literal: a map literal there is its built value (one
        with invalid keys stays an opaque error value, as cel-go keeps it inside the aggregate)."""
        value = self.constant(e)
        if isinstance(value, _ConstantMap) and value.error is None:
            return value.value
        return value

    def compile(self, e: ast.Expr) -> Eval:
        token = self._has_roots.get(id(e))
        if token is not None:
            del self._has_roots[id(e)]
            try:
                inner = self.compile(e)
            finally:
                self._has_roots[id(e)] = token

            def root_resolved(a: Activation) -> Any:
                value = inner(a)
                a.has_root = token
                return value

            return root_resolved
        constant = self.constant(e)
        if isinstance(constant, _ConstantMap):
            return constant.evaluation()
        if constant is not _NOT_CONSTANT:
            return lambda _a: constant
        return self.visit(e)  # a literal is constant, so no visit_literal

    # -- variables and attribute paths ------------------------------------------------------------

    def visit_ident(self, e: ast.Ident) -> Eval:
        if e in self.check.type_idents:
            value = self._type_value(e)
            return lambda _a: value
        slot, init = self.scope[e.name.removeprefix(".")]
        if init is None:

            def read(a: Activation) -> Any:
                a.cost += 1
                return a.slots[slot]

            return read
        lazy_init = init

        def read_accumulator(a: Activation) -> Any:
            a.cost += 1
            value = a.slots[slot]
            if value is _UNINIT:
                try:
                    value = lazy_init(a)
                except EvalError as err:
                    value = _Err(err.message)
                a.slots[slot] = value
            if type(value) is _Err:
                raise EvalError(value.message)
            return value

        return read_accumulator

    def _attribute_path(self, e: ast.Expr) -> tuple[Eval, list[Step]] | None:
        """Ident followed by constant field/index qualifiers, as one fused evaluation."""
        steps: list[Step] = []
        node = e
        while True:
            if isinstance(node, ast.Select) and not node.test_only and node not in self.check.type_idents:
                steps.append((True, node.field, False))
                node = node.operand
            elif (
                isinstance(node, ast.Call)
                and node.function in _INDEXES
                and node.target is None
                and isinstance(node.args[1], ast.Literal)
            ):
                optional = node.function != ast.INDEX
                steps.append((node.function == ast.OPT_SELECT, node.args[1].value, optional))
                node = node.args[0]
            else:
                break
        if not steps or not isinstance(node, ast.Ident):
            return None
        steps.reverse()
        return self.compile(node), steps

    def _fused_path(self, e: ast.Expr) -> Eval | None:
        path = self._attribute_path(e)
        if path is None:
            return None
        root, steps = path
        if any(optional for _, _, optional in steps) or self._optional_operand(e):

            def optional_path(a: Activation) -> Any:
                return qualify(a, root(a), steps)

            return optional_path
        if all(is_field or type(key) is str for is_field, key, _ in steps):
            names = [key for _, key, _ in steps]
            if len(names) == 1:
                (only,) = names

                def one(a: Activation) -> Any:
                    obj = root(a)
                    a.cost += 1
                    return select_field(obj, only)

                return one

            def fields(a: Activation) -> Any:
                # Each qualifier is charged as it is applied: one that fails ends the charges.
                obj = root(a)
                for name in names:
                    a.cost += 1
                    obj = select_field(obj, name)
                return obj

            return fields

        def mixed(a: Activation) -> Any:
            obj = root(a)
            for is_field, key, _ in steps:
                a.cost += 1
                obj = select_field(obj, key) if is_field else index_value(obj, key)
            return obj

        return mixed

    def _optional_operand(self, e: ast.Expr) -> bool:
        """Whether some operand along this attribute path is an optional (checked type)."""
        node = e
        while isinstance(node, ast.Select) or (isinstance(node, ast.Call) and node.function in _INDEXES):
            node = node.operand if isinstance(node, ast.Select) else node.args[0]
            if t.unwrap_optional(self.check.types[node])[1]:
                return True
        return False

    def _qualifier(self, e: ast.Expr, operand_node: ast.Expr, key_node: ast.Expr | None, step: Step) -> Eval:
        """One qualifier applied the way applyQualifiers does: an optional operand or an optional
        qualifier makes the result optional, and a missing key then gives optional.none()."""
        fused = self._fused_path(e)
        if fused is not None:
            return fused
        operand = self.compile(operand_node)
        key = self.resolved(key_node) if key_node is not None else None
        # A qualified call's (or literal's) result starts a relative attribute: one more unit.
        base = 0 if self.attribute_shaped(operand_node) else 1
        is_field, constant, optional = step

        def qualified(a: Activation) -> Any:
            obj = operand(a)
            name = constant if key is None else key(a)
            a.cost += base
            return qualify(a, obj, [(is_field, name, optional)])

        return qualified

    def visit_select(self, e: ast.Select) -> Eval:
        if e in self.check.type_idents:
            value = self._type_value(e)
            return lambda _a: value
        if e.test_only:
            operand = self.compile(e.operand)
            name = e.field

            if self.attribute_shaped(e.operand):
                root = self._chain_root(e.operand)
                if root is None:

                    def presence(a: Activation) -> bool:
                        return has_field(operand(a), name)

                    return presence
                return self._chain_presence(e.operand, root, name)

            def relative_presence(a: Activation) -> bool:
                # A field test on a call's (or literal's) result is a relative attribute: one unit.
                obj = operand(a)
                a.cost += 1
                return _test_field(a, obj, name)

            return relative_presence
        if t.unwrap_optional(self.check.types[e.operand])[1]:
            return self._qualifier(e, e.operand, None, (True, e.field, False))
        fused = self._fused_path(e)
        if fused is not None:
            return fused
        operand = self.compile(e.operand)
        field_name = e.field
        # A field of a call's (or literal's) result starts a relative attribute: one more unit.
        cost = 1 if self.attribute_shaped(e.operand) else 2

        failure = cost - 1

        def select(a: Activation) -> Any:
            # cel-go still observes the relative attribute whose operand failed.
            obj = _evaluate_charging_failure(operand, a, failure)
            a.cost += cost
            return select_field(obj, field_name)

        return select

    @staticmethod
    def _chain_root(e: ast.Expr) -> ast.Expr | None:
        """The node a chain of field selections and indexes starts from; None without a chain."""
        node = e
        while (isinstance(node, ast.Select) and not node.test_only) or (
            isinstance(node, ast.Call) and node.function in _INDEXES and node.target is None
        ):
            node = node.operand if isinstance(node, ast.Select) else node.args[0]
        return None if node is e else node

    def _chain_presence(self, operand_node: ast.Expr, root_node: ast.Expr, name: str) -> Eval:
        """has() over a chain of qualifiers: cel-go plans it as one attribute whose last qualifier
        is a presence test (evalTestOnly). Such an attribute costs nothing for itself, only one
        unit per qualifier applied, the test included: when anything after its root fails (a
        qualifier or an index key), or a relative root does, that is one unit less than what the
        plain attribute charges."""
        token = object()
        node = operand_node
        first = node
        while node is not root_node:
            first = node
            if isinstance(node, ast.Select):
                node = node.operand
                continue
            assert isinstance(node, ast.Call)
            node = node.args[0]
        # A relative root that fails is charged as its relative attribute (visit_select, _index): a
        # has() attribute has no unit of its own.
        root_failure = (
            not self.attribute_shaped(root_node)
            and (
                isinstance(first, ast.Select) or (isinstance(first, ast.Call) and first.function == ast.INDEX)
            )
            and not t.unwrap_optional(self.check.types[root_node])[1]
        )
        self._has_roots[id(root_node)] = token
        try:
            operand = self.compile(operand_node)
        finally:
            del self._has_roots[id(root_node)]

        def chain_presence(a: Activation) -> bool:
            saved, a.has_root = a.has_root, None
            try:
                obj = operand(a)
            except EvalError:
                if a.has_root is token or (root_failure and a.has_root is None):
                    a.cost -= 1
                raise
            finally:
                a.has_root = saved
            return _test_field(a, obj, name)

        return chain_presence

    def attribute_shaped(self, e: ast.Expr) -> bool:
        """Whether cel-go plans this node as an attribute (interpreter/planner.go): a variable,
        a field selection, an index or a conditional. An attribute costs one unit for itself plus
        one per qualifier; other nodes start a new (relative) attribute when qualified."""
        if isinstance(e, ast.Ident | ast.Select):
            return (
                e not in self.check.type_idents
                and e not in self.check.enum_values
                and not (isinstance(e, ast.Select) and e.test_only)
            )
        return isinstance(e, ast.Call) and e.target is None and e.function in (*_INDEXES, ast.CONDITIONAL)

    def _discounted(self, e: ast.Expr) -> bool:
        """Whether resolved() leaves out this node's own unit: an attribute not rooted in a
        conditional."""
        root = e
        while isinstance(root, ast.Select) or (
            isinstance(root, ast.Call) and root.function in _INDEXES and root.target is None
        ):
            root = root.operand if isinstance(root, ast.Select) else root.args[0]
        return self.attribute_shaped(e) and not (
            isinstance(root, ast.Call) and root.function == ast.CONDITIONAL
        )

    def resolved(self, e: ast.Expr) -> Eval:
        """An attribute that cel-go resolves directly (a conditional's branch, an index that is an
        attribute): its own unit is never charged, only its qualifiers'."""
        evaluate = self.compile(e)
        if not self._discounted(e):
            return evaluate

        def discounted(a: Activation) -> Any:
            value = evaluate(a)
            a.cost -= 1
            return value

        return discounted

    # -- calls --------------------------------------------------------------------------------------

    def visit_call(self, e: ast.Call) -> Eval:
        name = self.check.qualified_calls.get(e, e.function.removeprefix("."))
        args = list(e.args) if e.target is None or e in self.check.qualified_calls else [e.target, *e.args]
        special = {
            ast.LOGICAL_AND: self._and,
            ast.LOGICAL_OR: self._or,
            ast.CONDITIONAL: self._conditional,
            ast.EQUALS: self._equals,
            ast.NOT_EQUALS: self._not_equals,
            ast.INDEX: self._index,
            ast.OPT_SELECT: self._opt_select,
            ast.OPT_INDEX: self._opt_index,
            ast.NOT_STRICTLY_FALSE: self._not_strictly_false,
            "or": self._optional_or,
            "orValue": self._optional_or,
        }.get(name)
        if special is not None:
            return special(e, args)
        if name == ast.IN and len(args) == 2:
            membership = self._set_membership(e, args)
            if membership is not None:
                return membership
        impl, cost_fn = RUNTIME[name]
        if name in OVERLOAD_PRICED:
            ids = [overload.id for overload in self.check.overloads.get(e, [])]
            cost_fn = OVERLOAD_COSTS.get(ids[0]) if len(ids) == 1 else UNRESOLVED_COSTS.get(name)
        if name == "sum":
            impl = _typed_sum(self.check.overloads.get(e, []))
        if name in ("matches", "find", "findAll") and len(args) == 2 and isinstance(args[1], ast.Literal):
            # OptOptimize precompiles constant patterns; ValidateRegexLiterals has checked them.
            pattern = args[1].value
            if isinstance(pattern, str):
                compile_regex(pattern)
                if name == "matches":
                    impl = bound("matches", matches, plain=True)
        constants = [self.constant(arg) for arg in args]
        if name in _FOLDABLE and all(
            c is not _NOT_CONSTANT and not isinstance(c, _ConstantMap) for c in constants
        ):
            return _folded(impl, cost_fn, constants)
        compiled = [self.compile(arg) for arg in args]
        sized = name in SIZED and cost_fn is not None
        error_cost = ERROR_RESULT_COSTS.get(name)
        if (
            len(compiled) >= 3
            or name in _FUNCTION_BOUND
            or (len(self.check.overloads.get(e, [])) > 1 and not _singleton_bound(name))
            or (name in _REGEX_OPTIMIZED and len(args) == 2 and isinstance(self.constant(args[1]), str))
        ):
            return _varargs(impl, cost_fn, compiled, error_cost)
        if len(compiled) == 1 and not sized:
            (only,) = compiled

            def unary(a: Activation) -> Any:
                value = only(a)  # an error propagates: cel-go charges the call on an error too
                a.cost += 1
                return impl(value)

            return _charging_errors(unary, compiled, None)
        if len(compiled) == 2 and not sized:
            first, second = compiled

            def binary(a: Activation) -> Any:
                x = first(a)
                y = second(a)
                a.cost += 1
                return impl(x, y)

            return _charging_errors(binary, compiled, None)
        assert cost_fn is not None or not sized

        def call(a: Activation) -> Any:
            values = [arg(a) for arg in compiled]
            if cost_fn is None:
                a.cost += 1
            else:
                # Charged before the call, so that work the budget forbids is never started.
                a.cost += cost_fn(values)
                check_budget(a)
            return impl(*values)

        return _charging_errors(call, compiled, cost_fn, error_cost)

    def _set_membership(self, e: ast.Call, args: list[ast.Expr]) -> Eval | None:
        """maybeOptimizeSetMembership: `x in [constants]` is false for an empty list (x is never
        evaluated) and a hash lookup, free of cost, for a list of primitives. The element is
        planned first all the same (the whole of it), so a constant conversion that fails anywhere
        in it still fails the plan. Only a call the checker resolved to the one overload in_list
        qualifies: `x in dyn([1])` (in_list or in_map) is dispatched at run time and costs one
        unit like any call."""
        element = self.compile(args[0])
        items = self.constant(args[1])
        if items is _NOT_CONSTANT or not is_list(items):
            return None
        if [overload.id for overload in self.check.overloads.get(e, [])] != ["in_list"]:
            return None
        if not items:
            return lambda _a: False
        keys: set[tuple[str, Any]] = set()
        for item in items:
            if type(item) not in (bool, int, UInt, float, str):
                return None
            keys.update(_membership_keys(item))

        def membership(a: Activation) -> bool:
            value = element(a)
            key = _membership_key(value)
            return key is not None and key in keys

        return membership

    def _and(self, _e: ast.Call, args: list[ast.Expr]) -> Eval:
        return self._logical(args, absorbing=False)

    def _or(self, _e: ast.Call, args: list[ast.Expr]) -> Eval:
        return self._logical(args, absorbing=True)

    def _logical(self, args: list[ast.Expr], *, absorbing: bool) -> Eval:
        """`&&` (absorbing=False) and `||` (absorbing=True), as cel-go's evalAnd/evalOr.

        The absorbing value on either side decides the result even if the other side is an
        error; otherwise the first error (or non-bool operand) in evaluation order is returned.
        """
        left, right = (self.compile(arg) for arg in args)
        decided: bool = absorbing

        def logical(a: Activation) -> bool:
            try:
                lhs = left(a)
            except EvalError as err:
                lhs = err
            if lhs is absorbing:
                return decided
            try:
                rhs = right(a)
            except EvalError as err:
                rhs = err
            if rhs is absorbing:
                return decided
            for side in (lhs, rhs):
                if isinstance(side, EvalError):
                    raise side
                if type(side) is not bool:
                    raise EvalError("no such overload")
            return not absorbing

        return logical

    def _conditional(self, _e: ast.Call, args: list[ast.Expr]) -> Eval:
        cond, truthy, falsy = self.compile(args[0]), self.resolved(args[1]), self.resolved(args[2])

        def conditional(a: Activation) -> Any:
            c = cond(a)
            if c is True:
                return truthy(a)
            if c is False:
                return falsy(a)
            raise EvalError("no such overload")

        return conditional

    def _not_strictly_false(self, _e: ast.Call, args: list[ast.Expr]) -> Eval:
        operand = self.compile(args[0])

        def not_strictly_false(a: Activation) -> bool:
            a.cost += 1
            try:
                value = operand(a)
            except EvalError:
                return True
            return value if type(value) is bool else True

        return not_strictly_false

    def _equals(self, e: ast.Call, args: list[ast.Expr]) -> Eval:
        return self._equality(e, args, negate=False)

    def _not_equals(self, e: ast.Call, args: list[ast.Expr]) -> Eval:
        return self._equality(e, args, negate=True)

    def _equality(self, _e: ast.Call, args: list[ast.Expr], *, negate: bool) -> Eval:
        left_type = self.check.types[args[0]]
        right_type = self.check.types[args[1]]
        left, right = (self.compile(arg) for arg in args)
        simple = (t.INT, t.BOOL, t.UINT)
        if left_type in simple and right_type == left_type:

            def simple_equality(a: Activation) -> bool:
                lhs, rhs = left(a), right(a)
                a.cost += 1
                return bool(lhs != rhs) if negate else bool(lhs == rhs)

            return _charging_errors(simple_equality, [left, right], _eq_cost_of)
        if left_type == t.STRING and right_type == t.STRING:

            def string_equality(a: Activation) -> bool:
                lhs, rhs = left(a), right(a)
                a.cost += _string_eq_cost(lhs, rhs)
                return bool(lhs != rhs) if negate else bool(lhs == rhs)

            return _charging_errors(string_equality, [left, right], _eq_cost_of)

        def equality(a: Activation) -> bool:
            lhs, rhs = left(a), right(a)
            a.cost += _eq_cost(lhs, rhs)
            if negate:
                # evalNe: `Equal(l, r) != True`, so an Equal that fails makes `!=` true.
                try:
                    return not equal(lhs, rhs)
                except EvalError:
                    return True
            return equal(lhs, rhs)

        return _charging_errors(equality, [left, right], _eq_cost_of)

    def _opt_select(self, e: ast.Call, args: list[ast.Expr]) -> Eval:
        return self._qualifier(e, args[0], None, (True, cast(ast.Literal, args[1]).value, True))

    def _check_qualifier(self, key: ast.Expr) -> None:
        """interpreter/attributes.go newQualifier: a constant index of a type other than string,
        int, uint, bool or double fails when the program is planned."""
        value = self.constant(key)
        if value is _NOT_CONSTANT or type(value) in (str, int, UInt, bool, float):
            return
        name = "*types.baseMap" if isinstance(value, _ConstantMap) else qualifier_type_name(value)
        raise ProgramError(f"invalid qualifier type: {name}")

    def _opt_index(self, e: ast.Call, args: list[ast.Expr]) -> Eval:
        self._check_qualifier(args[1])
        return self._qualifier(e, args[0], args[1], (False, None, True))

    def _optional_or(self, e: ast.Call, args: list[ast.Expr]) -> Eval:
        """`or` / `orValue` (decorateOptionalOr): the right side only when the left holds no
        value; the call itself is not an InterpretableCall any more and costs nothing."""
        lhs, rhs = (self.compile(arg) for arg in args)
        unwrap = e.function == "orValue"

        def optional_or(a: Activation) -> Any:
            value = lhs(a)
            if type(value) is not Optional:
                return value
            if value.has_value:
                return value.value if unwrap else value
            return rhs(a)

        return optional_or

    def _index(self, e: ast.Call, args: list[ast.Expr]) -> Eval:
        self._check_qualifier(args[1])
        if t.unwrap_optional(self.check.types[args[0]])[1]:
            return self._qualifier(e, args[0], args[1], (False, None, False))
        fused = self._fused_path(e)
        if fused is not None:
            return fused
        container, key = self.compile(args[0]), self.resolved(args[1])
        relative = not self.attribute_shaped(args[0])
        cost = 2 if relative else 1
        # When the container or the key fails, cel-go still observes the relative attribute (one
        # unit) and a key that is no discounted attribute (its qualifier: one unit).
        container_failure = 1 if relative else 0
        key_failure = container_failure + (0 if self._discounted(args[1]) else 1)

        def index(a: Activation) -> Any:
            obj = _evaluate_charging_failure(container, a, container_failure)
            k = _evaluate_charging_failure(key, a, key_failure)
            a.cost += cost
            return index_value(obj, k)

        return index

    # -- aggregates ---------------------------------------------------------------------------------

    def visit_list(self, e: ast.ListExpr) -> Eval:
        elements = [self.compile(el) for el in e.elements]
        if e.optional_indices:
            optional = [i in e.optional_indices for i in range(len(elements))]

            def make_optional_list(a: Activation) -> tuple[Any, ...]:
                out: list[Any] = []
                for element, is_optional in zip(elements, optional, strict=True):
                    value = element(a)
                    if is_optional:
                        if type(value) is not Optional:
                            raise EvalError(
                                f"cannot initialize optional list element from non-optional value {value}"
                            )
                        if not value.has_value:
                            continue
                        value = value.value
                    out.append(value)
                return tuple(out)

            return _charging_constructor(make_optional_list, LIST_CREATE_COST)

        def make_list(a: Activation) -> tuple[Any, ...]:
            return tuple(el(a) for el in elements)

        return _charging_constructor(make_list, LIST_CREATE_COST)

    def visit_map(self, e: ast.MapExpr) -> Eval:
        entries = [(self.compile(k), self.compile(v)) for k, v in e.entries]

        optional = [i in e.optional_entries for i in range(len(entries))]

        def make_map(a: Activation) -> Mapping[Any, Any]:
            out: list[tuple[Any, Any]] = []
            for (key_fn, value_fn), is_optional in zip(entries, optional, strict=True):
                key = key_fn(a)
                value = value_fn(a)
                if is_optional:
                    if not _optional_entry(format_value(key), value).has_value:
                        continue
                    value = value.value
                out.append((key, value))
            return build_map(out)

        return _charging_constructor(make_map, MAP_CREATE_COST)

    def visit_struct(self, e: ast.StructExpr) -> Eval:
        """evalObj: the field values in order (an optional one set only when it holds a value), a
        repeated field's last value wins, then the message is built."""
        type_name = e.type_name.removeprefix(".")
        fields = [(f.name, self.compile(f.value), f.optional) for f in e.fields]

        def make_message(a: Activation) -> Any:
            values: dict[str, Any] = {}
            for name, value_fn, is_optional in fields:
                value = value_fn(a)
                if is_optional:
                    if not _optional_entry(name, value).has_value:
                        continue
                    value = value.value
                values[name] = value
            return new_message(type_name, values)

        return _charging_constructor(make_message, STRUCT_CREATE)

    # -- comprehensions -------------------------------------------------------------------------------

    def visit_comprehension(self, e: ast.Comprehension) -> Eval:
        iter_range = self.compile(e.iter_range)
        accu_init = self.compile(e.accu_init)
        saved = dict(self.scope)
        accu_slot = self.new_slot()
        self.scope[e.accu_var] = (accu_slot, accu_init)
        if e.macro == "bind":
            result = self.compile(e.result)
            self.scope = saved

            def bind(a: Activation) -> Any:
                a.slots[accu_slot] = _UNINIT
                return result(a)

            return bind
        var_slot = self.new_slot()
        var2_slot = self.new_slot() if e.iter_var2 else -1
        self.scope[e.iter_var] = (var_slot, None)
        if e.iter_var2:
            self.scope[e.iter_var2] = (var2_slot, None)
        fast = self._macro_fast_path(e, iter_range, var_slot)
        if fast is not None:
            self.scope = saved
            return fast
        condition = self.compile(e.loop_condition)
        step = self.compile(e.loop_step)
        # The result sees the accumulator but not the iteration variables.
        self.scope.pop(e.iter_var, None)
        if e.iter_var2:
            self.scope.pop(e.iter_var2, None)
        result = self.compile(e.result)
        self.scope = saved
        two_vars = bool(e.iter_var2)

        def comprehension(a: Activation) -> Any:
            collection = iter_range(a)
            slots = a.slots
            slots[accu_slot] = _UNINIT
            for first, second in _pairs(collection, two_vars):
                slots[var_slot] = first
                if two_vars:
                    slots[var2_slot] = second
                try:
                    keep_going = condition(a)
                except EvalError:
                    keep_going = True
                if keep_going is False:
                    break
                try:
                    slots[accu_slot] = step(a)
                except EvalError as err:
                    slots[accu_slot] = _Err(err.message)
                check_budget(a)
            return result(a)

        return comprehension

    def _macro_fast_path(self, e: ast.Comprehension, iter_range: Eval, var_slot: int) -> Eval | None:
        """all / exists / exists_one / map / filter without building accumulator expressions."""
        if e.macro not in ("all", "exists", "exists_one", "map", "filter"):
            return None
        args = [self.compile(arg) for arg in e.macro_args[1:]]
        if e.macro in ("all", "exists"):
            return _quantifier(iter_range, var_slot, args[0], stop_on=e.macro == "exists")
        if e.macro == "exists_one":
            return _exists_one(iter_range, var_slot, args[0])
        if e.macro == "map":
            predicate = args[0] if len(args) == 2 else None
            return _collect(iter_range, var_slot, predicate, args[-1])
        return _collect(iter_range, var_slot, args[0], None)


class _ConstantMap:
    """A map literal of constants, built once while planning."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.value: Mapping[Any, Any] | None = build_map(pairs)
        self.error: str | None = None

    def evaluation(self) -> Eval:
        value, error = self.value, self.error
        if error is not None:

            def failing(_a: Activation) -> Any:
                raise EvalError(error)

            return failing
        return lambda _a: value


def _membership_key(value: Any) -> tuple[str, Any] | None:
    kind = type(value)
    if kind is bool:
        return ("bool", value)
    if kind is UInt:
        return ("uint", int(value))
    if kind is int:
        return ("int", value)
    if kind is float:
        return ("double", value)
    if kind is str:
        return ("string", value)
    return None


def _membership_keys(item: Any) -> list[tuple[str, Any]]:
    """The set entries cel-go adds for one list element, lossless numeric conversions included."""
    key = _membership_key(item)
    assert key is not None
    keys = [key]
    kind = type(item)
    if kind is float:
        if item.is_integer() and -(2.0**63) <= item < 2.0**63:
            keys.append(("int", int(item)))
        if item.is_integer() and 0 <= item < 2.0**64:
            keys.append(("uint", int(item)))
    elif kind is int or kind is UInt:
        keys.append(("double", float(item)))
        if kind is int and item >= 0:
            keys.append(("uint", int(item)))
        if kind is UInt and item <= 2**63 - 1:
            keys.append(("int", int(item)))
    return keys


# Pure constructors whose constant calls are worth computing once: they parse their argument.
_FOLDABLE = frozenset({"quantity", "semver", "isQuantity", "isSemver"})


def _folded(impl: Callable[..., Any], cost_fn: Callable[[list[Any]], int] | None, args: list[Any]) -> Eval:
    """A call on constants (`quantity("40Gi")`, `semver("1.2.3")`), computed once at compile time.

    The functions are pure, so only the cost (still charged per evaluation) and an error
    (still raised per evaluation, where `||` may absorb it) remain at run time.
    """
    try:
        value = impl(*args)
    except EvalError as err:
        message = err.message

        def failing(a: Activation) -> Any:
            a.cost += 1
            raise EvalError(message)

        return failing
    cost = 1 if cost_fn is None else cost_fn(args)

    def constant(a: Activation) -> Any:
        a.cost += cost
        return value

    return constant


#: Two-argument functions Kubernetes binds with a FunctionOp only: cel-go plans them as evalVarArgs.
_FUNCTION_BOUND = frozenset({"format"})


def _singleton_bound(name: str) -> bool:
    """cel-go's standard operators and functions are bound once for all their overloads
    (SingletonUnaryBinding/SingletonBinaryBinding). An extension function whose call the checker
    could not resolve to one overload is instead planned with the FunctionDecl's dynamic
    dispatcher, which has only a FunctionOp: an evalVarArgs."""
    return name.startswith(("_", "@", "!")) or name in _STDLIB_SINGLETONS


_STDLIB_SINGLETONS = frozenset({"contains", "startsWith", "endsWith", "matches", "size", *_CONVERSIONS})
#: Calls OptOptimize (matches) and Kubernetes' ExtensionLibRegexOptimizations (find, findAll)
#: replace, for a constant pattern, with a precompiled evalVarArgs.
_REGEX_OPTIMIZED = frozenset({"matches", "find", "findAll"})


def _charge(a: Activation, cost_fn: Callable[[list[Any]], int] | None, values: list[Any]) -> None:
    try:
        a.cost += 1 if cost_fn is None else cost_fn(values)
    except (TypeError, AttributeError, EvalError):
        a.cost += 1


def _varargs(
    impl: Callable[..., Any],
    cost_fn: Callable[[list[Any]], int] | None,
    args: list[Eval],
    error_cost: int | None = None,
) -> Eval:
    """cel-go's evalVarArgs (three or more arguments, a FunctionOp-only binding, a precompiled
    regex): the arguments are evaluated in order and the first error is returned at once. The
    observer charges a call only when every argument's value is on its stack, so an error in an
    argument other than the last leaves the call (and the arguments after it) uncharged.
    `error_cost`: the call's cost when its result is an error (a cost priced by the result)."""
    last = len(args) - 1

    def call(a: Activation) -> Any:
        values: list[Any] = []
        for i, arg in enumerate(args):
            try:
                values.append(arg(a))
            except EvalError:
                if i == last:
                    if error_cost is None:
                        _charge(a, cost_fn, [*values, ERROR_ARGUMENT])
                    else:
                        a.cost += error_cost
                raise
        # Charged before the call, so that work the budget forbids is never started.
        before = a.cost
        _charge(a, cost_fn, values)
        check_budget(a)
        if error_cost is None:
            return impl(*values)
        try:
            return impl(*values)
        except EvalError:
            a.cost = before + error_cost
            raise

    return call


def _optional_entry(name: str, value: Any) -> Optional:
    """The value of an optional map entry or message field (`?k: v`), which must be an optional."""
    if type(value) is not Optional:
        raise EvalError(
            f"cannot initialize optional entry '{name}' from non-optional value {format_value(value)}"
        )
    return value


def _evaluate_charging_failure(operand: Eval, a: Activation, failure_cost: int) -> Any:
    """The operand's value; when it fails, `failure_cost` is charged before the error goes on
    (cel-go's cost observer still counts what it saw of the failed expression)."""
    try:
        return operand(a)
    except EvalError:
        a.cost += failure_cost
        raise


def _charging_constructor(build: Eval, cost: int) -> Eval:
    """A list, map or message literal (evalList, evalMap, evalObj): the elements are evaluated in
    order and the first error ends the evaluation, but the observer charges the literal's base
    cost whatever value (an error included) it produced."""

    def construct(a: Activation) -> Any:
        value = _evaluate_charging_failure(build, a, cost)
        a.cost += cost
        return value

    return construct


def _charging_errors(
    fast: Eval, args: list[Eval], cost_fn: Callable[[list[Any]], int] | None, error_cost: int | None = None
) -> Eval:
    """cel-go evaluates every argument of a strict call and charges the call even when an argument
    or the call itself fails (an error value counts as size 1, and a call priced by its result's
    size costs `error_cost`); then the first error is returned. `fast` handles the common case;
    after an error the arguments are evaluated again (they are pure) to spend exactly what cel-go
    spends. A cost tracker that asserts a type on an error argument panics (InternalError)."""

    def evaluate(a: Activation) -> Any:
        cost = a.cost
        try:
            return fast(a)
        except EvalError as failure:
            a.cost = cost
            values: list[Any] = []
            error: EvalError | None = None
            for arg in args:
                try:
                    values.append(arg(a))
                except EvalError as err:
                    error = error or err
                    values.append(ERROR_ARGUMENT)
            if error_cost is not None:
                a.cost += error_cost
            else:
                try:
                    a.cost += 1 if cost_fn is None else cost_fn(values)
                except (TypeError, AttributeError, EvalError):
                    a.cost += 1
            raise (error or failure) from None

    return evaluate


def _eq_cost_of(values: list[Any]) -> int:
    return _eq_cost(values[0], values[1])


def _string_eq_cost(lhs: Any, rhs: Any) -> int:
    shortest = min(len(lhs), len(rhs)) if type(lhs) is str and type(rhs) is str else 1
    return -(-shortest // 10) if shortest else 0


def _eq_cost(lhs: Any, rhs: Any) -> int:
    if isinstance(lhs, Quantity | Semver | OpaqueValue):
        return 1
    return math.ceil(min(size_of(lhs), size_of(rhs)) * STRING_TRAVERSAL_COST_FACTOR)


def _pairs(collection: Any, two_vars: bool) -> Any:
    if not two_vars:
        return ((item, None) for item in iterate(collection))
    if is_list(collection):
        return enumerate(collection)
    if isinstance(collection, Mapping):
        return collection.items()
    raise EvalError(f"unsupported comprehension range type: {_runtime_type(collection)}")


def _outcome(predicate: Eval, a: Activation) -> bool | str:
    """A comprehension's predicate on the current element: its bool, or the message of the
    error it raised (a value of another type is "no such overload")."""
    try:
        value = predicate(a)
    except EvalError as err:
        return err.message
    return value if type(value) is bool else "no such overload"


def _quantifier(iter_range: Eval, var_slot: int, predicate: Eval, *, stop_on: bool) -> Eval:
    """`all` (stop_on=False) and `exists` (stop_on=True), with cel-go's error absorption.

    Per iteration cel-go spends: the accumulator read and @not_strictly_false (plus `!_` for
    exists) in the loop condition, and one accumulator read in the step.
    """
    condition = 2 if not stop_on else 3
    per_iteration = condition + 1
    keep = not stop_on

    def quantifier(a: Activation) -> bool:
        collection = iter_range(a)
        slots = a.slots
        accu: Any = keep
        for item in iterate(collection):
            if accu is stop_on:
                a.cost += condition  # the loop condition that ends the fold
                break
            slots[var_slot] = item
            a.cost += per_iteration
            value = _outcome(predicate, a)
            if value is stop_on:
                accu = stop_on
            elif type(value) is str and accu is keep:
                accu = _Err(value)
            check_budget(a)
        a.cost += 1
        if type(accu) is _Err:
            raise EvalError(accu.message)
        return bool(accu)

    return quantifier


def _exists_one(iter_range: Eval, var_slot: int, predicate: Eval) -> Eval:
    def exists_one(a: Activation) -> bool:
        collection = iter_range(a)
        slots = a.slots
        count = 0
        error: str | None = None
        for item in iterate(collection):
            slots[var_slot] = item
            value = _outcome(predicate, a)
            if value is True:
                a.cost += 2  # `accu + 1`; the other branch, `accu`, is resolved without cost
                count += 1
            elif value is not False:
                error = error or value
            check_budget(a)
        a.cost += 2
        if error is not None:
            raise EvalError(error)
        return count == 1

    return exists_one


def _collect(iter_range: Eval, var_slot: int, predicate: Eval | None, transform: Eval | None) -> Eval:
    """`map` (transform, optional predicate) and `filter` (predicate only)."""

    def collect(a: Activation) -> tuple[Any, ...]:
        collection = iter_range(a)
        slots = a.slots
        out: list[Any] = []
        error: str | None = None
        for item in iterate(collection):
            slots[var_slot] = item
            if predicate is not None:
                # `keep ? accu + [x] : accu`: the `accu` branch is resolved without cost.
                keep = _outcome(predicate, a)
                if keep is not True:
                    if keep is not False:
                        error = error or keep
                    check_budget(a)
                    continue
            a.cost += 1 + LIST_CREATE_COST + 1  # accu, [..], +
            if transform is None:
                a.cost += 1  # the iteration variable, as the element of `accu + [x]`
                out.append(item)
            else:
                try:
                    out.append(transform(a))
                except EvalError as err:
                    error = error or err.message
            check_budget(a)
        a.cost += 1
        if error is not None:
            raise EvalError(error)
        return tuple(out)

    return collect


def _typed_sum(overloads: list[Any]) -> Callable[..., Any]:
    zero: Any = 0
    if len(overloads) == 1:
        zeros: dict[str, Any] = {"list_uint_sum_uint": UInt(0), "list_double_sum_double": 0.0}
        zeros["list_duration_sum_duration"] = Duration(0)
        zero = zeros.get(overloads[0].id, 0)
    return bound("sum", lambda items: list_sum(items, zero))


def _type_value_name(ty: t.Type) -> str:
    if ty.kind is t.Kind.LIST:
        return "list"
    if ty.kind is t.Kind.MAP:
        return "map"
    return ty.name
