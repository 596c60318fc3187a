"""Readable transcripts of an episode, for ``marl play`` and the golden-transcript tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from marl.protocols.graphs import edge_list
from marl.protocols.markup import IDLE_REPLY

if TYPE_CHECKING:
    from marl.scenarios.base import TextScenarioEnv, TurnLog


def _indent(text: str, prefix: str = "    | ") -> str:
    return "\n".join(prefix + line for line in (text.splitlines() or [""]))


def render_header(env: TextScenarioEnv) -> str:
    """Scenario name, seed, agents and graph."""
    edges = ", ".join(f"{u}->{v}" for u, v in edge_list(env.graph))
    return (
        f"=== {env.spec.name} | seed {env.episode_seed} | rounds {env.spec.rounds} ===\n"
        f"agents: {', '.join(env.possible_agents)}\n"
        f"graph ({env.spec.graph.topology}): {edges or 'no edges'}\n"
        f"public: {env.rules.public_state() or '-'}\n"
        + "".join(
            f"private[{a}]: {env.rules.private_info(a) or '-'}\n" for a in env.possible_agents
        )
    ).rstrip("\n")


def _waited(turn: TurnLog) -> bool:
    """An idle agent's placeholder reply, with nothing else to show: left out of transcripts."""
    return (
        turn.idle
        and turn.completion.strip() == IDLE_REPLY
        and not (turn.delivered or turn.violations or turn.parse_errors or turn.invalid_action)
        and not turn.notes
    )


def render_transcript(env: TextScenarioEnv, show_completions: bool = True) -> str:
    """The whole episode so far: every completion, delivery, violation, the rules' notes (the
    game's own lines after a move) and the returns. An idle agent's ``ACTION: wait`` (nothing
    was generated for it) is left out."""
    lines = []
    current_round = -1
    for turn in env.log:
        if turn.round != current_round:
            current_round = turn.round
            lines.append(f"--- round {turn.round + 1} ---")
        if _waited(turn):
            continue
        lines.append(f"{turn.agent}:")
        if show_completions:
            lines.append(_indent(turn.completion.strip()))
        for message in turn.delivered:
            lines.append(f"    -> {', '.join(message.receivers)}: {message.text}")
        for violation in turn.violations:
            lines.append(f"    !! {violation.kind}: {violation.detail}")
        for error in turn.parse_errors:
            lines.append(f"    !! malformed: {error}")
        if turn.action is not None:
            lines.append(f"    action: {turn.action}")
        if turn.invalid_action:
            lines.append(f"    !! invalid action: {turn.invalid_action}")
        for note in turn.notes:
            lines.append(_indent(note, "    : "))
    returns = env.returns
    lines.append("--- result ---")
    lines.append("returns: " + ", ".join(f"{a}={returns[a]:+.3f}" for a in env.possible_agents))
    if any(env.malformed.values()):
        lines.append("malformed: " + ", ".join(f"{a}={n}" for a, n in env.malformed.items()))
    return "\n".join(lines)
