"""Parse CEL text into our expression tree, using cel-python's Lark grammar.

cel-python supplies the grammar and the LALR parser; this module turns its parse tree into
cel-go's AST: literals are decoded with cel-go's rules (parser/unescape.go, VisitInt/Uint/Double),
macros are expanded as cel-go expands them (parser/macro.go, ext/bindings.go,
ext/comprehensions.go), double negations are elided as VisitLogicalNot/VisitNegate do,
reserved identifiers are rejected, and nesting deeper than cel-go's 250 levels is refused.
Text that does not parse gets the errors cel-go's ANTLR parser reports (see antlr.py).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy.celparser
import lark
from lark import Lark, Token, Tree
from lark.exceptions import LarkError

from dradriver.offline.cel import antlr, ast
from dradriver.offline.cel.errors import COMPILATION_FAILED, CELCompileError
from dradriver.offline.cel.values import INT64_MAX, INT64_MIN, UINT64_MAX, UInt

MAX_RECURSION_DEPTH = 250
#: cel-go's common.Errors shows this many issues, then how many more there were.
_MAX_ISSUES_SHOWN = 100

_Tree = Tree[Token]
_Node = Tree[Token] | Token

RESERVED_IDS = frozenset(
    [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "false",
        "for",
        "function",
        "if",
        "import",
        "in",
        "let",
        "loop",
        "package",
        "namespace",
        "null",
        "return",
        "true",
        "var",
        "void",
        "while",
    ]
)

_OPERATORS = {
    "relation_lt": ast.LESS,
    "relation_le": ast.LESS_EQUALS,
    "relation_gt": ast.GREATER,
    "relation_ge": ast.GREATER_EQUALS,
    "relation_eq": ast.EQUALS,
    "relation_ne": ast.NOT_EQUALS,
    "relation_in": ast.IN,
    "addition_add": ast.ADD,
    "addition_sub": ast.SUBTRACT,
    "multiplication_mul": ast.MULTIPLY,
    "multiplication_div": ast.DIVIDE,
    "multiplication_mod": ast.MODULO,
}
_OPERATOR_TEXT = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
}
_PASSTHROUGH = frozenset(
    {
        "expr",
        "conditionalor",
        "conditionaland",
        "relation",
        "addition",
        "multiplication",
        "unary",
        "member",
        "primary",
    }
)

_parser_lock = threading.Lock()
_parser: Any = None


def _lark_parser() -> Any:
    """cel-python's CEL grammar in an LALR parser of our own, built once per process.

    celpy's own CELParser asks Lark to propagate positions into every tree node, which triples
    the parse time; token positions are all we need, so we build the parser without it.
    """
    global _parser  # noqa: PLW0603 - one Lark instance per process, built on first use
    with _parser_lock:
        if _parser is None:
            grammar = (Path(celpy.celparser.__file__).parent / "cel.lark").read_text()
            for rule, patched in _GRAMMAR_PATCHES:
                grammar = grammar.replace(rule, patched)
            _parser = Lark(
                grammar,
                parser="lalr",
                start="expr",
                g_regex_flags=re.M,
                lexer_callbacks={"IDENT": _boolean_literal},
                maybe_placeholders=False,
                priority="invert",
                cache=_cache_file(grammar),
            )
        return _parser


def _boolean_literal(token: Token) -> Token:
    """`true`/`false` lex as identifiers in cel-python's grammar; make them literals, keeping
    their position (celpy's own callback drops it, and errors must point at them)."""
    if token.value in ("true", "false"):
        return Token.new_borrow_pos("BOOL_LIT", token.value, token)
    return token


# The left-hand rules are excerpts of cel-python's celpy/cel.lark (Copyright 2020 Capital One
# Services, LLC; Apache-2.0, see NOTICE), the right-hand ones our modifications of them.
# cel-go's grammar allows a trailing comma in list and map literals (`'[' listInit? ','? ']'`);
# cel-python's does not. The comma must sit inside the element rule to keep the grammar LALR(1);
# Lark drops the anonymous tokens, so the builder sees the elements only.
_GRAMMAR_PATCHES = (
    (
        'list_lit       : "[" [exprlist] "]"',
        'list_lit       : LSQB "]" | LSQB "," "]" | LSQB list_elements "]"\n'
        'LSQB           : "["\n'
        'list_elements  : element ("," element)* [","]\n'
        "?element       : expr | opt_expr\n"
        'opt_expr       : "?" expr',
    ),
    (
        'map_lit        : "{" [mapinits] "}"',
        'map_lit        : LBRACE "}" | LBRACE "," "}" | LBRACE map_entries "}"\n'
        'LBRACE         : "{"\n'
        'map_entries    : element ":" expr ("," element ":" expr)* [","]',
    ),
    # The optional syntax (cel.OptionalTypes enables it in the Kubernetes environment).
    (
        "member         : member_dot | member_dot_arg | member_index | member_object | primary",
        "member         : member_dot | member_opt_dot | member_dot_arg | member_index | member_opt_index\n"
        "               | member_object | primary\n"
        'member_opt_dot : member "." "?" IDENT\n'
        'member_opt_index : member "[" "?" expr "]"',
    ),
    # Message literals as in CEL.g4: `?name:` optional fields, a trailing comma, `T{,}`; the ':' is
    # kept in the tree, where cel-go places a field.
    (
        'member_object  : member "{" [fieldinits] "}"',
        'member_object  : member "{" "}" | member "{" "," "}" | member "{" fieldinits "}"',
    ),
    (
        'fieldinits     : IDENT ":" expr ("," IDENT ":" expr)*',
        'fieldinits     : fieldinit ("," fieldinit)* [","]\n'
        "fieldinit      : (IDENT | opt_field) COLON expr\n"
        'opt_field      : "?" IDENT\n'
        'COLON          : ":"',
    ),
    # CEL.g4's NUM_FLOAT needs digits after the point: `1.e5` is `1` then `.e5` (a selection).
    (
        'FLOAT_LIT      : /-?/ DIGIT+ "." DIGIT* EXPONENT? | /-?/ DIGIT* "." DIGIT+ EXPONENT?',
        'FLOAT_LIT      : /-?/ DIGIT* "." DIGIT+ EXPONENT?',
    ),
)


def _cache_file(grammar: str) -> str | bool:
    """Where Lark keeps its LALR tables between processes (saves ~0.3 s per CLI start).

    A per-user directory, never the shared temp directory: Lark's cache is a pickle. Named by
    the grammar's digest, so that checkouts with different grammars do not rewrite one file.
    """
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    directory = Path(base) / "dradriver"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if directory.stat().st_uid != os.getuid():
            return False
    except OSError:
        return False
    digest = hashlib.sha256(grammar.encode()).hexdigest()[:12]
    return str(directory / f"cel-grammar-lark-{lark.__version__}-{digest}.cache")


class CELSyntaxError(Exception):
    """A syntax error at a position; becomes a CELCompileError with cel-go's layout."""

    def __init__(self, message: str, pos: tuple[int, int]) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


def format_issue(expression: str, message: str, pos: tuple[int, int]) -> str:
    """`ERROR: <input>:1:5: message` plus the source line and a caret, as cel-go prints issues
    (common/error.go: characters wider than one UTF-8 byte become full-width dots and carets)."""
    line, column = pos
    lines = expression.split("\n")
    text = f"ERROR: <input>:{line}:{column}: {message}"
    if not expression or not 0 < line <= len(lines) or len(lines[line - 1].encode()) > 16384:
        return text
    source = lines[line - 1].replace("\t", " ")
    before = source[: max(column - 1, 0)]
    dots = "".join("\uff0e" if len(ch.encode()) > 1 else "." for ch in before)
    at = source[column - 1 : column] if column >= 1 else ""
    caret = "\uff3e" if at and len(at.encode()) > 1 else "^"
    return f"{text}\n | {source}\n | {dots}{caret}"


def parse(expression: str) -> ast.Expr:
    """Parse and expand macros; raises CELCompileError on any syntax problem."""
    parser = _lark_parser()
    try:
        with _parser_lock:
            tree = parser.parse(expression)
    except LarkError:
        raise _syntax_failure(parser, expression) from None
    try:
        builder = _Builder(expression)
        built = builder.build(tree)
        if builder.errors:
            if antlr.parse(expression).errors:
                # Text that cel-python's grammar takes and CEL.g4 does not: ANTLR's own errors.
                raise _syntax_failure(parser, expression)
            issues = sorted(builder.errors, key=lambda issue: issue.pos)
            raise CELCompileError(
                COMPILATION_FAILED + "\n".join(format_issue(expression, i.message, i.pos) for i in issues),
                expression=expression,
            )
        return built
    except CELSyntaxError as issue:
        raise CELCompileError(
            COMPILATION_FAILED + format_issue(expression, issue.message, issue.pos), expression=expression
        ) from None
    except RecursionError:
        raise CELCompileError(
            COMPILATION_FAILED
            + format_issue(expression, f"expression recursion limit exceeded: {MAX_RECURSION_DEPTH}", (1, 1)),
            expression=expression,
        ) from None


def lex(expression: str) -> list[Token]:
    """The expression's tokens (`type`, `start_pos`, `end_pos`), without whitespace and comments,
    for tools that edit an expression in place; raises CELCompileError on an unknown character."""
    parser = _lark_parser()
    try:
        with _parser_lock:
            return list(parser.lex(expression))
    except LarkError:
        raise _syntax_failure(parser, expression) from None


def _syntax_failure(parser: Any, expression: str) -> CELCompileError:
    """The compile error cel-go reports for text that does not parse: ANTLR's syntax errors, then
    what cel-go's visitor reports on the partial tree, shown as cel-go shows at most 100 issues."""
    result = antlr.parse(expression)
    errors = result.errors or ([] if result.visitor_errors else [("Syntax error", (1, 1))])
    if result.finished:
        errors = errors + result.visitor_errors + _visitor_errors(parser, result)
    errors.sort(key=lambda error: error[1])  # stable: at one position, syntax errors come first
    shown = [format_issue(expression, message, pos) for message, pos in errors[:_MAX_ISSUES_SHOWN]]
    if len(errors) > _MAX_ISSUES_SHOWN:
        shown.append(f"{len(errors) - _MAX_ISSUES_SHOWN} more errors were truncated")
    return CELCompileError(COMPILATION_FAILED + "\n".join(shown), expression=expression)


def _visitor_errors(parser: Any, result: antlr.Parse) -> list[tuple[str, tuple[int, int]]]:
    """What building ANTLR's partial tree reports (macro errors), at the expression's positions."""
    text = result.tree_text
    try:
        with _parser_lock:
            tree = parser.parse(text)
    except LarkError:
        return []
    builder = _Builder(text)
    try:
        builder.build(tree)
    except CELSyntaxError as issue:
        builder.errors.append(issue)
    except RecursionError:
        return []
    line_starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]
    shifted = []
    for error in builder.errors:
        line, column = error.pos
        offset = result.original_offset(line_starts[line - 1] + column - 1)
        # An empty expression in cel-go's tree has no location: it shows as 1:0.
        shifted.append((error.message, (1, 0) if offset is None else antlr.position(result.text, offset)))
    return shifted


