"""`compile_selector` and `Selector`: the public face of the DRA CEL evaluator."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.offline.cel import ast, formatting
from dradriver.offline.cel import types as t
from dradriver.offline.cel.checker import (
    DEVICE_TYPE,
    LIST_ATTRIBUTES_STRUCT_FIELDS,
    STRUCT_FIELDS,
    Checker,
    CheckError,
    CheckResult,
    issues_text,
    validate_aggregates,
    walk,
)
from dradriver.offline.cel.cost import estimate_cost
from dradriver.offline.cel.decls import GATED_FUNCTIONS, Overload, declarations
from dradriver.offline.cel.device import CELDevice, to_cel_device
from dradriver.offline.cel.errors import (
    COMPILATION_FAILED,
    CELCompileError,
    CELRuntimeError,
    CostLimitError,
    EvalError,
    InternalError,
)
from dradriver.offline.cel.functions import RUNTIME, compile_regex
from dradriver.offline.cel.parser import format_issue, parse
from dradriver.offline.cel.program import (
    COST_LIMIT,
    COST_LIMIT_MESSAGE,
    DEVICE_SLOT,
    Activation,
    Compiler,
    Eval,
    ProgramError,
)
from dradriver.offline.cel.values import type_name

# resourceapi.CELSelectorExpressionMaxLength.
MAX_EXPRESSION_LENGTH = 10 * 1024
_CACHE_SIZE = 1024

_DECLARATIONS = declarations()
_NEW_DECLARATIONS = {name: ovs for name, ovs in _DECLARATIONS.items() if name not in GATED_FUNCTIONS}


@dataclass(frozen=True)
class Evaluation:
    """The outcome of one selector on one device, with the cost it spent."""

    matched: bool
    cost: int


class Selector:
    """A compiled DRA selector expression. Immutable; safe to share between threads."""

    __slots__ = ("_program", "_slot_count", "cost_limit", "estimated_cost", "expression", "result_type")

    def __init__(  # noqa: PLR0917 - built by _compile only
        self,
        expression: str,
        program: Eval,
        slot_count: int,
        result_type: t.Type,
        cost_limit: int,
        estimated_cost: int,
    ) -> None:
        self.expression = expression
        self.result_type = result_type
        self.cost_limit = cost_limit
        # The API server's worst-case estimate (cel-go EstimateCost with the DRA size estimator);
        # it rejects a selector above COST_LIMIT when the class or claim is created.
        self.estimated_cost = estimated_cost
        self._program = program
        self._slot_count = slot_count

    def matches(self, device: Mapping[str, Any] | CELDevice, driver: str) -> bool:
        """Whether the device satisfies the expression; CELRuntimeError where Kubernetes errors.

        `device` is a resource.k8s.io/v1 Device in JSON form, or a `CELDevice` built once with
        `to_cel_device` and reused across selectors (much faster for many selectors).
        """
        return self.evaluate(device, driver).matched

    def evaluate(self, device: Mapping[str, Any] | CELDevice, driver: str) -> Evaluation:
        """Like `matches`, and also report the cost spent (cel-go's actual cost, approximately)."""
        if isinstance(device, CELDevice):
            if device.driver != driver:
                raise ValueError(
                    f"device {device.name!r} was converted for driver {device.driver!r}, not {driver!r}"
                )
            cel_device = device
        else:
            cel_device = to_cel_device(device, driver)
        if cel_device.error is not None:
            raise CELRuntimeError(cel_device.error)
        act = Activation(self._slot_count, self.cost_limit)
        act.slots[DEVICE_SLOT] = cel_device.value
        try:
            result = self._program(act)
        except EvalError as err:
            raise CELRuntimeError(err.message) from None
        except CostLimitError:
            raise CELRuntimeError(COST_LIMIT_MESSAGE) from None
        except InternalError as err:
            raise CELRuntimeError(err.message) from None
        except RecursionError:
            raise CELRuntimeError("evaluation nests too deeply") from None
        if act.cost > act.limit:
            raise CELRuntimeError(COST_LIMIT_MESSAGE)
        if type(result) is not bool:
            raise CELRuntimeError(
                f"CEL result of type {type_name(result)} could not be converted to bool: "
                + _to_bool_error(result)
            )
        return Evaluation(result, act.cost)

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


_cache: OrderedDict[tuple[str, int, bool, bool], Selector | CELCompileError] = OrderedDict()
_cache_lock = threading.Lock()


def compile_selector(
    expression: str, *, cost_limit: int = COST_LIMIT, new: bool = False, list_type_attributes: bool = False
) -> Selector:
    """Compile a DRA selector with Kubernetes' semantics; CELCompileError if Kubernetes rejects it.

    By default with the scheduler's environment (cel-go StoredExpressions: everything the
    release declares, `includes` too); `new=True` is the API server's for a new selector, where
    `includes` exists only with DRAListTypeAttributes, which is off in 1.36.
    `list_type_attributes` turns that gate on: attribute values are `dyn` (lists can be ranged
    over, and a bare attribute is an acceptable result) and the estimate allows list values;
    evaluate such selectors on devices converted with the gate too (`to_cel_device`).

    Results (and compile errors) are cached per expression, so calling this for every device
    costs a dictionary lookup after the first time.
    """
    key = (expression, cost_limit, new, list_type_attributes)
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None:
            _cache.move_to_end(key)
    if cached is None:
        try:
            declared = _NEW_DECLARATIONS if new and not list_type_attributes else _DECLARATIONS
            cached = _compile(expression, cost_limit, declared, list_type_attributes)
        except CELCompileError as err:
            cached = err
        with _cache_lock:
            _cache[key] = cached
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(cached, CELCompileError):
        raise CELCompileError(cached.message, expression=expression, hint=cached.hint)
    return cached


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _compile(
    expression: str, cost_limit: int, declared: dict[str, list[Overload]], list_type_attributes: bool
) -> Selector:
    size = len(expression.encode())
    if size > MAX_EXPRESSION_LENGTH:
        raise CELCompileError(
            f"expression is too long: may not be more than {MAX_EXPRESSION_LENGTH} bytes (has {size})",
            expression=expression,
        )
    root = parse(expression)
    try:
        fields = LIST_ATTRIBUTES_STRUCT_FIELDS if list_type_attributes else STRUCT_FIELDS
        checker = Checker(declared, {"device": DEVICE_TYPE}, fields)
        checked = checker.check(root)
        # cel-go runs the AST validators only on an expression that type-checked.
        issues = checker.errors or (
            _validate_conversion_literals(root, checked)
            + _validate_regex_literals(root)
            + validate_aggregates(root, checked)
            + _validate_format_literals(root, checked)
        )
    except RecursionError:
        raise CELCompileError(
            COMPILATION_FAILED + format_issue(expression, "expression nests too deeply", (1, 1)),
            expression=expression,
        ) from None
    if issues:
        raise CELCompileError(COMPILATION_FAILED + issues_text(expression, issues), expression=expression)
    result_type = checked.types[root]
    # CompileCELExpression: bool, or exactly the attribute type (any; dyn with the gate).
    if result_type.nullable or result_type.kind not in (
        t.Kind.BOOL,
        t.Kind.DYN if list_type_attributes else t.Kind.ANY,
    ):
        raise CELCompileError(
            f"must evaluate to bool or the unknown type, not {_type_string(result_type)}",
            expression=expression,
        )
    compiler = Compiler(checked, {"device": DEVICE_SLOT})
    try:
        program = compiler.compile(root)
    except (EvalError, ProgramError) as err:
        raise CELCompileError(f"program instantiation failed: {err.message}", expression=expression) from None
    estimated = estimate_cost(root, checked, list_attributes=list_type_attributes)
    return Selector(expression, program, compiler.slot_count, result_type, cost_limit, estimated)


def _to_bool_error(value: object) -> str:
    """The ConvertToNative(bool) error of cel-go's value types (string.go, int.go, uint.go)."""
    name = type_name(value)
    if name == "string":
        return "unsupported native conversion from string to 'bool'"
    if name in ("int", "uint"):
        return f"unsupported type conversion from '{name}' to bool"
    if name == "list":
        return "type conversion error from list to 'bool'"
    return f"type conversion error from '{name}' to 'bool'"


def _type_string(ty: t.Type) -> str:
    """cel-go Type.String(): what CompileCELExpression prints for a wrong result type."""
    if ty.kind is t.Kind.TYPE_PARAM:
        return f"<{ty.name}>"
    if not ty.params:
        return t.declared_name(ty)
    return f"{ty.name}({', '.join(_type_string(p) for p in ty.params)})"


def _validate_conversion_literals(root: ast.Expr, checked: CheckResult) -> list[CheckError]:
    """cel-go ValidateDurationLiterals and ValidateTimestampLiterals: a literal argument of
    `duration` / `timestamp` must convert (durations first, then timestamps)."""
    errors = []
    for function in ("duration", "timestamp"):
        convert = RUNTIME[function][0]
        for node in walk(root):
            if isinstance(node, ast.Call) and node.function == function and node.target is None and node.args:
                if node in checked.qualified_calls:
                    continue
                first = node.args[0]
                if isinstance(first, ast.Literal):
                    try:
                        convert(first.value)
                    except EvalError:
                        errors.append(CheckError(f"invalid {function} argument", first.pos))
    return errors


# What each clause accepts, by checked type kind (stringFormatChecker.verifyTypeOneOf).
_CLAUSE_KINDS = {
    "d": {t.Kind.INT, t.Kind.UINT},
    "f": {t.Kind.DOUBLE, t.Kind.STRING},
    "e": {t.Kind.DOUBLE, t.Kind.STRING},
    "b": {t.Kind.INT, t.Kind.UINT, t.Kind.BOOL},
    "x": {t.Kind.INT, t.Kind.UINT, t.Kind.STRING, t.Kind.BYTES},
    "X": {t.Kind.INT, t.Kind.UINT, t.Kind.STRING, t.Kind.BYTES},
    "o": {t.Kind.INT, t.Kind.UINT},
}
_STRING_CLAUSE_KINDS = {t.Kind.LIST, t.Kind.MAP, t.Kind.INT, t.Kind.UINT, t.Kind.DOUBLE, t.Kind.BOOL}
_STRING_CLAUSE_KINDS |= {
    t.Kind.STRING,
    t.Kind.TIMESTAMP,
    t.Kind.BYTES,
    t.Kind.DURATION,
    t.Kind.TYPE,
    t.Kind.NULL,
}


def _validate_format_literals(root: ast.Expr, checked: CheckResult) -> list[CheckError]:
    """ext strings' stringFormatValidator: a literal format string applied to a list literal is
    checked clause by clause against the arguments' types, and every argument must be used."""
    errors = []
    for node in walk(root):
        if not (
            isinstance(node, ast.Call)
            and node.function == "format"
            and isinstance(node.target, ast.Literal)
            and type(node.target.value) is str
            and len(node.args) == 1
            and isinstance(node.args[0], ast.ListExpr)
        ):
            continue
        ids = [overload.id for overload in checked.overloads.get(node, [])]
        if ids and "string_format" not in ids:
            continue
        args = node.args[0].elements
        used = 0

        def verify(clause: formatting.Clause, args: list[ast.Expr] = args) -> str:
            nonlocal used
            used += 1
            arg = args[clause.index]
            bad = _unformattable(arg, checked) if clause.letter == "s" else None
            if clause.letter != "s" and not _kind_ok(arg, checked, _CLAUSE_KINDS[clause.letter]):
                bad = arg
            if bad is not None:
                kind = checked.types[bad].name
                raise formatting.FormatError(formatting.clause_message(clause.letter, kind), id(bad))
            return ""

        try:
            formatting.run(node.target.value, len(args), verify, checking=True)
        except formatting.FormatError as err:
            where = next((a.pos for a in walk(node.args[0]) if id(a) == err.index), node.pos)
            errors.append(CheckError(err.message, where))
            continue
        if len(args) > used:
            errors.append(
                CheckError(
                    f"too many arguments supplied to string.format (expected {used}, got {len(args)})",
                    node.pos,
                )
            )
    return errors


def _kind_ok(arg: ast.Expr, checked: CheckResult, kinds: set[t.Kind]) -> bool:
    ty = checked.types[arg]
    return ty.kind is t.Kind.DYN or ty.kind in kinds


def _unformattable(arg: ast.Expr, checked: CheckResult) -> ast.Expr | None:
    """verifyString: the first (sub-)expression the string clause cannot print, or None."""
    if not _kind_ok(arg, checked, _STRING_CLAUSE_KINDS):
        return arg
    parts: list[ast.Expr] = []
    if isinstance(arg, ast.ListExpr):
        parts = list(arg.elements)
    elif isinstance(arg, ast.MapExpr):
        parts = [part for entry in arg.entries for part in entry]
    for part in parts:
        bad = _unformattable(part, checked)
        if bad is not None:
            return bad
    return None


def _validate_regex_literals(root: ast.Expr) -> list[CheckError]:
    """cel-go ValidateRegexLiterals: a constant first argument of `matches` must compile."""
    errors = []
    for node in walk(root):
        if isinstance(node, ast.Call) and node.function == "matches" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Literal) and isinstance(first.value, str):
                try:
                    compile_regex(first.value)
                except EvalError:
                    errors.append(CheckError("invalid matches argument", first.pos))
    return errors
