"""Readable transcripts of an episode, for ``marl play`` and the golden-transcript tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from marl.protocols.graphs import edge_list

if TYPE_CHECKING:
    from marl.scenarios.base import TextScenarioEnv


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


def render_transcript(env: TextScenarioEnv, show_completions: bool = True) -> str:
    """The whole episode so far: every completion, delivery, violation and the returns."""
    lines = []
    current_round = -1
    for turn in env.log:
        if turn.round != current_round:
            current_round = turn.round
            lines.append(f"--- round {turn.round + 1} ---")
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
    returns = env.returns
    lines.append("--- result ---")
    lines.append("returns: " + ", ".join(f"{a}={returns[a]:+.3f}" for a in env.possible_agents))
    if any(env.malformed.values()):
        lines.append("malformed: " + ", ".join(f"{a}={n}" for a, n in env.malformed.items()))
    return "\n".join(lines)