def literal_value(token: Token) -> Any:
    """The value of a literal token from `lex` (a string literal's text, unescaped)."""
    try:
        return _decode_literal(token)
    except CELSyntaxError as issue:
        raise CELCompileError(issue.message) from None


def _balanced(
    function: str, operands: list[ast.Expr], positions: list[tuple[int, int]], lo: int, hi: int
) -> ast.Expr:
    """cel-go's logicManager.balancedTree over the operators lo..hi: operator i sits between
    operands i and i+1 (three terms nest to the left: `(a && b) && c`)."""
    mid = (lo + hi + 1) // 2
    left = operands[mid] if mid == lo else _balanced(function, operands, positions, lo, mid - 1)
    right = operands[mid + 1] if mid == hi else _balanced(function, operands, positions, mid + 1, hi)
    return ast.Call(function, [left, right], pos=positions[mid])


def _first_token(node: _Node) -> Token | None:
    while isinstance(node, Tree):
        if not node.children:
            return None
        node = node.children[0]
    return node


def _last_token(node: _Node) -> Token | None:
    while isinstance(node, Tree):
        if not node.children:
            return None
        node = node.children[-1]
    return node


def _pos(node: _Node) -> tuple[int, int]:
    token = _first_token(node)
    if token is None:
        return (1, 1)
    return (token.line or 1, token.column or 1)


