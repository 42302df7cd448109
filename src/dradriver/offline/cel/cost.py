"""The API server's static cost estimate of a DRA selector (the number `validate` compares with
the 1,000,000 limit).

A port of cel-go's estimator (checker/cost.go, v0.26.0) with the estimators Kubernetes 1.36 plugs
in: ext lists and sets (OverloadCostEstimate), the Kubernetes library CostEstimator
(apiserver pkg/cel/library/cost.go EstimateCallCost) and the DRA size estimator
(dynamic-resource-allocation cel/compile.go: the maximum sizes of the strings, maps and lists
reachable from `device`). The structure follows the Go code closely, sizes and costs saturate at
2**64 - 1, and has() is free (PresenceTestHasCost(false)).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dradriver.offline.cel import ast
from dradriver.offline.cel import types as t
from dradriver.offline.cel.checker import CheckResult
from dradriver.offline.cel.decls import SORTABLE
from dradriver.offline.cel.namedformat import MAX_FORMAT_SIZE, MAX_NAME_FORMAT_REGEX_SIZE

MAX = 2**64 - 1
_TWO_TO_64 = math.ldexp(1.0, 64)
STRING_TRAVERSAL = 0.1
REGEX_LENGTH = 0.25
LIST_CREATE = 10
MAP_CREATE = 30
STRUCT_CREATE = 40
CALL_COST = 1

# resource.k8s.io/v1 limits behind the DRA size estimator.
DOMAIN_MAX = 63  # DeviceMaxDomainLength
ID_MAX = 32  # DeviceMaxIDLength
DRIVER_MAX = 63  # DriverNameMaxLength
ATTRIBUTES_PER_DEVICE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
ATTRIBUTE_VALUE_MAX = 64  # DeviceAttributeMaxValueLength
ATTRIBUTE_VALUES_PER_DEVICE = 48  # ResourceSliceMaxAttributeValuesPerDevice (list attributes)


def _add(x: int, y: int) -> int:
    return MAX if y > 0 and x > MAX - y else x + y


def _mul(x: int, y: int) -> int:
    return MAX if y != 0 and x > MAX // y else x * y


def _factor(x: int, y: float) -> int:
    """multiplyByCostFactor: float arithmetic, rounded up, saturating."""
    xf = float(x)
    if xf > 0 and y > 0 and xf > float(MAX) / y:
        return MAX
    ceil = math.ceil(xf * y)
    return MAX if ceil >= _TWO_TO_64 else int(ceil)


@dataclass(frozen=True)
class Estimate:
    """A [min, max] range: cel-go's SizeEstimate and CostEstimate share the arithmetic."""

    min: int
    max: int

    def add(self, other: Estimate) -> Estimate:
        return Estimate(_add(self.min, other.min), _add(self.max, other.max))

    def multiply(self, other: Estimate) -> Estimate:
        return Estimate(_mul(self.min, other.min), _mul(self.max, other.max))

    def factor(self, y: float) -> Estimate:
        return Estimate(_factor(self.min, y), _factor(self.max, y))

    def union(self, other: Estimate) -> Estimate:
        return Estimate(min(self.min, other.min), max(self.max, other.max))


def fixed(n: int) -> Estimate:
    return Estimate(n, n)


ZERO = fixed(0)
ONE = fixed(1)
UNKNOWN = Estimate(0, MAX)


@dataclass(frozen=True)
class _Entry:
    """entrySizeEstimate: container kind with key/index and value sizes."""

    container: str  # "list" or "map"
    key: Estimate
    value: Estimate

    def union(self, other: _Entry | None) -> _Entry | None:
        if other is None:
            return None
        return _Entry(self.container, self.key.union(other.key), self.value.union(other.value))


@dataclass
class _LocalVar:
    path: list[str]
    size: Estimate | None
    entry: _Entry | None


@dataclass(frozen=True)
class Node:
    """checker.AstNode: the path from `device`, the type, the expression and its computed size."""

    path: list[str] | None
    type: t.Type
    expr: ast.Expr | None
    computed: Estimate | None


@dataclass(frozen=True)
class CallEstimate:
    cost: Estimate
    result_size: Estimate | None = None


# -- the DRA size estimator ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Decl:
    max_elements: int
    fields: tuple[tuple[str, _Decl], ...] = ()
    key: _Decl | None = None
    elem: _Decl | None = None


