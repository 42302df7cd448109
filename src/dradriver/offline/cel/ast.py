"""The CEL expression tree after parsing and macro expansion (cel-go's ast.Expr kinds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass(eq=False)
class Expr:
    """Base node. `pos` is the 1-based (line, column) of the node in the source."""

    pos: tuple[int, int] = field(default=(1, 1), kw_only=True)


@dataclass(eq=False)
class Literal(Expr):
    value: Any


@dataclass(eq=False)
class Ident(Expr):
    name: str


@dataclass(eq=False)
class Select(Expr):
    operand: Expr
    field: str
    test_only: bool = False


@dataclass(eq=False)
class Call(Expr):
    function: str
    args: list[Expr]
    target: Expr | None = None


@dataclass(eq=False)
class ListExpr(Expr):
    elements: list[Expr]
    # `[?x]`: the indexes of elements that are optionals, added only when they hold a value.
    optional_indices: frozenset[int] = frozenset()


@dataclass(eq=False)
class MapExpr(Expr):
    entries: list[tuple[Expr, Expr]]
    # `{?k: v}`: the indexes of entries whose value is an optional, set only when it holds one.
    optional_entries: frozenset[int] = frozenset()


@dataclass(eq=False)
class StructField:
    """`name: value` in a message literal, placed at its ':'; `?name:` takes an optional value."""

    name: str
    value: Expr
    pos: tuple[int, int]
    optional: bool = False


@dataclass(eq=False)
class StructExpr(Expr):
    """`Type{field: value}`: message construction (protobuf wrappers, Timestamp, Duration)."""

    type_name: str
    fields: list[StructField]


@dataclass(eq=False)
class Comprehension(Expr):
    """The fold every macro expands to; `macro` names the macro so evaluation can take a fast path."""

    iter_range: Expr
    iter_var: str
    accu_var: str
    accu_init: Expr
    loop_condition: Expr
    loop_step: Expr
    result: Expr
    iter_var2: str = ""
    macro: str = ""
    macro_args: list[Expr] = field(default_factory=list)


ACCUMULATOR = "@result"

# cel-go operator function names (common/operators).
CONDITIONAL = "_?_:_"
LOGICAL_AND = "_&&_"
LOGICAL_OR = "_||_"
LOGICAL_NOT = "!_"
NOT_STRICTLY_FALSE = "@not_strictly_false"
EQUALS = "_==_"
NOT_EQUALS = "_!=_"
LESS = "_<_"
LESS_EQUALS = "_<=_"
GREATER = "_>_"
GREATER_EQUALS = "_>=_"
ADD = "_+_"
SUBTRACT = "_-_"
MULTIPLY = "_*_"
DIVIDE = "_/_"
MODULO = "_%_"
NEGATE = "-_"
INDEX = "_[_]"
OPT_SELECT = "_?._"
OPT_INDEX = "_[?_]"
IN = "@in"


class Visitor(Generic[R]):
    """A pass over the tree with one method per node kind: `visit` picks it (cel-go's switch on
    the expression kind); a kind the pass has no method for is a bug, the parser makes no other."""

    def visit(self, e: Expr) -> R:
        if isinstance(e, Literal):
            return self.visit_literal(e)
        if isinstance(e, Ident):
            return self.visit_ident(e)
        if isinstance(e, Select):
            return self.visit_select(e)
        if isinstance(e, Call):
            return self.visit_call(e)
        if isinstance(e, ListExpr):
            return self.visit_list(e)
        if isinstance(e, MapExpr):
            return self.visit_map(e)
        if isinstance(e, StructExpr):
            return self.visit_struct(e)
        if isinstance(e, Comprehension):
            return self.visit_comprehension(e)
        return self._unexpected(e)

    def _unexpected(self, e: Expr) -> R:  # pragma: no cover - see the class docstring
        raise TypeError(f"{type(self).__name__}: unexpected expression {type(e).__name__}")

    def visit_literal(self, e: Literal) -> R:
        return self._unexpected(e)

    def visit_ident(self, e: Ident) -> R:
        return self._unexpected(e)

    def visit_select(self, e: Select) -> R:
        return self._unexpected(e)

    def visit_call(self, e: Call) -> R:
        return self._unexpected(e)

    def visit_list(self, e: ListExpr) -> R:
        return self._unexpected(e)

    def visit_map(self, e: MapExpr) -> R:
        return self._unexpected(e)

    def visit_struct(self, e: StructExpr) -> R:
        return self._unexpected(e)

    def visit_comprehension(self, e: Comprehension) -> R:
        return self._unexpected(e)