class _Builder:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self._operators: list[Token] | None = None
        self.errors: list[CELSyntaxError] = []
        self.depth = 0
        self.expr_depth = 0
        self.line_starts = [0]
        for i, ch in enumerate(expression):
            if ch == "\n":
                self.line_starts.append(i + 1)

    def _token_after(self, node: _Node, text: str) -> tuple[int, int]:
        """Where cel-go reports an operator: at the operator token following `node`."""
        token = _last_token(node)
        if token is None or not token.end_line:
            # An operand without tokens of its own (`[]`, `{}`): the first such operator.
            # Approximate when the same operator also appears earlier.
            offset = self.expression.find(text)
            if offset < 0:
                return _pos(node)
            line_index = max(i for i, start in enumerate(self.line_starts) if start <= offset)
            return (line_index + 1, offset - self.line_starts[line_index] + 1)
        line, column = token.end_line, token.end_column or 1
        offset = self.expression.find(text, self.line_starts[line - 1] + column - 1)
        if offset < 0:
            return _pos(node)
        line_index = max(i for i, start in enumerate(self.line_starts) if start <= offset)
        return (line_index + 1, offset - self.line_starts[line_index] + 1)

    def build(self, tree: _Tree) -> ast.Expr:
        return self.visit(tree)

    def visit(self, tree: _Node) -> ast.Expr:
        while isinstance(tree, Tree) and tree.data in _PASSTHROUGH and len(tree.children) == 1:
            tree = tree.children[0]
        if isinstance(tree, Token):
            raise CELSyntaxError(f"unexpected token {tree.value!r}", _pos(tree))
        self.depth += 1
        if self.depth > MAX_RECURSION_DEPTH:
            raise CELSyntaxError("max recursion depth exceeded", _pos(tree))
        try:
            handler: Callable[[_Tree], ast.Expr] = getattr(self, "_" + tree.data)
            try:
                return handler(tree)
            except CELSyntaxError as issue:
                if "recursion" in issue.message or "depth" in issue.message:
                    raise
                # Like cel-go's parser: note the error, go on, report them all.
                self.errors.append(issue)
                return ast.Literal(None, pos=issue.pos)
        finally:
            self.depth -= 1

    # -- operators ----------------------------------------------------------------------

    def _expr(self, tree: _Tree) -> ast.Expr:
        cond, truthy, falsy = (self.visit(c) for c in tree.children)
        return ast.Call(ast.CONDITIONAL, [cond, truthy, falsy], pos=self._token_after(tree.children[0], "?"))

    def _conditionalor(self, tree: _Tree) -> ast.Expr:
        return self._logical(tree, ast.LOGICAL_OR)

    def _conditionaland(self, tree: _Tree) -> ast.Expr:
        return self._logical(tree, ast.LOGICAL_AND)

    def _logical(self, tree: _Tree, function: str) -> ast.Expr:
        """A chain `a || b || c` as cel-go builds it: a flat list of terms, then a balanced tree.

        The grammar here is left-recursive, but cel-go's is a flat repetition, so long chains
        must neither count towards the nesting limit nor nest Python calls per term.
        """
        op = "||" if function == ast.LOGICAL_OR else "&&"
        terms: list[_Node] = []
        node: _Node = tree
        while isinstance(node, Tree) and node.data == tree.data and len(node.children) == 2:
            left, right = node.children
            terms.append(right)
            node = left
        terms.append(node)
        terms.reverse()
        operands = [self.visit(term) for term in terms]
        positions = [self._token_after(term, op) for term in terms[:-1]]
        return _balanced(function, operands, positions, 0, len(operands) - 2)

    def _binary(self, tree: _Tree) -> ast.Expr:
        op_tree, right = tree.children
        assert isinstance(op_tree, Tree)
        function = _OPERATORS[op_tree.data]
        left = self.visit(op_tree.children[0])
        pos = self._token_after(op_tree.children[0], _OPERATOR_TEXT[op_tree.data])
        return ast.Call(function, [left, self.visit(right)], pos=pos)

    _relation = _binary
    _addition = _binary
    _multiplication = _binary

    def _unary(self, tree: _Tree) -> ast.Expr:
        ops: list[str] = []
        node: _Node = tree
        while isinstance(node, Tree) and node.data == "unary" and len(node.children) == 2:
            op = node.children[0]
            assert isinstance(op, Tree)
            ops.append(op.data)
            node = node.children[1]
        if len(set(ops)) > 1:
            # The grammar is `!+ member | -+ member`: mixing the two is a syntax error in cel-go.
            raise CELSyntaxError("Syntax error: mismatched input", _pos(tree))
        literal = _bare_literal(node, signed=True)
        if ops and ops[-1] == "unary_neg" and literal is not None and literal.startswith("-"):
            # cel-python lexes `-1` as one token; in cel-go a run of `-` before a number is the
            # unary rule's (`--1` is `1`), and only a lone `-` is the literal's own sign.
            ops.append("unary_neg")
            literal = Token(
                literal.type,
                literal[1:],
                (literal.start_pos or 0) + 1,
                literal.line,
                (literal.column or 1) + 1,
                literal.end_line,
                literal.end_column,
                literal.end_pos,
            )
        if ops == ["unary_neg"] and literal is not None and literal.type in ("INT_LIT", "FLOAT_LIT"):
            ops.pop()
            # The sign is the literal's own: cel-go places the literal there (`- 3` too).
            sign = self._operator_position(node, 1)
            try:
                operand: ast.Expr = ast.Literal(_decode_literal(literal, sign="-"), pos=sign)
            except CELSyntaxError as issue:
                raise CELSyntaxError(issue.message, sign) from None
        elif literal is not None and literal.type in ("INT_LIT", "FLOAT_LIT"):
            operand = ast.Literal(_decode_literal(literal), pos=_pos(literal))
        else:
            operand = self.visit(node)
        if len(ops) % 2 == 0:
            # VisitLogicalNot / VisitNegate drop an even number of operators entirely.
            return operand
        function = ast.LOGICAL_NOT if ops[0] == "unary_not" else ast.NEGATE
        return ast.Call(function, [operand], pos=self._operator_position(node, len(ops)))

    def _operator_position(self, operand: _Node, count: int) -> tuple[int, int]:
        """cel-go reports `!_` and `-_` at the first of the operators: the `count` operator tokens
        right before the operand (only blanks and opening parentheses between)."""
        first = _first_token(operand)
        if first is None or first.start_pos is None:
            return _pos(operand)
        if self._operators is None:
            # The tree drops the operator tokens; the lexer still knows where they are.
            lexer = _lark_parser()
            with _parser_lock:
                tokens = list(lexer.lex(self.expression))
            self._operators = [t for t in tokens if t.type in ("BANG", "MINUS")]
        start = first.start_pos
        candidates = [t for t in self._operators if t.end_pos is not None and t.end_pos <= start]
        adjacent = [
            i
            for i, t in enumerate(candidates)
            if not self.expression[t.end_pos : start].strip(" \t\r\n([{!-")
        ]
        if not adjacent:
            return _pos(operand)
        token = candidates[max(adjacent[-1] - count + 1, 0)]
        return (token.line or 1, token.column or 1)

    # -- members ------------------------------------------------------------------------

    def _member_dot(self, tree: _Tree) -> ast.Expr:
        operand, name = tree.children
        assert isinstance(name, Token)
        _check_field_name(name)
        return ast.Select(self.visit(operand), str(name), pos=self._token_after(operand, "."))

    def _member_dot_arg(self, tree: _Tree) -> ast.Expr:
        operand, name, *rest = tree.children
        assert isinstance(name, Token)
        _check_field_name(name)
        target = self.visit(operand)
        args = self._exprlist(rest[0]) if rest else []
        return _expand_receiver(str(name), target, args, self._token_after(name, "("))

    def _member_opt_dot(self, tree: _Tree) -> ast.Expr:
        operand, name = tree.children
        assert isinstance(name, Token)
        _check_field_name(name)
        field = ast.Literal(str(name), pos=_pos(name))
        return ast.Call(ast.OPT_SELECT, [self.visit(operand), field], pos=self._token_after(operand, "."))

    def _member_opt_index(self, tree: _Tree) -> ast.Expr:
        operand, index = tree.children
        pos = self._token_after(operand, "[")
        return ast.Call(ast.OPT_INDEX, [self.visit(operand), self.nested(index)], pos=pos)

    def _member_index(self, tree: _Tree) -> ast.Expr:
        operand, index = tree.children
        pos = self._token_after(operand, "[")
        return ast.Call(ast.INDEX, [self.visit(operand), self.nested(index)], pos=pos)

    def _member_object(self, tree: _Tree) -> ast.Expr:
        operand, *rest = tree.children
        type_name = _qualified_name(self.visit(operand))
        if type_name is None or not _is_name(operand):
            raise CELSyntaxError("expected a message type name before '{'", _pos(tree))
        fields: list[ast.StructField] = []
        for init in _children(rest[0]) if rest else []:
            name, colon, value = _children(init)
            optional = isinstance(name, Tree)
            if isinstance(name, Tree):
                name = name.children[0]
            assert isinstance(name, Token)
            _check_field_name(name)
            fields.append(ast.StructField(str(name), self.nested(value), _pos(colon), optional))
        # cel-go places a message literal at its '{'.
        return ast.StructExpr(type_name, fields, pos=self._token_after(operand, "{"))

    # -- primaries ----------------------------------------------------------------------

    def _ident(self, tree: _Tree) -> ast.Expr:
        (name,) = tree.children
        assert isinstance(name, Token)
        return self._checked_ident(str(name), _pos(name))

    def _dot_ident(self, tree: _Tree) -> ast.Expr:
        (name,) = tree.children
        assert isinstance(name, Token)
        return self._checked_ident("." + str(name), _pos(name))

    def _checked_ident(self, name: str, pos: tuple[int, int]) -> ast.Expr:
        if name.lstrip(".") in RESERVED_IDS:
            raise CELSyntaxError(f"reserved identifier: {name.lstrip('.')}", pos)
        return ast.Ident(name, pos=pos)

    def _ident_arg(self, tree: _Tree) -> ast.Expr:
        name, *rest = tree.children
        assert isinstance(name, Token)
        if str(name) in RESERVED_IDS:
            raise CELSyntaxError(f"reserved identifier: {name}", _pos(name))
        args = self._exprlist(rest[0]) if rest else []
        return _expand_global(str(name), args, self._token_after(name, "("))

    def _dot_ident_arg(self, tree: _Tree) -> ast.Expr:
        name, *rest = tree.children
        assert isinstance(name, Token)
        args = self._exprlist(rest[0]) if rest else []
        return ast.Call("." + str(name), args, pos=self._token_after(name, "("))

    def _paren_expr(self, tree: _Tree) -> ast.Expr:
        self.depth -= 1  # parentheses do not count towards cel-go's visitor depth ...
        try:
            return self.nested(tree.children[0])  # ... but towards its parser's rule depth
        finally:
            self.depth += 1

    def nested(self, tree: _Node) -> ast.Expr:
        """Visit a full sub-expression (cel-go's `expr` rule): at most 250 may nest."""
        self.expr_depth += 1
        if self.expr_depth >= MAX_RECURSION_DEPTH:
            raise CELSyntaxError(f"expression recursion limit exceeded: {MAX_RECURSION_DEPTH}", _pos(tree))
        try:
            return self.visit(tree)
        finally:
            self.expr_depth -= 1

    # The opening bracket is kept in the tree: cel-go places a list or map literal there.

    def _list_lit(self, tree: _Tree) -> ast.Expr:
        bracket, *rest = tree.children
        elements, optional = self._elements(_children(rest[0]) if rest else [])
        return ast.ListExpr(elements, optional, pos=_pos(bracket))

    def _map_lit(self, tree: _Tree) -> ast.Expr:
        brace, *rest = tree.children
        if not rest:
            return ast.MapExpr([], pos=_pos(brace))
        children = _children(rest[0])
        keys, optional_keys = self._elements(children[::2])
        values = [self.nested(c) for c in children[1::2]]
        entries = list(zip(keys, values, strict=True))
        return ast.MapExpr(entries, optional_keys, pos=_pos(brace))

    def _elements(self, children: list[_Node]) -> tuple[list[ast.Expr], frozenset[int]]:
        """List elements or map keys, and which of them are marked optional (`?x`)."""
        elements: list[ast.Expr] = []
        optional: set[int] = set()
        for i, child in enumerate(children):
            node = child
            if isinstance(child, Tree) and child.data == "opt_expr":
                optional.add(i)
                node = child.children[0]
            elements.append(self.nested(node))
        return elements, frozenset(optional)

    def _exprlist(self, tree: _Node) -> list[ast.Expr]:
        assert isinstance(tree, Tree)
        return [self.nested(child) for child in tree.children]

    def _literal(self, tree: _Tree) -> ast.Expr:
        (token,) = tree.children
        assert isinstance(token, Token)
        if token.type == "UINT_LIT" and token.startswith("-"):
            # cel-go has no negative uint literal: `-1u` is a negation of `1u` (a type error).
            unsigned = ast.Literal(_decode_literal(Token("UINT_LIT", token[1:])), pos=_pos(token))
            return ast.Call(ast.NEGATE, [unsigned], pos=_pos(token))
        return ast.Literal(_decode_literal(token), pos=_pos(token))


