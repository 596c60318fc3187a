"""Rules of ``ledger``: a team task that only tools can solve.

A clerk and an auditor must report the total cost of one order: the item's unit price times the
quantity ordered. The prices sit in the clerk's lookup table and the quantities in the
auditor's, and neither appears in any observation, so the clerk must look the price up and
relay it, and the auditor must look the quantity up and multiply a three-digit price by a
two-digit quantity: the calculator tool makes that exact. Round 1 is talk, round 2 the
auditor's answer. Team reward 1 for the exact total, else 0 (``success`` likewise).

Version history:
- v0: first version.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.protocols.tools import ToolBox, scripted_call
from marl.scenarios.bots import register_bot
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules

ITEMS = (
    "anchors", "bolts", "cables", "drills", "gears", "hinges", "lamps", "nails", "pipes",
    "rivets", "springs", "valves",
)  # fmt: skip
_PRICE = re.compile(r"\bis (\d{1,9})\b")
MAX_ANSWER_DIGITS = 12


@register_rules("ledger")
class LedgerRules(Rules):
    """The clerk relays a looked-up price; the auditor multiplies it by a looked-up quantity."""

    info = ScenarioInfo(min_agents=2, max_agents=2, default_topology="complete", default_rounds=2)

    @dataclass(frozen=True)
    class Params:
        """items: rows of each table (drawn from a fixed list of 12 item names).
        min_price / max_price: unit prices are whole numbers in this range.
        min_quantity / max_quantity: quantities likewise.
        scoring: ``exact`` (team reward 1 for the exact total, else 0) or ``digits`` (partial
        credit: the share of the total's digits found among the answer's digits, counted with
        multiplicity, reading every digit of the reply; for tiny test models, whose answers are
        never exact).
        ``success`` is exactness either way."""

        items: int = 6
        min_price: int = 101
        max_price: int = 999
        min_quantity: int = 12
        max_quantity: int = 99
        scoring: str = "exact"

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """Ranges must be ordered and positive, and the items must exist."""
        p = cls.Params(**params)
        problems = []
        if not 1 <= p.items <= len(ITEMS):
            problems.append(Problem("items", f"must be between 1 and {len(ITEMS)}"))
        if p.scoring not in ("exact", "digits"):
            problems.append(Problem("scoring", f"must be exact or digits, got {short(p.scoring)}"))
        for low, high in (("min_price", "max_price"), ("min_quantity", "max_quantity")):
            if not 1 <= getattr(p, low) <= getattr(p, high) <= 10**6:
                problems.append(Problem(low, f"must be >= 1 and <= {high} (at most 1000000)"))
        return problems

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.clerk, self.auditor = self.agents
        self.prices: dict[str, int] = {}
        self.quantities: dict[str, int] = {}
        self.item = ""
        self.answer: int | None = None
        self.done = False

    def reset(self) -> None:
        """Deal the two tables and the item in question."""
        p = self.params
        items = self.rng.sample(ITEMS, p.items)
        self.prices = {i: self.rng.randint(p.min_price, p.max_price) for i in items}
        self.quantities = {i: self.rng.randint(p.min_quantity, p.max_quantity) for i in items}
        self.item = self.rng.choice(items)
        self.answer = None
        self.done = False

    @property
    def total(self) -> int:
        """The right answer."""
        return self.prices[self.item] * self.quantities[self.item]

    def needs_action(self, agent: str, round: int) -> bool:
        """Only the auditor acts, in the second round."""
        return agent == self.auditor and round == 1

    def can_talk(self, agent: str, round: int) -> bool:
        """Everyone talks in the first round only."""
        return round == 0

    def private_info(self, agent: str) -> str:
        """Who holds which table, and who answers."""
        if agent == self.clerk:
            return (
                f"You keep the price list: your lookup tool gives the unit price of each item. "
                f"{self.auditor} needs the unit price of the item in question and cannot see "
                "your list."
            )
        return (
            "You keep the order book: your lookup tool gives the quantity ordered of each item. "
            f"{self.clerk} knows the unit prices. Next round you answer with the total cost of "
            "the item in question: its unit price times its quantity."
        )

    def private_label(self, agent: str) -> str | None:
        """The clerk's message could carry the price."""
        return str(self.prices[self.item]) if agent == self.clerk else None

    def public_state(self) -> str:
        """The item in question."""
        return f"The item in question: {self.item}."

    def action_help(self, agent: str) -> str:
        """A whole number."""
        return "the total cost as a whole number (digits only)."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots; the auditor's ``valid_actions`` are a few of its
        valid (whole-number) answers, for the random bot."""
        if agent == self.clerk:
            return {"item": self.item, "role": "clerk"}
        return {"item": self.item, "role": "auditor", "valid_actions": [str(d) for d in range(10)]}

    def tool_data(self, agent: str) -> dict[str, Any]:
        """Each agent's own lookup table."""
        return {"lookup": dict(self.prices if agent == self.clerk else self.quantities)}

    def success(self) -> float | None:
        """1.0 for the exact total, 0.0 otherwise, once answered."""
        if not self.done:
            return None
        return 1.0 if self.answer == self.total else 0.0

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Score the auditor's total in the second round."""
        if round == 0:
            return RoundResult()
        self.done = True
        result = RoundResult(done=True, team=0.0)
        raw = (actions.get(self.auditor) or "").replace(",", "").strip()
        if self.params.scoring == "digits":
            return self._partial(raw, result)
        digits = re.fullmatch(r"\$?\s*(\d+)(?:\.0+)?\.?", raw)
        if digits is None or len(digits.group(1)) > MAX_ANSWER_DIGITS:
            result.invalid[self.auditor] = f"expected the total as a whole number, got {raw[:40]!r}"
            return result
        self.answer = int(digits.group(1))
        result.team = 1.0 if self.answer == self.total else 0.0
        result.public_events.append(
            f"{self.auditor} answered {self.answer}; the total was {self.total}."
        )
        return result

    def _partial(self, raw: str, result: RoundResult) -> RoundResult:
        """``scoring: digits``: the share of the total's digits among the answer's digits."""
        digits = "".join(c for c in raw if c.isdigit())[:MAX_ANSWER_DIGITS]
        if not digits:
            result.invalid[self.auditor] = f"expected the total as digits, got {raw[:40]!r}"
            return result
        self.answer = int(digits)
        truth = str(self.total)
        common = Counter(digits) & Counter(truth)
        result.team = sum(common.values()) / len(truth)
        result.public_events.append(f"{self.auditor} answered {digits}; the total was {truth}.")
        return result


@register_bot("ledger", "rule")
def ledger_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """The clerk looks the price up and says it; the auditor looks the quantity up, reads the
    price from the clerk's message and multiplies them with the calculator."""
    tools = ToolBox.from_info(info)
    item = info.get("item", "")
    if tools is None:
        return "ACTION: 0" if info.get("needs_action") else ""
    if info.get("role") == "clerk":
        if not info.get("neighbours"):
            return ""
        lines, outcome = scripted_call(tools, "lookup", item)
        price = outcome.text.split(":", 1)[-1].strip()
        return f"{lines}SAY: the unit price of {item} is {price}"
    if not info.get("needs_action"):
        return "SAY: ready" if info.get("neighbours") else ""
    inbox = observation.split("Messages you received:")[-1].split("Messages you sent:")[0]
    heard = "Messages you received:" in observation
    numbers = _PRICE.findall(inbox) if heard else []
    price = numbers[-1] if numbers else "0"
    looked, outcome = scripted_call(tools, "lookup", item)
    quantity = outcome.text.split(":", 1)[-1].strip()
    product, result = scripted_call(tools, "calculator", f"{price}*{quantity}")
    total = result.text.split(":", 1)[-1].strip()
    return f"{looked}{product}ACTION: {total}"
