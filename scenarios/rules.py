"""Scenario rules: the Python half of a scenario, and the registry YAML files name them by.

A rules class holds the game: what each agent privately knows, what the public state is, what
an action does and what the episode pays. It never sees messages or graphs (the environment
base class handles those) and never sees an LLM. Everything it keeps lives in ``self`` and is
deep-copied by the environment's snapshot, so it must be plain data plus ``self.rng``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

from marl.protocols.registry import Registry
from marl.scenarios.problems import Problem, short

RULES: Registry[str, type[Rules]] = Registry("rules")


@dataclass(frozen=True)
class ScenarioInfo:
    """What a scenario is, declared as data that the environment reads.

    Who acts in which round is the rules' ``needs_action``, and how team and individual payoffs
    mix is the YAML's ``reward.cooperation``; neither is declared here, so a declaration cannot
    disagree with the behaviour.
    """

    min_agents: int = 2
    max_agents: int = 16
    default_topology: str = "complete"
    default_rounds: int = 1
    # True: a completion without an ACTION line is taken whole (minus SAY lines) as the action,
    # with no parse error. For toy scenarios that a randomly initialised model must learn.
    free_text_action: bool = False
    # True: the individual payoffs of every episode sum to zero (a strictly competitive game).
    # With reward.malformed_penalty 0 the returns then sum to zero too, and the sign of an
    # agent's return says whether it won, drew or lost (marl.scenarios.zero_sum).
    zero_sum: bool = False
    # The unit of the individual payoff, for a game played for the payoff rather than for the
    # win: its stakes differ from episode to episode (Kuhn Poker: "chips"; a hand won on a call
    # pays twice one won on a fold). None: every win is worth the same. ``marl eval`` ranks a
    # zero-sum scenario that declares it by mean payoff (marl.competition.crossplay).
    payoff_unit: str | None = None
    # The dotted name of a module that holds the game's exact tree, for two-player games small
    # enough to solve (None: the game declares none). The module offers ``supports(params)``,
    # ``INFO_SETS``, ``MOVES``, ``seat_of(key)``, ``info_set_of(info)``,
    # ``reach_info_set(env, key)``, ``policy_from(prob)``, ``nash_policy``, ``uniform_policy``,
    # ``average_policy(policies)``, ``chips_by_seat``, ``expected_value``, ``best_response``,
    # ``nash_conv`` and ``exploitability``; read it with :func:`game_tree`. A name, not the
    # module: this object stays plain data.
    tree: str | None = None


@dataclass
class RoundResult:
    """What the rules report after the actions of one round.

    individual: each agent's own payoff this round (added to its episode payoff).
    team:       the team payoff this round; ``None`` means the mean of ``individual``.
    invalid:    agents whose action was not valid, with the reason (they get the penalty).
    done:       the episode is over.
    public_events: lines every agent sees from now on (the observation's ``Events:``).
    notes:      lines for the transcript only, by the agent whose turn they follow (what the
                game said after its move: a board, the cards dealt, why the game ended); no
                agent is shown them through this field.
    """

    individual: dict[str, float] = field(default_factory=dict)
    team: float | None = None
    invalid: dict[str, str] = field(default_factory=dict)
    done: bool = False
    public_events: list[str] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)


class Rules:
    """Base class for a scenario's rules. Subclass, declare ``info`` and ``Params``, register."""

    info: ClassVar[ScenarioInfo] = ScenarioInfo()

    @dataclass(frozen=True)
    class Params:
        """Parameters a YAML file can set under ``params:``."""

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        self.agents = list(agents)
        self.params = self.Params(**params)
        self.rng = rng

    # --- validation --------------------------------------------------------------------------
    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """Cross-field checks on ``params`` beyond their names; path relative to ``params``."""
        return []

    @classmethod
    def episode_rounds(cls, params: dict[str, Any]) -> int | None:
        """The number of rounds ``params`` imply, or ``None`` when the YAML's ``episode.rounds``
        decides. Called only on params that passed :meth:`check_params`; when it gives a number,
        ``episode.rounds`` defaults to it and may not differ from it."""
        return None

    # --- the game ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Deal a fresh episode using ``self.rng``."""

    def needs_action(self, agent: str, round: int) -> bool:
        """Whether ``agent``'s ACTION line matters in ``round``."""
        return True

    def can_talk(self, agent: str, round: int) -> bool:
        """Whether ``agent`` may send messages in ``round`` (its SAY lines are dropped if not)."""
        return True

    def private_info(self, agent: str) -> str:
        """What only ``agent`` knows, as text."""
        return ""

    def private_label(self, agent: str) -> str | None:
        """The private information a message of ``agent`` could carry, as one short label
        (signal: the target; relay: the agent's digit), or ``None`` when it has none.

        It is the S of the speaker-consistency metric I(M; S) (:mod:`marl.analysis.emergence`); it
        is read when the episode is over, so it must be what the agent knew while it talked."""
        return None

    def alternative_labels(self, agent: str) -> list[str]:
        """The private labels ``agent`` could have had in this episode, given everything the
        other agents see, each as likely as the scenario draws it (signal: the target could be
        any of the listener's candidates); empty when the scenario does not say. With
        :meth:`set_private_label`, the listening measures (:mod:`marl.analysis.listening`) ask what
        the speaker would have said in each of them."""
        return []

    def set_private_label(self, agent: str, label: str) -> None:
        """Make ``label`` (one of :meth:`alternative_labels`) ``agent``'s private label, before
        anyone has acted: a counterfactual episode that differs only there."""
        raise NotImplementedError(f"{type(self).__name__} declares no alternative labels")

    def success(self) -> float | None:
        """Whether the episode reached the scenario's goal (1.0 / 0.0, or a fraction), or
        ``None`` when the scenario has no such notion or the goal is not decided yet. Logged as
        ``team/success``; unlike the reward it ignores partial credit and shaping."""
        return None

    def public_state(self) -> str:
        """What everybody sees, as text."""
        return ""

    def action_help(self, agent: str) -> str:
        """One sentence on what an ACTION line should hold for ``agent``."""
        return "Write your action."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots and logs (plain JSON-like data)."""
        return {}

    def legal_actions(self, agent: str) -> dict[str, str] | None:
        """``agent``'s legal actions now, when they form a finite set: ``{reply text: action}``,
        the text an ACTION line holds (``"bet"``, ``"2"``) mapped to the action it means. Several
        texts may mean one action (signal-v1: a candidate's number and its name). ``None``:
        open-text actions, or the agent does not act now.

        Exact action distributions (:mod:`marl.agents.action_scores`) score each text
        teacher-forced and sum the probabilities of the texts of one action; the emergence
        measures (:mod:`marl.analysis.listening`) and exploitability read policies this way."""
        return None

    def parse_action(self, agent: str, text: str) -> str | None:
        """The action ``agent``'s parser reads from ``text`` (what an ACTION line holds), as
        :meth:`legal_actions` names it; ``None`` for a text it rejects. The default accepts the
        legal texts exactly (stripped); rules whose parser is lenient (case, extra words)
        override it with that parser, so exact measures score every spelling it accepts
        (:func:`marl.scenarios.spellings.accepted_texts`)."""
        legal = self.legal_actions(agent) or {}
        return legal.get(text.strip())

    def tool_data(self, agent: str) -> dict[str, Any]:
        """What each declared tool gets for ``agent`` this round, by tool name (plain data):
        ``{"lookup": {key: value}}`` is the agent's own lookup table (docs/tools.md)."""
        return {}

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Apply the round's actions (``None`` = no valid ACTION line)."""
        raise NotImplementedError


def register_rules(name: str) -> Callable[[type[Rules]], type[Rules]]:
    """Register a rules class under ``name``; duplicate names are refused."""

    def decorator(cls: type[Rules]) -> type[Rules]:
        if not dataclasses.is_dataclass(cls.Params):
            raise TypeError(f"rules {name!r}: Params must be a dataclass")
        return RULES.add(name, cls)

    return decorator


def import_rules_module(name: object) -> list[Problem]:
    """Import the module a scenario names in ``rules_module`` (its rules, bots, topologies or
    shaping kinds register themselves on import); the problems, if it cannot be.

    Importing runs the module's code: a scenario file or config may name only modules the user
    trusts (docs/security.md). The name must be an absolute dotted module name that
    Python's import path already reaches (an installed package, or a directory on
    PYTHONPATH); no file path is accepted and nothing is added to the path.
    """
    if not (isinstance(name, str) and name and all(p.isidentifier() for p in name.split("."))):
        return [
            Problem(
                "rules_module",
                f"must be a dotted Python module name such as my_pkg.my_rules, got {short(name)}",
            )
        ]
    if sys.modules.get(name) is not None:
        return []  # imported already: nothing runs again
    out, err = io.StringIO(), io.StringIO()
    try:
        # what the module prints while it imports is held back, and shown only if it imports:
        # a module that fails (or exits) is this one problem, not a screen of its own output
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            importlib.import_module(name)
    except SystemExit as exc:  # a script's main (unittest.__main__) must not end the caller
        return [
            Problem(
                "rules_module",
                f"cannot import {name!r}: it exits when imported (SystemExit: "
                f"{short(exc.code)}); name a module that only defines and registers rules",
            )
        ]
    except Exception as exc:  # noqa: BLE001 - any failure of the user's module is reported
        lines = str(exc).splitlines()
        reason = f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
        return [Problem("rules_module", f"cannot import {name!r}: {reason}")]
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
    return []


def game_tree(spec: Any) -> ModuleType | None:
    """The exact game tree of the scenario ``spec`` (a :class:`ScenarioSpec`): the module its
    rules declare in ``ScenarioInfo.tree``, when that module ``supports`` the spec's params;
    else ``None`` (no tree declared, or params that change the game, as Kuhn Poker's table talk
    or another bet size do). The answer to "can this scenario's policies be solved exactly?"."""
    name = RULES[spec.rules].info.tree
    if name is None:
        return None
    module = importlib.import_module(name)
    return module if module.supports(spec.params) else None