def _children(node: _Node) -> list[_Node]:
    assert isinstance(node, Tree)
    return list(node.children)


def _check_field_name(name: Token) -> None:
    # In cel-go `in` and `null` are tokens of their own, never an IDENTIFIER: `x.in` is a syntax
    # error there (ANTLR's error replaces this one).
    if name in ("in", "null"):
        raise CELSyntaxError(f"Syntax error: mismatched input '{name}' expecting IDENTIFIER", _pos(name))


def _bare_literal(node: _Node, *, signed: bool = False) -> Token | None:
    """The literal token under a chain of single-child rules, if there is no parenthesis between
    (a signed number token too, with `signed`)."""
    while isinstance(node, Tree) and node.data in _PASSTHROUGH and len(node.children) == 1:
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "literal":
        token = node.children[0]
        if isinstance(token, Token) and (signed or not token.startswith("-")):
            return token
    return None


def _is_name(node: _Node) -> bool:
    """Whether a message literal's operand is CEL.g4's `.? IDENTIFIER ('.' IDENTIFIER)*` (cel-python's
    grammar also takes a parenthesized one)."""
    while isinstance(node, Tree) and node.data in _PASSTHROUGH and len(node.children) == 1:
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "member_dot":
        return _is_name(node.children[0])
    return isinstance(node, Tree) and node.data in ("ident", "dot_ident")


