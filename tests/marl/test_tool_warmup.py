"""The imitation warm-up on a tool scenario imitates what the bot wrote, never the tool output
its replies hold: RESULT lines are tokenized as the generation loop inserts them and masked."""

from __future__ import annotations

import math

from marl.agents.models import ModelSpec, load_model
from marl.config import Config
from marl.loop.warmup import Imitator, bot_turns, encode_turn, response_mask


def _turns():
    config = Config()
    config.scenario.name = "ledger"
    config.warmup.bot = "rule"
    return bot_turns(config, episodes=2, step=0)


def test_tool_output_in_a_bot_reply_is_masked_out_of_the_imitation() -> None:
    _, tok = load_model(ModelSpec(kind="tiny"))
    turns = _turns()
    with_tools = [t for t in turns if "RESULT" in t.completion]
    assert with_tools and len(with_tools) < len(turns)
    for turn in turns:
        _, response = encode_turn(tok, turn)
        mask = response_mask(tok, turn, response)
        assert len(mask) == len(response)
        imitated = tok.decode([i for i, m in zip(response, mask) if m], skip_special_tokens=True)
        skipped = tok.decode([i for i, m in zip(response, mask) if not m])
        assert "RESULT" not in imitated
        assert skipped.count("RESULT") == turn.completion.count("\nRESULT")
        assert imitated + skipped != "" and "CALL" not in skipped


def test_an_imitation_step_counts_only_imitated_tokens() -> None:
    model, tok = load_model(ModelSpec(kind="tiny"))
    turns = _turns()
    imitator = Imitator(model, tok, lr=1e-3, batch_size=4, autocast=False)
    metrics = imitator.step(turns)
    expected = 0
    for turn in turns:
        _, response = encode_turn(tok, turn)
        expected += sum(response_mask(tok, turn, response))
    assert metrics["tokens"] == expected and math.isfinite(metrics["loss"])
