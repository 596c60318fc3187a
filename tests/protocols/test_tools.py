"""Tools: the calculator (exact, bounded, never eval; fuzzed), lookup, the CALL/RESULT markup,
the registry and the YAML check of a scenario's ``tools`` section."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.protocols.markup import parse_completion
from marl.protocols.tools import (
    TOOLS,
    ToolBox,
    ToolError,
    find_call,
    format_result,
    normalise_tools,
    register_tool,
    tool_problems,
)
from marl.protocols.tools.calculator import calculate, format_number


@pytest.mark.parametrize(
    ("query", "value"),
    [
        ("17*23", Fraction(391)),
        ("1/3 + 1/6", Fraction(1, 2)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("2**10", Fraction(1024)),
        ("2^10", Fraction(1024)),
        ("-(3 - 5) * 4", Fraction(8)),
        ("7 // 2 + 7 % 2", Fraction(4)),
        ("(2/3)**-2", Fraction(9, 4)),
        # issue 29 (L4): ^ is a power with the power's precedence, not XOR's
        ("2^3+1", Fraction(9)),
        ("2*3^2", Fraction(18)),
        ("2^3^2", Fraction(512)),
        ("2 ^ 3 ** 2", Fraction(512)),
        ("-2^2", Fraction(-4)),
        ("2^-1 + 1", Fraction(3, 2)),
        ("(2^3)^2", Fraction(64)),
    ],
)
def test_calculator_is_exact(query: str, value: Fraction) -> None:
    assert calculate(query) == value


@pytest.mark.parametrize(
    ("query", "bits"),
    [("2**2050", 2051), ("2^4095", 4096), ("3**2584", 4096), ("(1/2)**4095", 4096)],
)
def test_a_power_under_the_stated_bound_is_computed(query: str, bits: int) -> None:
    """The bound is the result's 4,096 bits, not exponent x bits(base) (issue 29, L4)."""
    value = calculate(query)
    assert max(value.numerator.bit_length(), value.denominator.bit_length()) == bits


@pytest.mark.parametrize("query", ["2**4096", "3**2585", "(1/2)**4096", "7**10000", "2^5000"])
def test_a_power_over_the_stated_bound_is_refused_at_once(query: str) -> None:
    start = time.monotonic()
    with pytest.raises(ToolError, match="result too large \\(more than 4096 bits\\)"):
        calculate(query)
    assert time.monotonic() - start < 0.5


def test_calculator_formats_integers_and_fractions() -> None:
    assert format_number(Fraction(391)) == "391"
    assert format_number(Fraction(1, 4)) == "1/4 (0.25)"
    assert format_number(Fraction(-1, 3)) == "-1/3 (~-0.3333333333)"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("9**9**9", "exponent 387420489 is too large"),
        ("10**5000", "result too large"),
        ("(10**1000)**5", "result too large"),
        ("2**0.5", "whole-number exponents"),
        ("1/0", "division by zero"),
        ("0**-1", "division by zero"),
        ("(" * 200 + "1" + ")" * 200, "nested too deeply"),
        ("-" * 5000 + "1", "longer than"),
        ("-" * 400 + "1", "nested too deeply"),
        ("__import__('os').system('id')", "function call is not arithmetic"),
        ("x + 1", "a name is not arithmetic"),
        ("'a' * 3", "not a number"),
        ("1 < 2", "comparison is not arithmetic"),
        ("1 +", "cannot parse"),
        ("", "empty expression"),
    ],
)
def test_calculator_refuses_with_a_clear_message(query: str, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(ToolError, match=message):
        calculate(query)
    assert time.monotonic() - start < 1.0


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_calculator_never_raises_anything_but_a_tool_error(text: str) -> None:
    start = time.monotonic()
    try:
        calculate(text)
    except ToolError:
        pass
    assert time.monotonic() - start < 1.0


_ATOMS = st.integers(min_value=-(10**6), max_value=10**6).map(lambda v: (f"({v})", Fraction(v)))


def _leaf():
    return st.integers(min_value=0, max_value=9).map(lambda v: (str(v), 4, Fraction(v)))


def _render(op: str, left, right, spelling: str, spaced: bool):
    """``left op right`` with the fewest parentheses the usual precedence needs (``^`` above
    ``* /``, above ``+ -``; the power to the right, the others to the left), and its value
    (None when a step is too large, "zero" on a division by zero; the first error wins, as
    the calculator evaluates left to right)."""
    prec = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3}[op]
    (ltext, lprec, lvalue), (rtext, rprec, rvalue) = left, right
    if lprec < prec or (op == "^" and lprec == prec):
        ltext = f"({ltext})"
    if rprec < prec or (op != "^" and rprec == prec):
        rtext = f"({rtext})"
    symbol = spelling if op == "^" else op
    text = f"{ltext} {symbol} {rtext}" if spaced else f"{ltext}{symbol}{rtext}"
    for value in (lvalue, rvalue):
        if not isinstance(value, Fraction):
            return text, prec, value
    if op == "/" and rvalue == 0:
        return text, prec, "zero"
    if op == "^":
        value = lvalue ** int(rvalue) if rvalue <= 64 else None
    else:
        value = {"+": lvalue + rvalue, "-": lvalue - rvalue, "*": lvalue * rvalue}.get(op)
        value = lvalue / rvalue if op == "/" else value
    if value is not None and max(value.numerator.bit_length(), value.denominator.bit_length()) > (
        4096
    ):
        value = None
    return text, prec, value