def _qualified_name(expr: ast.Expr) -> str | None:
    if isinstance(expr, ast.Ident):
        return expr.name
    if isinstance(expr, ast.Select) and not expr.test_only:
        prefix = _qualified_name(expr.operand)
        return None if prefix is None else f"{prefix}.{expr.field}"
    return None


# -- literals -----------------------------------------------------------------------------------


def _decode_literal(token: Token, sign: str = "") -> Any:
    kind = token.type
    text = sign + str(token)
    pos = _pos(token)
    if kind == "BOOL_LIT":
        return text == "true"
    if kind == "NULL_LIT":
        return None
    if kind == "INT_LIT":
        return _int_literal(text, pos)
    if kind == "UINT_LIT":
        return _uint_literal(text, pos)
    if kind == "FLOAT_LIT":
        return _float_literal(text, pos)
    if kind in ("STRING_LIT", "MLSTRING_LIT"):
        return _unescape(text, is_bytes=False, pos=pos)
    if kind == "BYTES_LIT":
        decoded = _unescape(text[1:], is_bytes=True, pos=pos)
        return decoded.encode("latin-1") if isinstance(decoded, str) else decoded
    raise CELSyntaxError(f"unexpected literal {text!r}", pos)


def _int_literal(text: str, pos: tuple[int, int]) -> int:
    negative = text.startswith("-")
    body = text[1:] if negative else text
    value = int(body[2:], 16) if body.startswith("0x") else int(body, 10)
    value = -value if negative else value
    if value < INT64_MIN or value > INT64_MAX:
        raise CELSyntaxError("invalid int literal", pos)
    return value