def _device_decl(list_attributes: bool) -> tuple[_Decl, _Decl]:
    attribute = _Decl(
        max(ATTRIBUTE_VALUE_MAX, ATTRIBUTE_VALUES_PER_DEVICE) if list_attributes else ATTRIBUTE_VALUE_MAX
    )
    domain, ident = _Decl(DOMAIN_MAX), _Decl(ID_MAX)
    inner_attributes = _Decl(ATTRIBUTES_PER_DEVICE, key=ident, elem=attribute)
    outer_attributes = _Decl(ATTRIBUTES_PER_DEVICE, key=domain, elem=inner_attributes)
    inner_capacity = _Decl(ATTRIBUTES_PER_DEVICE, key=ident, elem=_Decl(0))
    outer_capacity = _Decl(ATTRIBUTES_PER_DEVICE, key=domain, elem=inner_capacity)
    device = _Decl(
        0,
        fields=(
            ("driver", _Decl(DRIVER_MAX)),
            ("attributes", outer_attributes),
            ("capacity", outer_capacity),
            ("allowMultipleAllocations", _Decl(1)),
        ),
    )
    return device, attribute


def _dra_size(path: Sequence[str] | None, list_attributes: bool) -> Estimate | None:
    """sizeEstimator.EstimateSize: walk the declared device type along the path."""
    if not path or path[0] != "device":
        return None
    device, attribute = _DEVICE_DECLS[list_attributes]
    current = device
    for name in path[1:]:
        if name in ("@items", "@values"):
            if current.elem is None:
                return None
            current = current.elem
        elif name == "@keys":
            if current.key is None:
                return None
            current = current.key
        else:
            field = dict(current.fields).get(name)
            if field is None:
                # Every value of an attribute map has the same maximum size, whatever its name.
                if current.elem is attribute:
                    current = attribute
                    continue
                return None
            current = field
    return Estimate(0, current.max_elements)


_DEVICE_DECLS = {flag: _device_decl(flag) for flag in (False, True)}


# -- the estimator ------------------------------------------------------------------------------------


