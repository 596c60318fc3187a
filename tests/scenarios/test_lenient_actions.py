"""episode.lenient_actions: an answer written in prose still counts, with the malformed penalty."""

from __future__ import annotations

import marl


def _listener_return(lenient: bool, reply: str, scenario: str = "signal-v0") -> tuple[float, int]:
    env = marl.make(scenario, episode={"lenient_actions": lenient})
    env.reset(seed=0)
    target = env.rules.target + 1
    name = " ".join(env.rules.candidates[env.rules.target])
    env.step({"speaker": "SAY: hello", "listener": "ACTION: wait"})
    env.step({"speaker": "", "listener": reply.format(target=target, name=name)})
    return env.returns["listener"], env.malformed["listener"]


def test_prose_answer_scores_with_penalty_only_when_lenient() -> None:
    # a prose answer that names the candidate (signal-v1 takes names)
    assert _listener_return(True, "I pick the {name}.", "signal-v1") == (1.0 - 0.1, 1)
    strict_return, strict_malformed = _listener_return(False, "I pick the {name}.", "signal-v1")
    assert strict_return == -0.1 and strict_malformed == 1


def test_a_digit_inside_prose_is_no_answer() -> None:
    # "ACTION: round 1" once picked candidate 1: a trained listener settled on writing it
    target = marl.make("signal-v0")
    target.reset(seed=0)
    other = 1 if target.rules.target != 0 else 2  # a candidate number that is not the target
    for reply in (f"ACTION: round {other}", f"The target is {other}."):
        assert _listener_return(True, reply) == (-0.1, 1), reply
    for reply in (f"ACTION: {other}", f"ACTION: #{other}", f"ACTION: candidate {other}."):
        assert _listener_return(True, reply)[1] == 0, reply


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