def _uint_literal(text: str, pos: tuple[int, int]) -> UInt:
    body = text[:-1]
    value = int(body[2:], 16) if body.startswith("0x") else int(body, 10)
    if value > UINT64_MAX:
        raise CELSyntaxError("invalid uint literal", pos)
    return UInt(value)


def _float_literal(text: str, pos: tuple[int, int]) -> float:
    try:
        return float(text)
    except ValueError:
        raise CELSyntaxError("invalid double literal", pos) from None


_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "`": "`",
    "?": "?",
}


def _unescape(text: str, *, is_bytes: bool, pos: tuple[int, int]) -> str | bytes:
    """cel-go parser/unescape.go. Bytes results are built from UTF-8 text plus raw escapes."""
    raw = text[:1] in ("r", "R")
    if raw:
        text = text[1:]
    triple = len(text) >= 6 and text.startswith(("'''", '"""'))
    body = text[3:-3] if triple else text[1:-1]
    if raw or "\\" not in body:
        return body.encode() if is_bytes else body
    out = bytearray()
    i = 0
    n = len(body)
    while i < n:
        ch = body[i]
        if ch != "\\":
            out += ch.encode()
            i += 1
            continue
        if i + 1 >= n:
            raise CELSyntaxError("unable to unescape string, found '\\' as last character", pos)
        encoded, i = _escape(body, i + 1, is_bytes=is_bytes, pos=pos)
        out += encoded
    if is_bytes:
        return bytes(out)
    return out.decode("utf-8", errors="surrogateescape")


def _escape(body: str, i: int, *, is_bytes: bool, pos: tuple[int, int]) -> tuple[bytes, int]:
    """The escape whose code letter is at `i` (after a backslash): its bytes and where the text
    goes on."""
    code = body[i]
    i += 1
    if code in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[code].encode(), i
    if code in "xXuU":
        width = {"x": 2, "X": 2, "u": 4, "U": 8}[code]
        if is_bytes and code in "uU":
            raise CELSyntaxError("unable to unescape string", pos)
        digits = body[i : i + width]
        if len(digits) < width or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise CELSyntaxError("unable to unescape string", pos)
        value = int(digits, 16)
        if is_bytes and code in "xX":
            return bytes([value]), i + width
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise CELSyntaxError("invalid unicode code point", pos)
        return chr(value).encode(), i + width
    if code in "0123":
        digits = body[i : i + 2]
        if len(digits) < 2 or any(c not in "01234567" for c in digits):
            raise CELSyntaxError("unable to unescape octal sequence in string", pos)
        value = int(code + digits, 8)
        return (bytes([value]) if is_bytes else chr(value).encode()), i + 2
    raise CELSyntaxError("unable to unescape string", pos)


# -- macros -------------------------------------------------------------------------------------


def _ident_name(expr: ast.Expr, message: str) -> str:
    if isinstance(expr, ast.Ident):
        return expr.name
    raise CELSyntaxError(message, expr.pos)


