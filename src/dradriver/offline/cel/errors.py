"""The two errors the CEL API raises, and the internal signal used while evaluating."""

from __future__ import annotations

# What Kubernetes' CompileCELExpression puts before the issues of an expression that does not compile.
COMPILATION_FAILED = "compilation failed: "


class CELCompileError(ValueError):
    """The expression cannot be compiled: syntax, undeclared names, type errors, size limits.

    Kubernetes rejects such a selector when the DeviceClass or ResourceClaim is created.
    `hint`, when set, is a suggested correction for a common mistake.
    """

    def __init__(self, message: str, *, expression: str = "", hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.expression = expression
        self.hint = hint


class CELRuntimeError(RuntimeError):
    """Evaluation failed for one device: unknown attribute, no such overload, cost limit, ...

    The scheduler treats this as an allocation error for the claim, never as "no match".
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class EvalError(Exception):
    """A CEL error value in flight. `||`, `&&` and comprehension loops may absorb it, as in cel-go."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CostLimitError(Exception):
    """Aborts the whole evaluation at once; unlike EvalError no operator can absorb it."""


class InternalError(Exception):
    """A Go panic that cel-go recovers at the top of the evaluation ("internal error: ..."): it
    ends the whole evaluation, and unlike EvalError no operator can absorb it."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