def _exponent():
    """A small exponent: a digit up to 3, or a tower of two of them (right-associative)."""
    small = st.integers(min_value=0, max_value=3).map(lambda v: (str(v), 4, Fraction(v)))
    tower = st.tuples(small, small, st.sampled_from(["^", "**"]), st.booleans())
    return st.one_of(small, tower.map(lambda t: _render("^", t[0], t[1], t[2], t[3])))


def _arithmetic(children):
    binary = st.tuples(
        st.sampled_from(["+", "-", "*", "/"]), children, children, st.booleans()
    ).map(lambda t: _render(t[0], t[1], t[2], "^", t[3]))
    power = st.tuples(children, _exponent(), st.sampled_from(["^", "**"]), st.booleans()).map(
        lambda t: _render("^", t[0], t[1], t[2], t[3])
    )
    return st.one_of(binary, power)


@settings(max_examples=400, deadline=None)
@given(st.recursive(_leaf(), _arithmetic, max_leaves=10))
def test_calculator_reads_precedence_and_associativity_as_written(expression) -> None:
    """Expressions written with the fewest parentheses (``2*3^2``, ``2^3^2``, ``8-2-1``,
    ``8/2/2``) give the value of the usual reading: ``^`` and ``**`` bind tightest and to the
    right, ``* /`` next and ``+ -`` last, both to the left."""
    text, _, value = expression
    if isinstance(value, Fraction):
        assert calculate(text) == value, text
    else:
        with pytest.raises(ToolError, match="too large" if value is None else "division by zero"):
            calculate(text)


def _combine(children):
    ops = st.sampled_from(["+", "-", "*", "/"])

    def build(args):
        (left, lv), op, (right, rv) = args
        if op == "/" and rv == 0:
            return (f"({left}+{right})", lv + rv)
        value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else 0}[op]
        return (f"({left}{op}{right})", value)

    return st.tuples(children, ops, children).map(build)


@settings(max_examples=300, deadline=None)
@given(st.recursive(_ATOMS, _combine, max_leaves=12))
def test_calculator_matches_exact_fraction_arithmetic(expression) -> None:
    text, value = expression
    try:
        assert calculate(text) == value
    except ToolError as exc:  # only the size and depth bounds may refuse a valid expression
        assert "too" in str(exc)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.text(max_size=50), st.booleans())
def test_a_result_line_never_reads_as_the_agents_own_say_or_action(text, name, error) -> None:
    line = format_result(name or "t", text, error)
    assert line.endswith("\n") and line.count("\n") == 1
    parsed = parse_completion(line, require_action=False)
    assert parsed.action is None and not parsed.messages


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_find_call_never_raises(text: str) -> None:
    call = find_call(text)
    if call is not None:
        assert 0 < call.end <= len(text)