class Coster(ast.Visitor[Estimate]):
    def __init__(self, checked: CheckResult, *, list_attributes: bool = False) -> None:
        self.checked = checked
        self.list_attributes = list_attributes
        self.paths: dict[ast.Expr, list[str]] = {}
        self.local_vars: dict[str, list[_LocalVar]] = {}
        self.sizes: dict[ast.Expr, Estimate] = {}
        self.entries: dict[ast.Expr, _Entry] = {}

    # -- helpers --------------------------------------------------------------------------------

    def type_of(self, e: ast.Expr) -> t.Type:
        return self.checked.types.get(e, t.DYN)

    def path_of(self, e: ast.Expr) -> list[str]:
        if isinstance(e, ast.Ident):
            local = self._peek(e.name)
            if local is not None:
                return list(local.path)
        return list(self.paths.get(e, []))

    def _peek(self, name: str) -> _LocalVar | None:
        stack = self.local_vars.get(name)
        return stack[-1] if stack else None

    def _push(self, name: str, local: _LocalVar) -> None:
        self.local_vars.setdefault(name, []).append(local)

    def _pop(self, name: str) -> None:
        self.local_vars[name].pop()

    def node(self, e: ast.Expr) -> Node:
        path = self.path_of(e)
        if path and path[0] in (ast.ACCUMULATOR, "__result__"):
            path = []
        return Node(path or None, self.type_of(e), e, self.size(e))

    def size(self, e: ast.Expr) -> Estimate | None:
        """computeSize: computed, literal, estimator, scalar type, then a local variable's size."""
        if e in self.sizes:
            return self.sizes[e]
        literal = _literal_size(e)
        if literal is not None:
            return literal
        estimated = _dra_size(self.path_of(e), self.list_attributes)
        if estimated is not None:
            self.sizes[e] = estimated
            return estimated
        scalar = _type_size(self.type_of(e))
        if scalar is not None:
            return scalar
        if isinstance(e, ast.Ident):
            local = self._peek(e.name)
            if local is not None and local.size is not None:
                return local.size
        return None

    def size_or_unknown(self, e: ast.Expr | Node) -> Estimate:
        if isinstance(e, Node):
            return e.computed if e.computed is not None else UNKNOWN
        found = self.size(e)
        return found if found is not None else UNKNOWN

    def estimate_size(self, node: Node) -> Estimate:
        """The size an estimator sees: computed, else the DRA estimator's, else unknown."""
        if node.computed is not None:
            return node.computed
        estimated = _dra_size(node.path, self.list_attributes)
        return estimated if estimated is not None else UNKNOWN

    def entry(self, e: ast.Expr) -> _Entry | None:
        if e in self.entries:
            return self.entries[e]
        if isinstance(e, ast.Ident):
            local = self._peek(e.name)
            if local is not None and local.entry is not None:
                return local.entry
        return None

    def _set_size(self, e: ast.Expr, size: Estimate | None) -> None:
        if size is not None:
            self.sizes[e] = size

    def _set_entry(self, e: ast.Expr, entry: _Entry | None) -> None:
        if entry is not None:
            self.entries[e] = entry

    # -- expressions ----------------------------------------------------------------------------

    def cost(self, e: ast.Expr) -> Estimate:
        return self.visit(e)

    def visit_literal(self, e: ast.Literal) -> Estimate:
        return ZERO

    def visit_struct(self, e: ast.StructExpr) -> Estimate:
        total = ZERO
        for f in e.fields:
            total = total.add(self.cost(f.value))
        return total.add(fixed(STRUCT_CREATE))

    def visit_comprehension(self, e: ast.Comprehension) -> Estimate:
        return self._bind(e) if _is_bind(e) else self._comprehension(e)

    def visit_ident(self, e: ast.Ident | ast.Select) -> Estimate:
        name = e.name if isinstance(e, ast.Ident) else _dotted(e)
        local = self._peek(name)
        self.paths[e] = list(local.path) if local is not None else [name]
        return ONE

    def visit_select(self, e: ast.Select) -> Estimate:
        if e in self.checked.type_idents or e in self.checked.enum_values:
            return self.visit_ident(e)  # a qualified type or enum name
        if e.test_only:
            return self.cost(e.operand)
        total = self.cost(e.operand)
        if self.type_of(e.operand).kind in (t.Kind.MAP, t.Kind.STRUCT, t.Kind.TYPE_PARAM):
            total = total.add(ONE)
        self.paths[e] = [*self.path_of(e.operand), e.field]
        return total

    def visit_call(self, e: ast.Call) -> Estimate:
        qualified = self.checked.qualified_calls.get(e)
        name = qualified or e.function.removeprefix(".")
        if name == "dyn" and len(e.args) == 1:
            arg_cost = self.cost(e.args[0])
            self._set_size(e, self.size(e.args[0]))
            self._set_entry(e, self.entry(e.args[0]))
            return ONE.add(arg_cost)
        arg_costs = []
        arg_nodes = []
        for arg in e.args:
            arg_costs.append(self.cost(arg))
            arg_nodes.append(self.node(arg))
        overloads = [o.id for o in self.checked.overloads.get(e, [])]
        if not overloads:
            return ZERO
        total = ZERO
        target: Node | None = None
        if e.target is not None and qualified is None:
            total = total.add(self.cost(e.target))
            target = self.node(e.target)
        fn_cost = Estimate(MAX, 0)
        result_size: Estimate | None = None
        for overload in overloads:
            estimate = self._function_cost(e, name, overload, target, arg_nodes, arg_costs)
            fn_cost = fn_cost.union(estimate.cost)
            if estimate.result_size is not None:
                result_size = (
                    estimate.result_size if result_size is None else result_size.union(estimate.result_size)
                )
            if overload in ("index_list", "index_map") and e.args:
                entry = self.entry(e.args[0])
                result_size = entry.value if entry is not None else None
                suffix = "@items" if overload == "index_list" else "@values"
                self.paths[e] = [*self.path_of(e.args[0]), suffix]
            if result_size is None:
                result_size = self.size(e)
        self._set_size(e, result_size)
        return total.add(fn_cost)

    def visit_list(self, e: ast.ListExpr) -> Estimate:
        total = ZERO
        item = Estimate(MAX, 0) if e.elements else ZERO
        for element in e.elements:
            total = total.add(self.cost(element))
            item = item.union(self.size_or_unknown(element))
        self._set_entry(e, _Entry("list", ONE, item))
        return total.add(fixed(LIST_CREATE))

    def visit_map(self, e: ast.MapExpr) -> Estimate:
        total = ZERO
        keys = Estimate(MAX, 0) if e.entries else ZERO
        values = Estimate(MAX, 0) if e.entries else ZERO
        for key, value in e.entries:
            total = total.add(self.cost(key)).add(self.cost(value))
            keys = keys.union(self.size_or_unknown(key))
            values = values.union(self.size_or_unknown(value))
        self._set_entry(e, _Entry("map", keys, values))
        return total.add(fixed(MAP_CREATE))

    def _push_local(self, name: str, e: ast.Expr) -> None:
        self._push(name, _LocalVar(self.path_of(e), self.size(e), self.entry(e)))

    def _push_iter(self, name: str, range_expr: ast.Expr, role: str) -> None:
        """pushIterKey / pushIterValue / pushIterSingle."""
        entry = self.entry(range_expr)
        container = entry.container if entry is not None else _container(self.type_of(range_expr))
        size: Estimate | None
        if role == "key":
            size = entry.key if entry is not None else None
            subpath = "@indices" if container == "list" else "@keys"
        elif role == "value":
            size = entry.value if entry is not None else None
            subpath = "@items" if container == "list" else "@values"
        else:
            size = entry.key if entry is not None else None
            subpath = "@keys"
            if container == "list":
                size = entry.value if entry is not None else None
                subpath = "@items"
        self._push(name, _LocalVar([*self.path_of(range_expr), subpath], size, None))

    def _comprehension(self, e: ast.Comprehension) -> Estimate:
        total = self.cost(e.iter_range).add(self.cost(e.accu_init))
        self._push_local(e.accu_var, e.accu_init)
        if e.iter_var2:
            self._push_iter(e.iter_var, e.iter_range, "key")
            self._push_iter(e.iter_var2, e.iter_range, "value")
        else:
            self._push_iter(e.iter_var, e.iter_range, "single")
        loop = self.cost(e.loop_condition)
        step = self.cost(e.loop_step)
        self._pop(e.iter_var)
        if e.iter_var2:
            self._pop(e.iter_var2)
        total = total.add(self.cost(e.result))
        self._pop(e.accu_var)
        count = self.size_or_unknown(e.iter_range)
        total = total.add(count.multiply(step.add(loop)))
        if isinstance(e.accu_init, ast.Literal):
            self._set_size(e, self.size(e.accu_init))
        elif isinstance(e.accu_init, ast.ListExpr | ast.MapExpr):
            self._set_size(e, count)
            self._set_entry(e, self.entry(e.loop_step))
        return total

    def _bind(self, e: ast.Comprehension) -> Estimate:
        total = self.cost(e.iter_range).add(self.cost(e.accu_init))
        self._push_local(e.accu_var, e.accu_init)
        total = total.add(self.cost(e.result))
        self._pop(e.accu_var)
        self._set_size(e, self.size(e.result))
        self._set_entry(e, self.entry(e.result))
        return total

    # -- calls ------------------------------------------------------------------------------------

    def _function_cost(  # noqa: PLR0917 - the shape of cel-go's functionCost
        self,
        e: ast.Call,
        function: str,
        overload: str,
        target: Node | None,
        args: list[Node],
        arg_costs: list[Estimate],
    ) -> CallEstimate:
        arg_sum = ZERO
        for cost in arg_costs:
            arg_sum = arg_sum.add(cost)
        estimator = _OVERLOAD_ESTIMATORS.get(overload)
        if estimator is not None:
            estimate = estimator(self, target, args)
            if estimate is not None:
                return CallEstimate(estimate.cost.add(arg_sum), estimate.result_size)
        library = self._library_cost(function, overload, target, args)
        if library is not None:
            return CallEstimate(library.cost.add(arg_sum), library.result_size)
        return self._builtin_cost(e, overload, target, args, arg_costs, arg_sum)

    def _builtin_cost(  # noqa: PLR0917 - the shape of cel-go's functionCost
        self,
        e: ast.Call,
        overload: str,
        target: Node | None,
        args: list[Node],
        arg_costs: list[Estimate],
        arg_sum: Estimate,
    ) -> CallEstimate:
        if overload in ("string_to_bytes", "bytes_to_string", "strings_quote") and len(args) == 1:
            size = self.size_or_unknown(args[0])
            # Plain Go uint64 arithmetic here, which wraps around (an unknown size times 2 plus 2 is 0).
            result = {
                "string_to_bytes": Estimate(size.min, size.max * 4 % 2**64),
                "bytes_to_string": Estimate(size.min // 4, size.max),
                "strings_quote": Estimate((size.min + 2) % 2**64, (size.max * 2 + 2) % 2**64),
            }[overload]
            return CallEstimate(size.factor(STRING_TRAVERSAL).add(arg_sum), result)
        if overload in ("starts_with_string", "ends_with_string") and len(args) == 1:
            return CallEstimate(self.size_or_unknown(args[0]).factor(STRING_TRAVERSAL).add(arg_sum))
        if overload == "in_list" and len(args) == 2:
            return CallEstimate(self.size_or_unknown(args[1]).factor(1).add(arg_sum))
        if overload == "matches_string" and target is not None and len(args) == 1:
            text = self.size_or_unknown(target).add(ONE).factor(STRING_TRAVERSAL)
            regex = self.size_or_unknown(args[0]).factor(REGEX_LENGTH)
            return CallEstimate(text.multiply(regex).add(arg_sum))
        if overload == "contains_string" and target is not None and len(args) == 1:
            text = self.size_or_unknown(target).factor(STRING_TRAVERSAL)
            sub = self.size_or_unknown(args[0]).factor(STRING_TRAVERSAL)
            return CallEstimate(text.multiply(sub).add(arg_sum))
        if overload in ("logical_or", "logical_and"):
            lhs, rhs = arg_costs
            return CallEstimate(Estimate(lhs.min, lhs.add(rhs).max))
        if overload == "conditional":
            size = self.size_or_unknown(args[1]).union(self.size_or_unknown(args[2]))
            first = self.entry(e.args[1])
            second = self.entry(e.args[2])
            self._set_entry(e, first.union(second) if first is not None else None)
            return CallEstimate(arg_costs[0].add(arg_costs[1].union(arg_costs[2])), size)
        if overload in ("add_string", "add_bytes", "add_list") and len(args) == 2:
            result = self.size_or_unknown(args[0]).add(self.size_or_unknown(args[1]))
            first = self.entry(e.args[0])
            second = self.entry(e.args[1])
            self._set_entry(e, first.union(second) if first is not None else None)
            if overload == "add_list":
                return CallEstimate(ONE.add(arg_sum), result)
            return CallEstimate(result.factor(STRING_TRAVERSAL).add(arg_sum), result)
        if overload in _SIZED_COMPARISONS:
            lhs, rhs = self.size_or_unknown(args[0]), self.size_or_unknown(args[1])
            smallest = min(lhs.max, rhs.max)
            return CallEstimate(
                Estimate(1 if smallest > 0 else 0, smallest).factor(STRING_TRAVERSAL).add(arg_sum)
            )
        return CallEstimate(ONE.add(arg_sum))

    def _library_cost(
        self, function: str, overload: str, target: Node | None, args: list[Node]
    ) -> CallEstimate | None:
        """The DRA estimator (`includes`) and Kubernetes' CostEstimator.EstimateCallCost."""
        estimator = _LIBRARY_ESTIMATORS.get(function)
        return estimator(self, overload, target, args) if estimator is not None else None


_SIZED_COMPARISONS = frozenset(
    [
        f"{op}_{kind}"
        for op in ("less", "greater", "less_equals", "greater_equals")
        for kind in ("string", "bytes")
    ]
    + ["equals", "not_equals"]
)
_NOMINAL = frozenset(
    {"masked", "prefixLength", "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast"}
    | {"isLinkLocalUnicast", "isGlobalUnicast", "format.named", "sign", "asInteger", "isInteger"}
    | {
        "asApproximateFloat",
        "isGreaterThan",
        "isLessThan",
        "compareTo",
        "add",
        "sub",
        "major",
        "minor",
        "patch",
    }
    | {"getScheme", "getHostname", "getHost", "getPort", "getEscapedPath", "getQuery"}
)


def _list_element(node: Node) -> Node | None:
    """CostEstimator.listElementNode: the element type, with an `@items` path when known."""
    if not node.type.params:
        return None
    path = [*node.path, "@items"] if node.path is not None else None
    return Node(path, node.type.params[0], None, None)


def _container(ty: t.Type) -> str:
    return "list" if ty.kind is t.Kind.LIST else "map" if ty.kind is t.Kind.MAP else ""


def _dotted(e: ast.Expr) -> str:
    if isinstance(e, ast.Select):
        return f"{_dotted(e.operand)}.{e.field}"
    return e.name if isinstance(e, ast.Ident) else ""


def _is_bind(e: ast.Comprehension) -> bool:
    return (
        isinstance(e.iter_range, ast.ListExpr)
        and not e.iter_range.elements
        and isinstance(e.loop_condition, ast.Literal)
        and e.loop_condition.value is False
        and e.accu_var != ast.ACCUMULATOR
    )


def _literal_size(e: ast.Expr) -> Estimate | None:
    """computeExprSize: exact sizes of literals and of list and map literals."""
    if isinstance(e, ast.Literal):
        value = e.value
        if isinstance(value, str):
            return fixed(len(value))
        if isinstance(value, bytes):
            return fixed(len(value))
        return ONE
    if isinstance(e, ast.ListExpr):
        return fixed(len(e.elements))
    if isinstance(e, ast.MapExpr):
        return fixed(len(e.entries))
    return None


def _type_size(ty: t.Type) -> Estimate | None:
    if ty.kind in (t.Kind.BOOL, t.Kind.DOUBLE, t.Kind.DURATION, t.Kind.INT, t.Kind.TIMESTAMP, t.Kind.UINT):
        return ONE
    if ty.kind is t.Kind.OPAQUE and ty.name == "optional_type" and ty.params:
        return _type_size(ty.params[0])
    return None


# -- ext lists and sets estimators (OverloadCostEstimate) -------------------------------------------------


def _int_literal(node: Node, default: int) -> int:
    expr = node.expr
    if isinstance(expr, ast.Literal) and type(expr.value) is int:
        return max(expr.value, 0)
    return default


def _allocating(factor: float, size: Estimate) -> CallEstimate:
    cost = size.factor(factor).add(fixed(CALL_COST)).add(fixed(LIST_CREATE))
    return CallEstimate(cost, size)


def _slice(c: Coster, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None or len(args) != 2:
        return None
    size = c.estimate_size(target)
    start, end = _int_literal(args[0], 0), _int_literal(args[1], size.max)
    return _allocating(1, fixed((end - start) % 2**64))


def _range(_c: Coster, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is not None or len(args) != 1:
        return None
    return _allocating(1, fixed(_int_literal(args[0], MAX)))


def _reverse(c: Coster, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None or args:
        return None
    return _allocating(1, c.estimate_size(target))


def _flatten(c: Coster, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None or len(args) > 1:
        return None
    depth = _int_literal(args[0], MAX) if args else 1
    return _allocating(float(depth), c.estimate_size(target))


def _distinct(c: Coster, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None or args:
        return None
    size = c.estimate_size(target)
    return _allocating(2.0, size.multiply(size))


def _sort(
    element: t.Type, *, by_keys: bool
) -> Callable[[Coster, Node | None, list[Node]], CallEstimate | None]:
    def estimate(c: Coster, target: Node | None, args: list[Node]) -> CallEstimate | None:
        if target is None or len(args) != (1 if by_keys else 0):
            return None
        size = c.estimate_size(args[0] if by_keys else target)
        factor = 2.0 + (STRING_TRAVERSAL if element in (t.STRING, t.BYTES) else 0.0)
        return _allocating(factor, size.multiply(size))

    return estimate


def _sets(factor: float) -> Callable[[Coster, Node | None, list[Node]], CallEstimate | None]:
    def estimate(c: Coster, _target: Node | None, args: list[Node]) -> CallEstimate | None:
        if len(args) != 2:
            return None
        size = c.estimate_size(args[0]).multiply(c.estimate_size(args[1]))
        return CallEstimate(size.factor(factor).add(fixed(CALL_COST)))

    return estimate


def _overload_estimators() -> dict[str, Callable[[Coster, Node | None, list[Node]], CallEstimate | None]]:
    out: dict[str, Callable[[Coster, Node | None, list[Node]], CallEstimate | None]] = {
        "list_slice": _slice,
        "list_flatten": _flatten,
        "list_flatten_int": _flatten,
        "lists_range": _range,
        "list_reverse": _reverse,
        "list_distinct": _distinct,
        "list_sets_contains_list": _sets(1),
        "list_sets_intersects_list": _sets(1),
        "list_sets_equivalent_list": _sets(2),
    }
    for name, element in SORTABLE:
        out[f"list_{name}_sort"] = _sort(element, by_keys=False)
        out[f"list_{name}_sortByAssociatedKeys"] = _sort(element, by_keys=True)
    return out


_OVERLOAD_ESTIMATORS = _overload_estimators()


# -- library functions (CostEstimator.EstimateCallCost), by function name -----------------------

_LibraryEstimator = Callable[[Coster, str, Node | None, list[Node]], CallEstimate | None]


def _includes(_c: Coster, overload: str, target: Node | None, _args: list[Node]) -> CallEstimate | None:
    if overload == "dra_includes_dyn_dyn" and target is not None:
        return CallEstimate(Estimate(0, ATTRIBUTE_VALUES_PER_DEVICE).multiply(ONE))
    return None


def _list_scan(c: Coster, _overload: str, target: Node | None, _args: list[Node]) -> CallEstimate | None:
    """isSorted, sum, max, min, indexOf, lastIndexOf: one pass over the list."""
    if target is None:
        return None
    element = _list_element(target)
    if element is None:
        return CallEstimate(c.estimate_size(target).factor(STRING_TRAVERSAL))
    cost = ONE
    if element.type.kind in (t.Kind.STRING, t.Kind.BYTES):
        cost = cost.add(c.estimate_size(element).factor(STRING_TRAVERSAL))
    return CallEstimate(c.estimate_size(target).multiply(cost))


def _url(c: Coster, _overload: str, _target: Node | None, args: list[Node]) -> CallEstimate | None:
    if len(args) != 1:
        return None
    size = c.estimate_size(args[0])
    return CallEstimate(size.factor(STRING_TRAVERSAL), size)


def _format(c: Coster, _overload: str, target: Node | None, _args: list[Node]) -> CallEstimate | None:
    return CallEstimate(c.estimate_size(target).factor(STRING_TRAVERSAL)) if target is not None else None


def _string_copy(c: Coster, _overload: str, target: Node | None, _args: list[Node]) -> CallEstimate | None:
    """lowerAscii, upperAscii, substring, trim: a pass over the string, a result as long."""
    if target is None:
        return None
    size = c.estimate_size(target)
    return CallEstimate(size.factor(STRING_TRAVERSAL), size)


def _replace(c: Coster, _overload: str, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None or len(args) < 2:
        return None
    size = c.estimate_size(target)
    old = c.estimate_size(args[0])
    new = c.estimate_size(args[1])
    count_max, retained_max = _replace_bound(size.max, old.min, kept=new.max <= old.min)
    count_max = MAX if count_max >= _TWO_TO_64 else count_max
    count_min, retained_min = _replace_bound(size.min, old.max, kept=old.max <= new.min)
    result = Estimate(count_min, count_max).multiply(new).add(Estimate(retained_min, retained_max))
    return CallEstimate(size.factor(2 * STRING_TRAVERSAL), result)


def _replace_bound(length: int, old: int, *, kept: bool) -> tuple[int, int]:
    """One bound of replace()'s result for a string `length` long whose replaced text is `old`
    long: (replacements, characters retained); `kept` when the replacement cannot move it."""
    if old == 0:
        return (length + 1 if length < MAX else length), length
    if kept:
        return 0, length
    return math.ceil(float(length) / float(old)), 0


def _split(c: Coster, _overload: str, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None:
        return None
    size = c.estimate_size(target)
    most = size.max
    if len(args) > 1 and isinstance(args[1].expr, ast.Literal) and type(args[1].expr.value) is int:
        most = args[1].expr.value % 2**64
    return CallEstimate(size.factor(2 * STRING_TRAVERSAL), Estimate(0, most))


def _join(c: Coster, _overload: str, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None:
        return None
    list_size = c.estimate_size(target)
    element = _list_element(target)
    size = ZERO
    if element is not None:
        size = list_size.multiply(c.estimate_size(element))
    if args:
        separator = c.estimate_size(args[0])
        separators = Estimate(max(list_size.min - 1, 0), max(list_size.max - 1, 0))
        size = size.add(separator.multiply(separators))
    return CallEstimate(size.factor(STRING_TRAVERSAL), size)


def _find(c: Coster, _overload: str, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None or not args:
        return None
    size = c.estimate_size(target)
    text = size.add(ONE).factor(STRING_TRAVERSAL)
    regex = c.estimate_size(args[0]).factor(REGEX_LENGTH)
    return CallEstimate(text.multiply(regex), Estimate(0, size.max))


def _parse_argument(c: Coster, _overload: str, _target: Node | None, args: list[Node]) -> CallEstimate | None:
    """cidr, isIP, isCIDR, quantity, isQuantity, semver, isSemver: a pass over the string."""
    return CallEstimate(c.estimate_size(args[0]).factor(STRING_TRAVERSAL)) if args else None


def _ip(c: Coster, overload: str, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if overload == "cidr_ip":
        return CallEstimate(ONE)
    return _parse_argument(c, overload, target, args)


def _is_canonical(c: Coster, _overload: str, _target: Node | None, args: list[Node]) -> CallEstimate | None:
    return CallEstimate(c.estimate_size(args[0]).factor(2 * STRING_TRAVERSAL)) if args else None


def _nominal(_c: Coster, _overload: str, _target: Node | None, _args: list[Node]) -> CallEstimate | None:
    return CallEstimate(ONE)


def _contains(*, of_cidr: bool) -> _LibraryEstimator:
    """containsIP (`of_cidr` False) and containsCIDR."""

    def estimate(c: Coster, overload: str, _target: Node | None, args: list[Node]) -> CallEstimate | None:
        if not args:
            return None
        size = Estimate(4, 16)
        cost = size.add(size).factor(STRING_TRAVERSAL)
        if of_cidr:
            cost = cost.add(size.factor(STRING_TRAVERSAL)).add(ONE)
        if overload in ("cidr_contains_ip_string", "cidr_contains_cidr_string"):
            cost = cost.add(c.estimate_size(args[0]).factor(STRING_TRAVERSAL))
        return CallEstimate(cost)

    return estimate


def _validate(c: Coster, _overload: str, target: Node | None, args: list[Node]) -> CallEstimate | None:
    if target is None or not args:
        return None
    # Kubernetes estimates every format with the largest regex it allows.
    size = c.estimate_size(args[0]).factor(STRING_TRAVERSAL)
    return CallEstimate(size.factor(MAX_NAME_FORMAT_REGEX_SIZE * REGEX_LENGTH))


def _equals(_c: Coster, _overload: str, _target: Node | None, args: list[Node]) -> CallEstimate | None:
    """`==` of two library values of one type."""
    if len(args) != 2 or args[0].type != args[1].type:
        return None
    kind, name = args[0].type.kind, args[0].type.name
    if (kind is t.Kind.OPAQUE and name in ("net.IP", "net.CIDR")) or (
        kind is t.Kind.STRUCT and name in ("kubernetes.Quantity", "kubernetes.Semver")
    ):
        return CallEstimate(ONE)
    if kind is t.Kind.STRUCT and name == "kubernetes.NamedFormat":
        return CallEstimate(Estimate(1, MAX_FORMAT_SIZE).factor(STRING_TRAVERSAL))
    if kind is t.Kind.STRUCT and name == "kubernetes.URL":
        # Kubernetes takes both sides' size from the right-hand operand.
        size = args[1].computed or Estimate(1, 1)
        return CallEstimate(Estimate(1, size.max).factor(STRING_TRAVERSAL))
    return None


def _library_estimators() -> dict[str, _LibraryEstimator]:
    out: dict[str, _LibraryEstimator] = {
        "includes": _includes,
        "url": _url,
        "format": _format,
        "replace": _replace,
        "split": _split,
        "join": _join,
        "ip": _ip,
        "ip.isCanonical": _is_canonical,
        "validate": _validate,
        "_==_": _equals,
        "containsIP": _contains(of_cidr=False),
        "containsCIDR": _contains(of_cidr=True),
    }
    groups: list[tuple[tuple[str, ...], _LibraryEstimator]] = [
        (("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"), _list_scan),
        (("lowerAscii", "upperAscii", "substring", "trim"), _string_copy),
        (("find", "findAll"), _find),
        (("cidr", "isIP", "isCIDR", "quantity", "isQuantity", "semver", "isSemver"), _parse_argument),
        (tuple(_NOMINAL), _nominal),
    ]
    for names, estimator in groups:
        for name in names:
            assert name not in out, name  # the names are disjoint, so the order of rules never mattered
            out[name] = estimator
    return out


_LIBRARY_ESTIMATORS = _library_estimators()


def estimate_cost(root: ast.Expr, checked: CheckResult, *, list_attributes: bool = False) -> int:
    """The maximum of cel-go's EstimateCost for a checked selector."""
    return Coster(checked, list_attributes=list_attributes).cost(root).max
