"""The turn record: one per agent per round, the only thing credit and the learners read."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TurnRecord:
    """What one agent did in one round of one episode.

    ``mask`` has the length of ``response_ids`` and is 1 where the agent generated the token,
    0 where a tool's output was inserted into the reply (docs/tools.md; its ``logprobs`` entry
    is 0.0 and meaningless). Received messages and environment text live in ``prompt_ids``.
    Only mask-1 tokens are ever trained on. ``extras`` holds ``tool_calls``, ``tool_errors``
    and ``tool_seconds`` when the agent had tools.
    """

    agent: str
    policy_id: str
    group_id: int  # index of the GRPO group (one scenario seed) within the iteration
    episode_id: int  # index of the episode within the iteration
    round: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # behaviour policy's logprob of each response token
    mask: list[int]
    text: str = ""
    parse_ok: bool = True
    reward: float = 0.0  # the agent's episode return, filled in when the episode ends
    advantage: float = 0.0  # filled in by credit assignment
    extras: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.logprobs) != n or len(self.mask) != n:
            raise ValueError(
                f"turn record for agent {self.agent!r}: response_ids ({n}), logprobs "
                f"({len(self.logprobs)}) and mask ({len(self.mask)}) must have the same length"
            )