def test_find_call_reads_decorated_lines_and_where_they_end() -> None:
    call = find_call("hm\n**CALL Calculator:** 2+3\nSAY: x")
    assert (call.name, call.query, call.terminated) == ("calculator", "2+3", True)
    assert "hm\n**CALL Calculator:** 2+3\n" == "hm\n**CALL Calculator:** 2+3\nSAY: x"[: call.end]
    assert find_call("CALL lookup: gears").terminated is False
    assert find_call("I will CALL lookup: gears") is None
    assert find_call("RESULT lookup: 3") is None


def _box(**tools):
    return ToolBox(normalise_tools(dict(tools)) | {})


def test_lookup_reads_the_agents_own_table() -> None:
    box = ToolBox(
        {
            "lookup": {
                "calls": 3,
                "max_chars": 100,
                "timeout": 1.0,
                "data": {"Gears": 670, "bolts": 12},
            }
        }
    )
    assert box.call("lookup", " 'gears' ").text == "RESULT lookup: 670\n"
    miss = box.call("lookup", "cogs")
    assert miss.error and "no entry 'cogs'; keys: Gears, bolts" in miss.text
    box.call("lookup", "bolts")
    assert "call limit reached (3 lookup calls per turn)" in box.call("lookup", "bolts").text


def test_output_is_cut_at_max_chars_and_says_so() -> None:
    box = ToolBox({"calculator": {"calls": 1, "max_chars": 10, "timeout": 1.0}})
    out = box.call("calculator", "2**200")
    assert "... [cut: 61 characters in all]" in out.text and not out.error


def test_a_tool_that_crashes_is_an_error_not_a_crash() -> None:
    tools = TOOLS.copy()

    @register_tool("broken", "always fails")
    def broken(query, settings, data):
        raise RuntimeError("bug")

    try:
        box = ToolBox({"broken": {"calls": 1, "max_chars": 100, "timeout": 1.0}})
        out = box.call("broken", "x")
        assert out.error and "the tool failed (RuntimeError: bug)" in out.text
    finally:
        del TOOLS["broken"]
    assert sorted(TOOLS) == sorted(tools)


def test_tool_names_are_registered_once() -> None:
    with pytest.raises(ValueError, match="tool 'calculator' is already registered"):
        register_tool("calculator", "again")(lambda q, s, d: q)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("calculator", ("tools", "must be a list of tool names or a mapping")),
        (["calculator", "abacus"], ("tools[1]", "unknown tool 'abacus'; known: calculator")),
        ({"calculator": {"calls": 0}}, ("tools.calculator.calls", "between 1 and 20")),
        ({"calculator": {"timeout": "fast"}}, ("tools.calculator.timeout", "must be a number")),
        ({"python": {"memory_mb": 8}}, ("tools.python.memory_mb", "between 64 and 4096")),
        ({"lookup": {"colour": 1}}, ("tools.lookup.colour", "unknown option of tool 'lookup'")),
        ({"lookup": {"tables": {"zed": {}}}}, ("tools.lookup.tables.zed", "unknown agent 'zed'")),
        (["lookup", "lookup"], ("tools[1]", "declared twice")),
        ([{"python": {"calls": 2}, "x": 1}], ("tools[0]", "a tool name or a mapping")),
    ],
)
def test_the_tools_section_names_the_offending_key(raw, problem) -> None:
    problems = tool_problems(raw, ["ann", "bob"])
    assert any(p[0] == problem[0] and problem[1] in p[1] for p in problems), problems


def test_a_valid_section_fills_in_defaults() -> None:
    raw = ["calculator", {"python": {"calls": 1, "timeout": 3}}]
    assert tool_problems(raw, ["ann"]) == []
    tools = normalise_tools(raw)
    assert list(tools) == ["calculator", "python"]
    assert tools["python"] == {"calls": 1, "max_chars": 400, "timeout": 3.0, "memory_mb": 256}


def test_a_scenario_with_a_bad_tools_section_is_refused_naming_the_key() -> None:
    import marl
    from marl.scenarios.problems import ScenarioError

    with pytest.raises(ScenarioError, match=r"tools.calculator.calls: must be an integer"):
        marl.make("ledger-v0", tools={"calculator": {"calls": 99}})
