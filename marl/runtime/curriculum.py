"""``train.curriculum``: which version of the scenario each training step plays.

A curriculum is a list of stages (:class:`marl.config.CurriculumStage`), each ``steps`` updates
long, with scenario overrides deep-merged over ``scenario.overrides``; the steps after the last
stage play the scenario as configured. Stage ``k`` covers steps ``[s_k, s_k + steps_k)`` where
``s_k`` is the sum of the earlier stages' steps. Only training episodes (and the re-simulations
of them: counterfactual credit, influence) follow the curriculum; the held-out evaluation and
every measure play the scenario as configured, the task the run is judged on.

The stage of a step depends on the step alone, so a resumed run continues in the right stage.
"""

from __future__ import annotations

from typing import Any

from marl.config import Config, ConfigError
from marl.scenarios.spec import deep_merge

__all__ = ["check_curriculum", "overrides_at", "stage_at"]


def stage_at(config: Config, step: int) -> int:
    """The curriculum stage of training step ``step`` (0-based): the index of its stage, or
    ``len(train.curriculum)`` once the stages are over (the scenario as configured)."""
    end = 0
    for k, stage in enumerate(config.train.curriculum):
        end += stage.steps
        if step < end:
            return k
    return len(config.train.curriculum)


def overrides_at(config: Config, stage: int) -> dict[str, Any]:
    """The scenario overrides of curriculum stage ``stage``: ``scenario.overrides`` with the
    stage's own merged in (the scenario's own past the last stage)."""
    stages = config.train.curriculum
    if stage >= len(stages):
        return dict(config.scenario.overrides)
    return deep_merge(config.scenario.overrides, stages[stage].overrides)


def check_curriculum(config: Config) -> None:
    """Build each stage's scenario once, before anything starts: a stage whose overrides the
    scenario refuses, or that changes the agents, fails here naming its key."""
    from marl.scenarios.problems import ScenarioError
    from marl.scenarios.registry import make

    if not config.train.curriculum:
        return
    agents = list(make(config.scenario.name, **config.scenario.overrides).possible_agents)
    for k in range(len(config.train.curriculum)):
        key = f"train.curriculum[{k}].overrides"
        try:
            env = make(config.scenario.name, **overrides_at(config, k))
        except ScenarioError as exc:
            first = exc.problems[0]
            raise ConfigError(f"{key}: {first.path}: {first.message}") from None
        if list(env.possible_agents) != agents:
            raise ConfigError(
                f"{key}: changes the agents ({', '.join(env.possible_agents)} instead of "
                f"{', '.join(agents)}); a stage may change the scenario, not who plays it"
            )
