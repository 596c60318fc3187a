"""The ``calculator`` tool: exact arithmetic on integers and fractions, never ``eval``.

The query is parsed with :mod:`ast` and walked over a whitelist of node types: numbers
(integers and decimals, read exactly: ``0.1`` is 1/10), ``+ - * / // % **`` (``^`` is a power, as
calculators write it, with the power's precedence: it binds tighter than ``*`` and ``+`` and to
the right, so ``2*3^2`` is 18 and ``2^3^2`` is 512), unary ``+``/``-`` and parentheses. Anything
else (names, calls, attributes, strings, comparisons) is refused with a message that names it.

Bounds, so that no query can hang or exhaust memory: at most ``MAX_QUERY_CHARS`` characters and
``MAX_DEPTH`` levels of nesting; a power's exponent must be a whole number of at most
``MAX_EXPONENT`` in size, and no operand or result may need more than ``MAX_BITS`` bits. A power
is refused *before* it is computed when its result must need more (``e * (bits(b) - 1) + 1`` bits
at least, for the numerator and the denominator of the base ``b``: ``9**9**9`` and ``10**5000``
are refused at once), and computed otherwise (at most ``e * bits(b)`` bits, a bounded cost), then
checked: ``2**2050`` (2,051 bits) is exact, ``2**4096`` (4,097 bits) is refused. The result is
exact: an integer, or a fraction ``p/q`` followed by its decimal value.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from marl.protocols.tools.base import ToolError, register_tool

MAX_QUERY_CHARS = 500
MAX_DEPTH = 40
MAX_BITS = 4096  # about 1,230 decimal digits
MAX_EXPONENT = 10_000

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_NAMES = {
    ast.Name: "a name",
    ast.Call: "a function call",
    ast.Attribute: "an attribute",
    ast.Subscript: "indexing",
    ast.Compare: "a comparison",
    ast.BoolOp: "a boolean operator",
    ast.Lambda: "a lambda",
}


def _bits(value: Fraction) -> int:
    return max(value.numerator.bit_length(), value.denominator.bit_length())


def _check_size(value: Fraction) -> Fraction:
    if _bits(value) > MAX_BITS:
        raise ToolError(f"number too large (more than {MAX_BITS} bits)")
    return value


def _least_power_bits(magnitude: int, e: int) -> int:
    """The fewest bits ``magnitude**e`` can need (``magnitude >= 1``, ``e >= 0``): a number
    of ``n`` bits is at least ``2**(n - 1)``, so its ``e``-th power needs ``e * (n - 1) + 1``
    bits or more."""
    return e * (magnitude.bit_length() - 1) + 1


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ToolError("only whole-number exponents are exact; got a fractional exponent")
    e = exponent.numerator
    if abs(e) > MAX_EXPONENT:
        raise ToolError(f"exponent {e} is too large (at most {MAX_EXPONENT} in size)")
    if base == 0 and e < 0:
        raise ToolError("division by zero (0 to a negative power)")
    if base != 0:
        parts = (abs(base.numerator), base.denominator)
        if max(_least_power_bits(p, abs(e)) for p in parts) > MAX_BITS:
            raise ToolError(f"result too large (more than {MAX_BITS} bits)")
    result = base**e  # at most e * bits(base) bits, fewer than MAX_BITS + MAX_EXPONENT
    if _bits(result) > MAX_BITS:
        raise ToolError(f"result too large (more than {MAX_BITS} bits)")
    return result


def _evaluate(node: ast.AST, depth: int = 0) -> Fraction:
    if depth > MAX_DEPTH:
        raise ToolError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolError(f"not a number: {str(value)[:40]!r}")
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise ToolError("not a finite number")
            return _check_size(Fraction(repr(value)))
        return _check_size(Fraction(value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, depth + 1)
        right = _evaluate(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ToolError(f"operator {type(node.op).__name__} is not supported")
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ToolError("division by zero")
        return _check_size(Fraction(op(left, right)))
    what = _NAMES.get(type(node), type(node).__name__)
    raise ToolError(f"{what} is not arithmetic; use numbers, + - * / // % ** and parentheses")


def calculate(query: str) -> Fraction:
    """The exact value of an arithmetic expression; :class:`ToolError` for anything else."""
    text = query.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise ToolError("empty expression")
    if len(text) > MAX_QUERY_CHARS:
        raise ToolError(f"expression longer than {MAX_QUERY_CHARS} characters")
    if text.count("(") > MAX_DEPTH:
        raise ToolError(f"expression nested too deeply (more than {MAX_DEPTH} parentheses)")
    # ``^`` is a power: spelled ``**`` before parsing, it takes the power's precedence and right
    # associativity (Python would read it as XOR, below ``+`` and ``*``: 2^3+1 would be 2^4)
    text = text.replace("^", "**")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        reason = getattr(exc, "msg", None) or type(exc).__name__
        raise ToolError(f"cannot parse the expression ({reason})") from None
    try:
        return _evaluate(tree)
    except RecursionError:
        raise ToolError("expression nested too deeply") from None


def format_number(value: Fraction) -> str:
    """An integer as itself; a fraction as ``p/q (decimal)``, the decimal to 10 places."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    scaled = abs(value) * 10**10
    whole = scaled.numerator // scaled.denominator
    digits = str(whole).rjust(11, "0")
    decimal = f"{digits[:-10]}.{digits[-10:]}".rstrip("0").rstrip(".")
    approx = "" if scaled.denominator == 1 else "~"
    return f"{value.numerator}/{value.denominator} ({approx}{sign}{decimal})"


@register_tool(
    "calculator",
    "exact arithmetic: write `CALL calculator:` and then an expression of numbers, "
    "+ - * / // % ** and parentheses",
)
def calculator_tool(query: str, settings: Mapping[str, Any], data: Any) -> str:
    """Evaluate ``query`` exactly (see the module docstring)."""
    return format_number(calculate(query))
