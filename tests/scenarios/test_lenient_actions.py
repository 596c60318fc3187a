"""episode.lenient_actions: an answer written in prose still counts, with the malformed penalty."""

from __future__ import annotations

import marl


def _listener_return(lenient: bool, reply: str) -> tuple[float, int]:
    env = marl.make("signal-v0", episode={"lenient_actions": lenient})
    env.reset(seed=0)
    target = env.rules.target + 1
    env.step({"speaker": "SAY: hello", "listener": "ACTION: wait"})
    env.step({"speaker": "", "listener": reply.format(target=target)})
    return env.returns["listener"], env.malformed["listener"]


def test_prose_answer_scores_with_penalty_only_when_lenient() -> None:
    assert _listener_return(True, "The target is {target}.") == (1.0 - 0.1, 1)
    strict_return, strict_malformed = _listener_return(False, "The target is {target}.")
    assert strict_return == -0.1 and strict_malformed == 1


def test_an_action_line_is_unaffected_by_leniency() -> None:
    assert _listener_return(True, "ACTION: {target}") == (1.0, 0)
    assert _listener_return(False, "ACTION: {target}") == (1.0, 0)


def test_validate_rejects_a_non_boolean_lenient_flag() -> None:
    from marl.scenarios import validate_scenario
    from marl.scenarios.registry import load_document

    data, _ = load_document("signal-v0")
    data["episode"]["lenient_actions"] = "yes"
    assert [str(p) for p in validate_scenario(data)] == [
        "episode.lenient_actions: must be true or false"
    ]