def _check_iter_var(name: str, expr: ast.Expr) -> None:
    if name in (ast.ACCUMULATOR, "__result__"):
        raise CELSyntaxError("iteration variable overwrites accumulator variable", expr.pos)


def _accu(pos: tuple[int, int]) -> ast.Ident:
    return ast.Ident(ast.ACCUMULATOR, pos=pos)


def _expand_global(name: str, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
    if name == "has" and len(args) == 1:
        arg = args[0]
        if isinstance(arg, ast.Select) and not arg.test_only:
            return ast.Select(arg.operand, arg.field, test_only=True, pos=pos)
        raise CELSyntaxError("invalid argument to has() macro", arg.pos)
    return ast.Call(name, args, pos=pos)


def _expand_receiver(name: str, target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
    expander = _RECEIVER_MACROS.get((name, len(args)))
    if expander is not None:
        expanded = expander(target, args, pos)
        if expanded is not None:
            return expanded
    return ast.Call(name, args, target=target, pos=pos)


def _quantifier(kind: str) -> Callable[[ast.Expr, list[ast.Expr], tuple[int, int]], ast.Expr]:
    def expand(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
        var = _ident_name(args[0], "argument must be a simple name")
        _check_iter_var(var, args[0])
        pred = args[1]
        accu = _accu(pos)
        if kind == "all":
            init: ast.Expr = ast.Literal(True, pos=pos)
            cond: ast.Expr = ast.Call(ast.NOT_STRICTLY_FALSE, [accu], pos=pos)
            step: ast.Expr = ast.Call(ast.LOGICAL_AND, [accu, pred], pos=pos)
            result: ast.Expr = accu
        elif kind == "exists":
            init = ast.Literal(False, pos=pos)
            cond = ast.Call(ast.NOT_STRICTLY_FALSE, [ast.Call(ast.LOGICAL_NOT, [accu], pos=pos)], pos=pos)
            step = ast.Call(ast.LOGICAL_OR, [accu, pred], pos=pos)
            result = accu
        else:
            init = ast.Literal(0, pos=pos)
            cond = ast.Literal(True, pos=pos)
            step = ast.Call(
                ast.CONDITIONAL,
                [pred, ast.Call(ast.ADD, [accu, ast.Literal(1, pos=pos)], pos=pos), accu],
                pos=pos,
            )
            result = ast.Call(ast.EQUALS, [accu, ast.Literal(1, pos=pos)], pos=pos)
        return ast.Comprehension(
            target, var, ast.ACCUMULATOR, init, cond, step, result, macro=kind, macro_args=args, pos=pos
        )

    return expand


def _list_fold(
    target: ast.Expr,
    var: str,
    element: ast.Expr,
    keep: ast.Expr | None,
    pos: tuple[int, int],
    *,
    macro: str,
    args: list[ast.Expr],
    var2: str = "",
) -> ast.Expr:
    """The fold of map, filter and transformList: `accu + [element]`, guarded by `keep` if any."""
    accu = _accu(pos)
    step = ast.Call(ast.ADD, [accu, ast.ListExpr([element], pos=pos)], pos=pos)
    init = ast.ListExpr([], pos=pos)
    return _accumulate(
        target, var, var2, init=init, accu=accu, step=step, keep=keep, pos=pos, macro=macro, args=args
    )


def _accumulate(
    target: ast.Expr,
    var: str,
    var2: str,
    *,
    init: ast.Expr,
    accu: ast.Ident,
    step: ast.Expr,
    keep: ast.Expr | None,
    pos: tuple[int, int],
    macro: str,
    args: list[ast.Expr],
) -> ast.Expr:
    """The fold of the macros that build a list or map: from `init`, each iteration's `step` on
    `accu`, skipped where `keep` (if any) is false."""
    if keep is not None:
        step = ast.Call(ast.CONDITIONAL, [keep, step, accu], pos=pos)
    return ast.Comprehension(
        target,
        var,
        ast.ACCUMULATOR,
        init,
        ast.Literal(True, pos=pos),
        step,
        accu,
        iter_var2=var2,
        macro=macro,
        macro_args=args,
        pos=pos,
    )


def _map_macro(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
    var = _ident_name(args[0], "argument is not an identifier")
    _check_iter_var(var, args[0])
    keep = args[1] if len(args) == 3 else None
    return _list_fold(target, var, args[-1], keep, pos, macro="map", args=args)


def _filter_macro(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
    var = _ident_name(args[0], "argument is not an identifier")
    _check_iter_var(var, args[0])
    return _list_fold(target, var, args[0], args[1], pos, macro="filter", args=args)


def _bind_macro(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr | None:
    # ext.Bindings: only `cel.bind(...)` is the macro; other receivers are ordinary calls.
    if not (isinstance(target, ast.Ident) and target.name == "cel"):
        return None
    var = _ident_name(args[0], "cel.bind() variable names must be simple identifiers")
    return _bound(var, args[1], args[2], args, pos)


def _bound(
    var: str, value: ast.Expr, result: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]
) -> ast.Comprehension:
    """The fold cel.bind expands to (and optMap, optFlatMap, sortBy): `result` with `var` bound,
    lazily, to `value`."""
    return ast.Comprehension(
        ast.ListExpr([], pos=pos),
        "#unused",
        var,
        value,
        ast.Literal(False, pos=pos),
        ast.Ident(var, pos=pos),
        result,
        macro="bind",
        macro_args=args,
        pos=pos,
    )


def _opt_map(flat: bool) -> Callable[[ast.Expr, list[ast.Expr], tuple[int, int]], ast.Expr]:
    """optMap / optFlatMap (cel-go cel/library.go): `t.hasValue() ? <bind v = t.value() in f> :
    optional.none()`, the bound result wrapped in optional.of for optMap."""
    name = "optFlatMap" if flat else "optMap"

    def expand(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
        if not isinstance(args[0], ast.Ident):
            raise CELSyntaxError(f"{name}() variable name must be a simple identifier", args[0].pos)
        var = args[0].name
        value = ast.Call("value", [], target=copy.deepcopy(target), pos=pos)
        bound: ast.Expr = _bound(var, value, args[1], args, pos)
        if not flat:
            bound = ast.Call("of", [bound], target=ast.Ident("optional", pos=pos), pos=pos)
        none = ast.Call("none", [], target=ast.Ident("optional", pos=pos), pos=pos)
        has_value = ast.Call("hasValue", [], target=target, pos=pos)
        return ast.Call(ast.CONDITIONAL, [has_value, bound, none], pos=pos)

    return expand


def _two_var_vars(args: list[ast.Expr]) -> tuple[str, str]:
    first = _ident_name(args[0], "argument must be a simple name")
    second = _ident_name(args[1], "argument must be a simple name")
    if first == second:
        raise CELSyntaxError(f"duplicate variable name: {first}", args[1].pos)
    _check_iter_var(first, args[0])
    _check_iter_var(second, args[1])
    return first, second


def _two_var_quantifier(kind: str) -> Callable[[ast.Expr, list[ast.Expr], tuple[int, int]], ast.Expr]:
    def expand(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
        first, second = _two_var_vars(args)
        inner = _quantifier(kind)(target, [ast.Ident(first, pos=pos), args[2]], pos)
        assert isinstance(inner, ast.Comprehension)
        inner.iter_var2 = second
        inner.macro = kind + "2"
        inner.macro_args = args
        return inner

    return expand


def _transform_list(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
    first, second = _two_var_vars(args)
    keep = args[2] if len(args) == 4 else None
    return _list_fold(target, first, args[-1], keep, pos, macro="transformList", args=args, var2=second)


def _transform_map(entries: bool) -> Callable[[ast.Expr, list[ast.Expr], tuple[int, int]], ast.Expr]:
    """transformMap (insert key -> value) or transformMapEntry (merge the produced one-entry map)."""

    def expand(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
        first, second = _two_var_vars(args)
        fn = args[-1]
        accu = _accu(pos)
        inserted = [accu, fn] if entries else [accu, ast.Ident(first, pos=pos), fn]
        step = ast.Call("cel.@mapInsert", inserted, pos=pos)
        keep = args[2] if len(args) == 4 else None
        macro = "transformMapEntry" if entries else "transformMap"
        init = ast.MapExpr([], pos=pos)
        return _accumulate(
            target, first, second, init=init, accu=accu, step=step, keep=keep, pos=pos, macro=macro, args=args
        )

    return expand


def _sort_by(target: ast.Expr, args: list[ast.Expr], pos: tuple[int, int]) -> ast.Expr:
    # ext/lists.go sortByMacro: bind the input, map it to keys, sort by the associated keys.
    if not isinstance(target, ast.ListExpr | ast.Select | ast.Ident | ast.Comprehension | ast.Call):
        raise CELSyntaxError(
            "sortBy can only be applied to a list, identifier, comprehension, call or select expression",
            target.pos,
        )
    var = _ident_name(args[0], "argument is not an identifier")
    input_var = "@__sortBy_input__"
    keys = _map_macro(ast.Ident(input_var, pos=pos), [ast.Ident(var, pos=pos), args[1]], pos)
    call = ast.Call("@sortByAssociatedKeys", [keys], target=ast.Ident(input_var, pos=pos), pos=pos)
    return _bound(input_var, target, call, args, pos)


_RECEIVER_MACROS: dict[
    tuple[str, int], Callable[[ast.Expr, list[ast.Expr], tuple[int, int]], ast.Expr | None]
] = {
    ("all", 2): _quantifier("all"),
    ("exists", 2): _quantifier("exists"),
    ("exists_one", 2): _quantifier("exists_one"),
    ("map", 2): _map_macro,
    ("map", 3): _map_macro,
    ("filter", 2): _filter_macro,
    ("bind", 3): _bind_macro,
    ("all", 3): _two_var_quantifier("all"),
    ("exists", 3): _two_var_quantifier("exists"),
    ("existsOne", 3): _two_var_quantifier("exists_one"),
    ("exists_one", 3): _two_var_quantifier("exists_one"),
    ("transformList", 3): _transform_list,
    ("transformList", 4): _transform_list,
    ("transformMap", 3): _transform_map(entries=False),
    ("transformMap", 4): _transform_map(entries=False),
    ("transformMapEntry", 3): _transform_map(entries=True),
    ("transformMapEntry", 4): _transform_map(entries=True),
    ("sortBy", 2): _sort_by,
    ("optMap", 2): _opt_map(flat=False),
    ("optFlatMap", 2): _opt_map(flat=True),
}
