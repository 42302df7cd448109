"""The syntax errors cel-go reports for text that does not parse: CEL.g4's generated ANTLR parser
with its DefaultErrorStrategy (and cel-go's recoveryLimitErrorStrategy), emulated.

The rules below follow cel-go's generated parser/gen/cel_parser.go decision by decision: Sync()
at block starts (single-token deletion, else "mismatched input") and at loop backs ("extraneous
input", then resynchronisation), Match() with single-token deletion and insertion, adaptive
predictions that fall back to the alternative leaving the rule ("no viable alternative" where
none does), and recover(): an aborted rule consumes tokens up to one that may follow one of the
rules in progress, and the rules around it go on. Errors are not reported again until a token
is matched. The ATN state numbers are the generated parser's: recover() keys on them.

Besides the errors, the parse yields the text of ANTLR's partial tree (matched and conjured
tokens, unfinished constructs closed with placeholders): cel-go's visitor still builds that
tree and reports what it finds wrong in it (macro errors), which the caller gets from it.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

EOF = -1
(EQ, NE, IN, LESS, LE, GE, GREATER, AND, OR) = range(1, 10)
(LBRACKET, RBRACKET, LBRACE, RBRACE, LPAREN, RPAREN, DOT, COMMA, MINUS, EXCLAM, QMARK, COLON) = range(10, 22)
(PLUS, STAR, SLASH, PERCENT, TRUE, FALSE, NULL) = range(22, 29)
(WS, COMMENT, NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENT, ESC_IDENT) = range(29, 38)

_LITERALS = "== != in < <= >= > && || [ ] { } ( ) . , - ! ? : + * / % true false null".split()  # noqa: SIM905
_NAMES = {
    EOF: "<EOF>",
    **{number: f"'{text}'" for number, text in enumerate(_LITERALS, start=1)},
    **dict(
        zip(
            range(31, 38),
            ("NUM_FLOAT", "NUM_INT", "NUM_UINT", "STRING", "BYTES", "IDENTIFIER", "ESC_IDENTIFIER"),
            strict=True,
        )
    ),
}
_KEYWORDS = {"in": IN, "true": TRUE, "false": FALSE, "null": NULL}
_OPERATORS = {text: number for number, text in enumerate(_LITERALS[:25], start=1)}

_ESC = r"""\\(?:[abfnrtv"'\\?`]|[0-3][0-7][0-7]|[xX][0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})"""
_STRINGS = [
    rf'"(?:{_ESC}|[^\\"\n\r])*"',
    rf"'(?:{_ESC}|[^\\'\n\r])*'",
    rf'"""(?:{_ESC}|[^\\])*?"""',
    rf"'''(?:{_ESC}|[^\\])*?'''",
    r'[rR]"[^"\n\r]*"',
    r"[rR]'[^'\n\r]*'",
    r'[rR]"""[\s\S]*?"""',
    r"[rR]'''[\s\S]*?'''",
]
_EXP = r"[eE][+-]?[0-9]+"
_TOKEN_PATTERNS = [
    (WS, re.compile(r"[\t \r\n\f]+")),
    (COMMENT, re.compile(r"//[^\n]*")),
    (NUM_FLOAT, re.compile(rf"[0-9]+\.[0-9]+(?:{_EXP})?|[0-9]+{_EXP}|\.[0-9]+(?:{_EXP})?")),
    (NUM_INT, re.compile(r"0x[0-9a-fA-F]+|[0-9]+")),
    (NUM_UINT, re.compile(r"(?:0x[0-9a-fA-F]+|[0-9]+)[uU]")),
    *((STRING, re.compile(pattern)) for pattern in _STRINGS),
    *((BYTES, re.compile("[bB]" + pattern)) for pattern in _STRINGS),
    (IDENT, re.compile(r"[A-Za-z_][A-Za-z0-9_]*")),
    (ESC_IDENT, re.compile(r"`[A-Za-z0-9_.\-/ ]+`")),
    (0, re.compile(r"==|!=|<=|>=|&&|\|\||[<>\[\]{}().,\-!?:+*/%]")),
]
_HEX = "0123456789abcdefABCDEF"
_RESERVED = re.compile(r"no viable alternative at input '.(true|false|null)'")

FIRST_EXPR = frozenset(
    {LBRACKET, LBRACE, LPAREN, DOT, MINUS, EXCLAM, TRUE, FALSE, NULL, NUM_FLOAT, NUM_INT, NUM_UINT}
    | {STRING, BYTES, IDENT}
)
FIRST_PRIMARY = FIRST_EXPR - {EXCLAM}
FIRST_OPT_EXPR = FIRST_EXPR | {QMARK}
FIRST_OPT_FIELD = frozenset({QMARK, IDENT, ESC_IDENT})
FIRST_LITERAL = frozenset({MINUS, NUM_INT, NUM_UINT, NUM_FLOAT, STRING, BYTES, TRUE, FALSE, NULL})
RELATIONS = frozenset({EQ, NE, IN, LESS, LE, GE, GREATER})
PRODUCTS = frozenset({STAR, SLASH, PERCENT})
SUMS = frozenset({PLUS, MINUS})
SELECTORS = frozenset({DOT, LBRACKET})
NOTHING: frozenset[int] = frozenset()

#: cel-go's defaults: errorReportingLimit, errorRecoveryLimit.
REPORTING_LIMIT = 100
RECOVERY_LIMIT = 30
#: What stands for an identifier missing from ANTLR's partial tree, and for a missing operand: the
#: visitor builds an empty expression without a location there (not an identifier either).
PLACEHOLDER = "_"
OPERAND = "0"

Position = tuple[int, int]
Error = tuple[str, Position]


@dataclass(frozen=True)
class Token:
    type: int
    text: str
    start: int
    index: int  # in the token list with the hidden tokens (whitespace, comments)


@dataclass
class Parse:
    """ANTLR's syntax errors, the text of its partial tree and where that text's characters were."""

    text: str
    errors: list[Error]
    tree_text: str
    #: (start in tree_text, offset in the expression or None for what closes an aborted rule,
    #: whether the piece was there) per piece.
    pieces: list[tuple[int, int | None, bool]]
    #: Whether the parse ran to its end (cel-go's limits stop it, and its visitor with it).
    finished: bool
    #: What cel-go's visitor reports for pieces missing from the tree (an identifier after '.?').
    visitor_errors: list[Error] = field(default_factory=list)

    def original_offset(self, offset: int) -> int | None:
        """Where a character of tree_text came from in the expression (None: nowhere)."""
        starts = [start for start, _, _ in self.pieces]
        i = max(bisect.bisect_right(starts, offset) - 1, 0)
        start, original, real = self.pieces[i]
        return None if original is None else original + (offset - start if real else 0)


def position(text: str, offset: int) -> Position:
    """cel-go's line and 1-based column of an offset (ANTLR's EOF of an empty input sits before
    the first column)."""
    if not text:
        return 1, 0
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _dead_end(text: str, start: int) -> int:
    """Where ANTLR's lexer DFA fails on text that begins no token: the character it dies on (or the
    end of the input): a '&', '|' or '=' lives one character, a quote up to a bad escape, the end of
    its line or of the input."""
    end = len(text)
    first = text[start]
    if first in "&|=`":
        if first == "`":
            i = start + 1
            while i < end and (text[i].isascii() and (text[i].isalnum() or text[i] in "_.-/ ")):
                i += 1
            return i
        return min(start + 1, end)
    if first not in "'\"":
        return start
    triple = text.startswith(first * 3, start)
    i = start + (3 if triple else 1)
    while i < end:
        char = text[i]
        if char == "\\":
            i = _escape_end(text, i)
            if i < 0:
                return -i
            continue
        if not triple and char in "\n\r":
            return i
        i += 1
    return end


def _escape_end(text: str, start: int) -> int:
    """The end of a valid escape sequence at start, or minus where it stops being one."""
    i = start + 1
    if i >= len(text):
        return -i
    kind = text[i]
    if kind in "abfnrtv\"'\\?`":
        return i + 1
    if kind in "0123":
        needed, digits = 2, "01234567"
    elif kind in "xX":
        needed, digits = 2, _HEX
    elif kind == "u":
        needed, digits = 4, _HEX
    elif kind == "U":
        needed, digits = 8, _HEX
    else:
        return -i
    for j in range(i + 1, i + 1 + needed):
        if j >= len(text) or text[j] not in digits:
            return -j
    return i + 1 + needed


def tokenize(text: str) -> tuple[list[Token], list[Error]]:
    """CEL.g4's lexer: the longest match, keywords before identifiers; on a character that begins
    no token, "token recognition error" naming what the DFA consumed, and on after it."""
    tokens: list[Token] = []
    errors: list[Error] = []
    pos = 0
    while pos < len(text):
        best_type, best_end = -2, pos
        for token_type, pattern in _TOKEN_PATTERNS:
            match = pattern.match(text, pos)
            if match and match.end() > best_end:
                best_type, best_end = token_type, match.end()
        if best_end == pos:
            dead = _dead_end(text, pos)
            shown = text[pos : dead + 1]
            errors.append((f"Syntax error: token recognition error at: '{shown}'", position(text, pos)))
            pos = dead + 1 if dead < len(text) else len(text)
            continue
        value = text[pos:best_end]
        if best_type == 0:
            best_type = _OPERATORS[value]
        elif best_type == IDENT:
            best_type = _KEYWORDS.get(value, IDENT)
        tokens.append(Token(best_type, value, pos, len(tokens)))
        pos = best_end
    tokens.append(Token(EOF, "<EOF>", len(text), len(tokens)))
    return tokens, errors


class _Recognition(Exception):  # noqa: N818 - ANTLR's RecognitionException
    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


class _Stop(Exception):  # noqa: N818 - cel-go's panics on its limits
    pass


@dataclass
class _Frame:
    """A rule in progress: what may follow it where it was invoked (`eps`: its caller may end
    there too), and what closes what it has opened, should it be aborted."""

    follow: frozenset[int]
    eps: bool
    pending: list[str] = field(default_factory=list)


class _Parser:
    def __init__(self, text: str, tokens: list[Token], reported: int) -> None:
        self.text = text
        self.reported = reported
        self.all = tokens
        self.tokens = [t for t in tokens if t.type not in (WS, COMMENT)]
        self.p = 0
        self.state = -1
        self.frames: list[_Frame] = []
        self.errors: list[Error] = []
        self.visitor_errors: list[Error] = []
        self.recovering = False
        self.last_index = -1
        self.last_states: set[int] = set()
        self.attempts = 0
        self.out: list[tuple[str, int | None, bool]] = []

    # Token stream.
    def lt(self, k: int = 1) -> Token:
        return self.tokens[min(self.p + k - 1, len(self.tokens) - 1)]

    def la(self, k: int = 1) -> int:
        return self.lt(k).type

    def consume(self) -> None:
        if self.la() != EOF:
            self.p += 1

    def emit(self, text: str, *, real: bool = False) -> None:
        self.out.append((text, self.lt().start, real))

    # Sets.
    def expected(self, tokens: frozenset[int], eps: bool) -> frozenset[int]:
        """ATN.getExpectedTokens: the tokens after a state, through the rules in progress."""
        result = set(tokens)
        if eps:
            for frame in reversed(self.frames):
                result |= frame.follow
                if not frame.eps:
                    break
            else:
                result.add(EOF)
        return frozenset(result)

    def recovery_set(self) -> frozenset[int]:
        return frozenset().union(*(frame.follow for frame in self.frames))

    # Reports.
    def report(self, message: str, token: Token) -> None:
        if self.reported + len(self.errors) >= REPORTING_LIMIT:
            self.errors.append(
                (f"Syntax error: More than {REPORTING_LIMIT} syntax errors", self.where(token))
            )
            raise _Stop
        self.errors.append(("Syntax error: " + message, self.where(token)))

    def where(self, token: Token) -> Position:
        if token.type == EOF:
            return _end_position(self.text)
        return position(self.text, token.start)

    def begin(self) -> bool:
        """beginErrorCondition, unless already recovering (then nothing is reported)."""
        if self.recovering:
            return False
        self.recovering = True
        return True

    def matched(self) -> None:
        self.recovering = False
        self.last_index = -1
        self.last_states = set()

    def unwanted(self, expecting: frozenset[int]) -> None:
        if self.begin():
            token = self.lt()
            self.report(f"extraneous input {_display(token)} expecting {_set(expecting)}", token)

    def check_attempts(self) -> None:
        if self.attempts == RECOVERY_LIMIT:
            self.report(f"error recovery attempt limit exceeded: {RECOVERY_LIMIT}", self.lt())
            raise _Stop
        self.attempts += 1

    def recover(self) -> None:
        self.check_attempts()
        if self.last_index == self.p and self.state in self.last_states:
            self.consume()
        self.last_index = self.p
        self.last_states.add(self.state)
        self.consume_until(self.recovery_set())

    def consume_until(self, tokens: frozenset[int]) -> None:
        while self.la() != EOF and self.la() not in tokens:
            self.consume()

    # Matching.
    def match(self, token_type: int, state: int, after: frozenset[int], after_eps: bool = False) -> None:
        self.state = state
        if self.la() == token_type:
            self.matched()
            self.emit(self.lt().text, real=True)
            self.consume()
            return
        self.check_attempts()
        if self.la(2) == token_type:  # single-token deletion
            self.unwanted(frozenset({token_type}))
            self.consume()
            self.matched()
            self.emit(self.lt().text, real=True)
            self.consume()
            return
        if self.la() in self.expected(after, after_eps):  # single-token insertion
            if self.begin():
                token = self.lt()
                self.report(f"missing {_NAMES[token_type]} at {_display(token)}", token)
            self.emit(PLACEHOLDER if token_type == IDENT else _LITERALS[token_type - 1])
            return
        self.mismatch(frozenset({token_type}))

    def mismatch(self, expecting: frozenset[int]) -> None:
        token = self.lt()
        raise _Recognition(f"mismatched input {_display(token)} expecting {_set(expecting)}", token)

    def no_viable(self, start: Token, offending: Token) -> None:
        if start.type == EOF:
            shown = "<EOF>"
        else:
            stop = offending.index if offending.type != EOF else offending.index - 1
            shown = "".join(t.text for t in self.all[start.index : stop + 1])
        message = f"no viable alternative at input {_quote(shown)}"
        # cel-go's hack for reserved words after a dot (parser.go reservedIdentifier).
        message = _RESERVED.sub(r"mismatched input '\1' expecting IDENTIFIER", message)
        raise _Recognition(message, offending)

    def sync(self, state: int, tokens: frozenset[int], eps: bool = False, *, loop_back: bool = False) -> None:
        self.state = state
        if self.recovering or eps or self.la() in tokens:
            return
        if loop_back:
            self.unwanted(self.expected(tokens, eps))
            self.consume_until(self.expected(tokens, eps) | self.recovery_set())
            return
        if self.la(2) in tokens:  # single-token deletion
            self.unwanted(tokens)
            self.consume()
            self.matched()
            return
        self.mismatch(tokens)

    def call(self, rule: str, follow: frozenset[int], eps: bool, *args: object) -> None:
        """Invoke a rule; if it fails, report and recover as its generated errorExit does."""
        frame = _Frame(follow, eps)
        self.frames.append(frame)
        entry = self.lt()
        try:
            getattr(self, rule)(*args)
        except _Recognition as error:
            if self.begin():
                self.report(error.message, error.token)
            self.recover()
            if rule == "escape_ident":
                # The visitor finds an escapeIdent context without its identifier.
                self.visitor_errors.append(("unsupported ident kind", self.where(entry)))
            for text in reversed(frame.pending):
                self.out.append((text, None, False))
        finally:
            self.frames.pop()

    # CEL.g4's rules.
    def start(self) -> None:
        self.call("expr", frozenset({EOF}), False)
        self.state = 35
        if self.la() == EOF:
            return
        self.check_attempts()
        if self.la(2) == EOF:
            self.unwanted(frozenset({EOF}))
            return
        if self.begin():
            self.report(f"mismatched input {_display(self.lt())} expecting <EOF>", self.lt())
        self.recover()

    def expr(self) -> None:
        self.call("conditional_or", frozenset({QMARK}), True)
        if self.la() == QMARK:
            frame = self.frames[-1]
            self.match(QMARK, 38, FIRST_EXPR)
            frame.pending.append(f": {OPERAND}")
            self.call("conditional_or", frozenset({COLON}), False)
            self.match(COLON, 40, FIRST_EXPR)
            frame.pending.pop()
            self.call("expr", NOTHING, True)

    def separated(self, rule: str, separator: int, state: int, *args: object) -> None:
        """`rule (separator rule)*`, the separator matched at ATN state `state`."""
        follow = frozenset({separator})
        self.call(rule, follow, True, *args)
        while self.la() == separator:
            self.match(separator, state, FIRST_EXPR)
            self.call(rule, follow, True, *args)

    def conditional_or(self) -> None:
        self.separated("conditional_and", OR, 46)

    def conditional_and(self) -> None:
        self.separated("relation", AND, 54, 0)

    def relation(self, precedence: int) -> None:
        self.call("calc", RELATIONS, True, 0)
        while self.la() in RELATIONS and precedence <= 1:
            self.emit(self.lt().text, real=True)
            self.matched()
            self.consume()
            self.call("relation", RELATIONS, True, 2)

    def calc(self, precedence: int) -> None:
        self.call("unary", PRODUCTS | SUMS, True)
        while (self.la() in PRODUCTS and precedence <= 2) or (self.la() in SUMS and precedence <= 1):
            operand = 3 if self.la() in PRODUCTS else 2
            self.emit(self.lt().text, real=True)
            self.matched()
            self.consume()
            self.call("calc", PRODUCTS | SUMS, True, operand)

    def unary(self) -> None:
        frame = self.frames[-1]
        frame.pending.append(OPERAND)
        self.sync(99, FIRST_EXPR)
        start = self.lt()
        if self.la() == EXCLAM:
            operands = FIRST_PRIMARY | {EXCLAM}
            while True:
                self.match(EXCLAM, 87, operands)
                self.sync(90, operands, loop_back=True)
                if self.la() != EXCLAM:
                    break
        elif self.la() == MINUS and self.la(2) not in (NUM_INT, NUM_FLOAT):
            operands = FIRST_PRIMARY | {MINUS}
            if self.la(2) not in operands:
                self.state = 99
                self.no_viable(start, self.lt(2))
            while True:
                self.match(MINUS, 93, operands)
                self.sync(96, operands, loop_back=True)
                if self.la() != MINUS:
                    break
                if self.la(2) not in operands:
                    self.no_viable(self.lt(), self.lt(2))
        elif self.la() not in FIRST_PRIMARY:
            self.no_viable(start, start)
        frame.pending.pop()
        self.call("member", NOTHING, True)

    def member(self) -> None:
        frame = self.frames[-1]
        self.call("primary", SELECTORS, True)
        while self.la() in SELECTORS:
            self.state = 126
            if self.la() == LBRACKET:
                self.match(LBRACKET, 119, FIRST_OPT_EXPR)
                frame.pending.append(f"{OPERAND}]")
                self.sync(121, FIRST_OPT_EXPR)
                if self.la() == QMARK:
                    self.match(QMARK, 120, FIRST_EXPR)
                self.call("expr", frozenset({RBRACKET}), False)
                frame.pending[-1] = "]"
                self.match(RBRACKET, 124, SELECTORS, True)
                frame.pending.pop()
            elif self.la(2) == IDENT and self.la(3) == LPAREN:
                self.match(DOT, 111, frozenset({IDENT}))
                self.match(IDENT, 112, frozenset({LPAREN}))
                self.match(LPAREN, 113, FIRST_EXPR | {RPAREN})
                frame.pending.append(")")
                self.sync(115, FIRST_EXPR | {RPAREN})
                if self.la() in FIRST_EXPR:
                    self.call("expr_list", frozenset({RPAREN}), False)
                self.match(RPAREN, 117, SELECTORS, True)
                frame.pending.pop()
            elif self.la(2) in (IDENT, ESC_IDENT, QMARK):
                self.match(DOT, 105, FIRST_OPT_FIELD)
                if self.la() == QMARK:
                    self.match(QMARK, 106, frozenset({IDENT, ESC_IDENT}))
                self.call("escape_ident", SELECTORS, True)
            else:
                self.no_viable(self.lt(), self.lt(2))

    def primary(self) -> None:
        frame = self.frames[-1]
        frame.pending.append(OPERAND)
        self.sync(184, FIRST_PRIMARY)
        start, kind = self.lt(), self.la()
        if kind == LPAREN:
            self.match(LPAREN, 144, FIRST_EXPR)
            frame.pending[-1] = ")"
            self.call("expr", frozenset({RPAREN}), False)
            self.match(RPAREN, 146, NOTHING, True)
        elif kind in (LBRACKET, LBRACE):
            self.collection(frame, kind)
        elif kind in (DOT, IDENT):
            self.ident_primary(frame, start, kind)
        elif kind in FIRST_LITERAL:
            frame.pending.pop()
            self.call("literal", NOTHING, True)
            return
        else:
            self.no_viable(start, start)
        frame.pending.pop()

    def collection(self, frame: _Frame, kind: int) -> None:
        """A list (`[`) or map (`{`) literal."""
        if kind == LBRACKET:
            close, elements, base = RBRACKET, "list_init", 148
        else:
            close, elements, base = RBRACE, "map_initializer_list", 156
        self.match(kind, base, FIRST_OPT_EXPR | {COMMA, close})
        frame.pending[-1] = _LITERALS[close - 1]
        self.sync(base + 2, FIRST_OPT_EXPR | {COMMA, close})
        if self.la() in FIRST_OPT_EXPR:
            self.call(elements, frozenset({COMMA, close}), False)
        self.sync(base + 5, frozenset({COMMA, close}))
        if self.la() == COMMA:
            self.match(COMMA, base + 4, frozenset({close}))
        self.match(close, base + 7, NOTHING, True)

    def ident_primary(self, frame: _Frame, start: Token, kind: int) -> None:
        """An identifier (`.` first for the root scope): a global call, a message or a name."""
        name = 2 if kind == DOT else 1
        if self.la(name) != IDENT:
            self.no_viable(start, self.lt(name))
        after = name + 1
        while self.la(after) == DOT and self.la(after + 1) == IDENT:
            after += 2
        if self.la(name + 1) == LPAREN:
            if kind == DOT:
                self.match(DOT, 135, frozenset({IDENT}))
            self.match(IDENT, 138, frozenset({LPAREN}))
            self.match(LPAREN, 139, FIRST_EXPR | {RPAREN})
            frame.pending[-1] = ")"
            self.sync(141, FIRST_EXPR | {RPAREN})
            if self.la() in FIRST_EXPR:
                self.call("expr_list", frozenset({RPAREN}), False)
            self.match(RPAREN, 143, NOTHING, True)
        elif self.la(after) == LBRACE:
            self.create_message(frame, kind)
        else:
            if kind == DOT:
                self.match(DOT, 131, frozenset({IDENT}))
            self.match(IDENT, 134, NOTHING, True)

    def create_message(self, frame: _Frame, kind: int) -> None:
        if kind == DOT:
            self.match(DOT, 164, frozenset({IDENT}))
        self.match(IDENT, 167, frozenset({DOT, LBRACE}))
        self.sync(172, frozenset({DOT, LBRACE}))
        while self.la() == DOT:
            self.match(DOT, 168, frozenset({IDENT}))
            self.match(IDENT, 169, frozenset({DOT, LBRACE}))
            self.sync(174, frozenset({DOT, LBRACE}), loop_back=True)
        self.match(LBRACE, 175, FIRST_OPT_FIELD | {COMMA, RBRACE})
        frame.pending[-1] = "}"
        self.sync(177, FIRST_OPT_FIELD | {COMMA, RBRACE})
        if self.la() in FIRST_OPT_FIELD:
            self.call("field_initializer_list", frozenset({COMMA, RBRACE}), False)
        self.sync(180, frozenset({COMMA, RBRACE}))
        if self.la() == COMMA:
            self.match(COMMA, 179, frozenset({RBRACE}))
        self.match(RBRACE, 182, NOTHING, True)

    def expr_list(self) -> None:
        self.separated("expr", COMMA, 187)

    def list_init(self) -> None:
        self.call("opt_expr", frozenset({COMMA}), True)
        while self.la() == COMMA and self.la(2) in FIRST_OPT_EXPR:
            self.match(COMMA, 195, FIRST_OPT_EXPR)
            self.call("opt_expr", frozenset({COMMA}), True)

    def map_initializer_list(self) -> None:
        self.entries("opt_expr", 220, FIRST_OPT_EXPR)

    def field_initializer_list(self) -> None:
        self.entries("opt_field", 202, FIRST_OPT_FIELD, self.lt())

    def entries(self, key: str, state: int, first: frozenset[int], *args: object) -> None:
        """`key ':' expr (',' key ':' expr)*` (the two rules differ in their keys only)."""
        self.entry(key, state + 1, *args)
        while self.la() == COMMA and self.la(2) in first:
            self.match(COMMA, state + 3, first)
            self.entry(key, state + 5, *args)

    def entry(self, key: str, colon_state: int, *args: object) -> None:
        frame = self.frames[-1]
        reported = len(self.visitor_errors)
        self.call(key, frozenset({COLON}), False, *args)
        # cel-go's visitor skips the value of a field it reported (an escaped name).
        skipped = key == "opt_field" and len(self.visitor_errors) > reported
        frame.pending.append(f": {OPERAND}")
        self.match(COLON, colon_state, FIRST_EXPR)
        frame.pending.pop()
        reported, emitted = len(self.visitor_errors), len(self.out)
        self.call("expr", frozenset({COMMA}), True)
        if skipped:
            del self.visitor_errors[reported:]
            self.out[emitted:] = [(OPERAND, None, False)]

    def opt_field(self, fields: Token) -> None:
        self.sync(216, FIRST_OPT_FIELD)
        if self.la() == QMARK:
            self.match(QMARK, 215, frozenset({IDENT, ESC_IDENT}))
        self.call("escape_ident", NOTHING, True, fields)

    def escape_ident(self, fields: Token | None = None) -> None:
        """A field name; `fields` is where the field list of a message literal starts."""
        self.frames[-1].pending.append(PLACEHOLDER)
        self.sync(235, frozenset({IDENT, ESC_IDENT}))
        if self.la() not in (IDENT, ESC_IDENT):
            self.no_viable(self.lt(), self.lt())
        self.frames[-1].pending.pop()
        token = self.lt()
        self.match(self.la(), 233, NOTHING, True)
        if token.type == ESC_IDENT:
            # Kubernetes leaves cel-go's escaped identifiers off: its visitor reports each one, at
            # the backquote or, in a message literal, where the field list starts.
            self.visitor_errors.append(("unsupported syntax: '`'", self.where(fields or token)))
            self.out[-1] = (PLACEHOLDER, token.start, False)

    def opt_expr(self) -> None:
        self.sync(238, FIRST_OPT_EXPR)
        if self.la() == QMARK:
            self.match(QMARK, 237, FIRST_EXPR)
        self.call("expr", NOTHING, True)

    def literal(self) -> None:
        frame = self.frames[-1]
        frame.pending.append(OPERAND)
        self.sync(256, FIRST_LITERAL)
        if self.la() == MINUS:
            if self.la(2) not in (NUM_INT, NUM_FLOAT):
                self.no_viable(self.lt(), self.lt(2))
            self.match(MINUS, 242, frozenset({self.la(2)}))
        elif self.la() not in FIRST_LITERAL:
            self.no_viable(self.lt(), self.lt())
        frame.pending.pop()
        self.match(self.la(), 245, NOTHING, True)


def _display(token: Token) -> str:
    return _quote(token.text)


def _quote(text: str) -> str:
    return "'" + text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + "'"


def _set(tokens: frozenset[int]) -> str:
    names = [_NAMES[t] for t in sorted(tokens)]
    return names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"


def _end_position(text: str) -> Position:
    if not text:
        return 1, 0
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def parse(text: str) -> Parse:
    """Run the emulated parser over text; its errors include the lexer's (which count towards
    cel-go's reporting limit alike; ours are all counted first)."""
    tokens, errors = tokenize(text)
    finished = len(errors) <= REPORTING_LIMIT
    if not finished:
        too_many = (f"Syntax error: More than {REPORTING_LIMIT} syntax errors", errors[REPORTING_LIMIT][1])
        errors = [*errors[:REPORTING_LIMIT], too_many]
        return Parse(text, errors, "", [(0, 0, False)], finished)
    parser = _Parser(text, tokens, len(errors))
    try:
        parser.start()
    except (_Stop, RecursionError):
        finished = False
    pieces: list[tuple[int, int | None, bool]] = []
    chunks: list[str] = []
    at = 0
    for piece, original, real in parser.out:
        pieces.append((at, original, real))
        chunks.append(piece)
        at += len(piece) + 1
    errors += parser.errors
    return Parse(text, errors, " ".join(chunks), pieces or [(0, 0, False)], finished, parser.visitor_errors)
