"""The rollout worker: environment copies plus the inference side of every policy.

A worker plays whole GRPO groups (one scenario seed x ``group_size`` episodes), so the episodes
a group is normalised over never straddle two workers. What it plays is a pure function of the
config, the step, the groups it is given and the weights it holds: a worker that dies can be
replaced, given the current weights, and asked again for the same result. The same class runs
in the trainer's own process (``ray.enabled=false``) and as a Ray actor.

The environments never leave the worker: a rollout returns plain data (turn records and one
:class:`~marl.episodes.EpisodeRecord` per episode), and counterfactual credit, which must step
environments, runs here too (:meth:`RolloutWorker.credit`), on the episodes this worker played.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from marl.config import Config, ConfigError
from marl.credit import CreditResult, RecordedEpisode, Resimulator
from marl.runtime.curriculum import overrides_at, stage_at
from marl.runtime.policy_map import PolicyPlan
from marl.runtime.rollout import EpisodeSlot, RolloutResult
from marl.runtime.seeding import HELD_OUT_SEEDS, held_out_seeds
from marl.scenarios.registry import make


def step_seeds(seed: int, step: int, count: int) -> list[int]:
    """The scenario seeds of one iteration: a pure function of (run seed, step), each below
    :data:`~marl.runtime.seeding.HELD_OUT_SEEDS`."""
    rng = random.Random(f"{seed}:{step}:scenario")
    return [rng.randrange(HELD_OUT_SEEDS) for _ in range(count)]


def eval_seeds(seed: int, count: int) -> list[int]:
    """The held-out evaluation's scenario seeds, a pure function of the run seed: each at or
    above :data:`~marl.runtime.seeding.HELD_OUT_SEEDS`, where no training seed lies, so the two sets
    are disjoint whatever the seeds and the number of steps."""
    return held_out_seeds(f"{seed}:eval:scenario", count)


def split_groups(groups: int, workers: int) -> list[list[int]]:
    """Deal ``groups`` group indices to at most ``workers`` workers, in contiguous blocks."""
    workers = max(1, min(workers, groups))
    size, extra = divmod(groups, workers)
    out, start = [], 0
    for w in range(workers):
        end = start + size + (1 if w < extra else 0)
        out.append(list(range(start, end)))
        start = end
    return out


def scripted_episodes(slots: Sequence[EpisodeSlot], bot: str, seed: int) -> RolloutResult:
    """Play every slot with the scenario's scripted ``bot`` for every agent (no model, no turn
    records). Each episode's bot randomness comes from its own generator, so the result does
    not depend on which worker plays which episode."""
    from marl.scenarios.bots import play_bot_episode

    result = RolloutResult()
    for slot in slots:
        rng = random.Random(f"{seed}:{slot.seed}:{slot.episode_id}:bot")
        play_bot_episode(slot.env, bot, slot.seed, rng)
        result.add_episode(slot)
    return result


class RolloutWorker:
    """Plays the groups it is given with the policies' current weights.

    ``plan`` is ``None`` for scripted agents (``agents=scripted``): no model is built.
    """

    def __init__(
        self, config: Config, plan: PolicyPlan | None, index: int = 0, device: str | None = None
    ) -> None:
        self.config = config
        self.plan = plan
        self.index = index
        # (curriculum stage, episode id) -> its environment, reused every step of the stage
        self.envs: dict[tuple[int, int], Any] = {}
        self.eval_envs: dict[int, Any] = {}  # the held-out evaluation's environments
        self.policies = None
        self._engines: dict[int, Resimulator] = {}  # counterfactual credit's, by stage
        self._influence_engines: dict[int, Resimulator] = {}  # influence's, by stage
        self.credited = 0  # episodes this worker has computed counterfactual credit for
        if config.agents == "llm":
            if plan is None:
                raise ConfigError("agents: llm agents need a policy plan")
            from marl.runtime.policies import InferencePolicies

            self.policies = InferencePolicies(plan, config, device=device)

    def slots(self, step: int, groups: Sequence[int], matchup: Any = None) -> list[EpisodeSlot]:
        """The episodes of ``groups`` at ``step``: group b plays scenario seed b, G times. A
        league ``matchup`` (:class:`marl.competition.league.Matchup`) puts its opponent on the seats
        the learner does not play."""
        t = self.config.train
        seeds = step_seeds(self.config.seed, step, t.seeds_per_step)
        stage = stage_at(self.config, step)  # train.curriculum's stage (marl.runtime.curriculum)
        out = []
        for b in groups:
            for g in range(t.group_size):
                episode = b * t.group_size + g
                if (stage, episode) not in self.envs:
                    self.envs[stage, episode] = self._make_env(stage)
                env = self.envs[stage, episode]
                policies, bots = ({}, {})
                if matchup is not None:
                    policies, bots = matchup.overrides(b, list(env.possible_agents))
                out.append(
                    EpisodeSlot(
                        env=env,
                        seed=seeds[b],
                        group_id=b,
                        episode_id=episode,
                        policies=policies,
                        bots=bots,
                    )
                )
        return out

    def rollout(self, step: int, groups: Sequence[int], matchup: Any = None) -> RolloutResult:
        """Play ``groups`` of iteration ``step`` to the end (against ``matchup``'s opponent)."""
        return self._play(self.slots(step, groups, matchup), self.config.seed * 1_000_003 + step)

    def evaluate(self, episodes: int, step: int) -> RolloutResult:
        """Play ``episodes`` held-out scenarios, one episode each (no update follows); the same
        seeds at every evaluation of a run, so evaluations compare like with like."""
        slots = []
        for k, scenario_seed in enumerate(eval_seeds(self.config.seed, episodes)):
            if k not in self.eval_envs:
                self.eval_envs[k] = make(
                    self.config.scenario.name, **self.config.scenario.overrides
                )
            slots.append(
                EpisodeSlot(env=self.eval_envs[k], seed=scenario_seed, group_id=k, episode_id=k)
            )
        return self._play(slots, self.config.seed * 1_000_003 + 500_009 + step)

    def _play(self, slots: list[EpisodeSlot], seed: int) -> RolloutResult:
        """Play ``slots`` to the end with the policies (or the scripted bot)."""
        if self.policies is None:
            return scripted_episodes(slots, self.config.bot, seed)
        from marl.runtime.rollout import run_episodes

        assert self.plan is not None
        return run_episodes(
            slots,
            self.policies.backends,
            self.plan.policy_of,
            self.config.sampling,
            seed,
            temperatures=self.plan.temperatures,
            scored=self.plan.scored,
        )

    def load_weights(self, payload: Any) -> int:
        """Take a learner's new weights; returns the version now held."""
        if self.policies is None:
            return 0
        self.policies.load(payload)
        return payload.version

    def versions(self) -> dict[str, int]:
        """The weight version held of each policy."""
        return dict(self.policies.versions) if self.policies is not None else {}

    def credit(self, step: int, episodes: Sequence[RecordedEpisode]) -> CreditResult:
        """Counterfactual credit (``config.credit``) of ``episodes``, the episodes of iteration
        ``step`` that this worker played, re-simulated on its own environment copies with its
        own policies' generation. A pure function of (step, episodes, weights): generation is
        seeded by the step, so a replacement worker asked again returns the same credit."""
        from marl.runtime.resimulation import counterfactual_credit, credit_seed, make_engine

        if self.policies is None or self.plan is None:
            raise ConfigError("credit.name: counterfactual credit needs agents=llm")
        stage = stage_at(self.config, step)  # the episodes' own scenario under a curriculum
        if stage not in self._engines:  # one engine per worker and stage: env copies reused
            engine = make_engine(self.config.credit, lambda: self._make_env(stage), None)
            if engine is None:
                raise ConfigError(
                    f"credit.name: {self.config.credit.name!r} does not re-simulate episodes"
                )
            self._engines[stage] = engine
        engine = self._engines[stage]
        engine.generate = self._policy_generate(credit_seed(self.config.seed, step))
        result = counterfactual_credit(self.config.credit, episodes, engine)
        self.credited += len(episodes)
        return result

    def influence(self, step: int, episodes: Sequence[Any]) -> list[Any]:
        """The emergence metrics' listener influence
        (:func:`marl.runtime.resimulation.influence_effects`) of ``episodes``
        (:class:`~marl.episodes.EmergenceEpisode` s this worker played at ``step``), re-simulated on
        this worker's environment copies. Scripted agents answer through their bot, LLM agents
        through this worker's policies; both seeded by the step."""
        from marl.runtime.resimulation import influence_effects, influence_generate

        generate = influence_generate(self.config, step)
        if generate is None:
            generate = self._policy_generate((self.config.seed + 11) * 1_000_003 + step)
        stage = stage_at(self.config, step)
        if stage not in self._influence_engines:
            self._influence_engines[stage] = Resimulator(
                None, generate, env_factory=lambda: self._make_env(stage)
            )
        engine = self._influence_engines[stage]
        engine.generate = generate
        samples = self.config.emergence.influence_samples
        return influence_effects(episodes, engine, generate, samples)

    def _make_env(self, stage: int) -> Any:
        """A training environment of curriculum stage ``stage`` (past the last stage, or
        without a curriculum: the scenario as configured)."""
        return make(self.config.scenario.name, **overrides_at(self.config, stage))

    def _policy_generate(self, seed: int) -> Any:
        """Batched re-simulation generation through this worker's policies, calls seeded from
        ``seed`` (:func:`marl.runtime.resimulation.backend_generate`)."""
        from marl.runtime.resimulation import backend_generate

        if self.policies is None or self.plan is None:
            raise ConfigError("agents: re-simulation with policies needs agents=llm")
        return backend_generate(
            self.policies.backends,
            self.plan.policy_of,
            self.config.sampling,
            seed=seed,
            temperatures=self.plan.temperatures,
            scored=self.plan.scored,
        )

    def holds_model(self, policy_id: str) -> bool:
        """Whether policy ``policy_id``'s backend holds its torch model in this worker (the
        :class:`~marl.agents.backends.PolicyBackend` protocol's ``model``, None for a backend
        that serves a model it does not hold): what :meth:`exploitability` needs."""
        from marl.agents.backends import backend_target

        if self.policies is None:
            return False
        base, _ = backend_target(self.policies.backends[policy_id])
        return base.model is not None

    def exploitability(self, policy_id: str) -> dict[str, Any]:
        """Policy ``policy_id`` scored exactly as a table of the scenario's game tree with the
        weights this worker holds (:func:`marl.runtime.exploitability.score_model`; plain data):
        how ``marl train`` scores the learner under Ray. Needs a backend that holds its torch
        model here (:meth:`holds_model`)."""
        from marl.agents.backends import backend_target
        from marl.runtime.exploitability import score_model

        if self.policies is None:
            raise ConfigError("agents: scripted agents have no policy to score")
        if not self.holds_model(policy_id):
            raise ConfigError(
                f"backend: {self.config.backend!r} holds no torch model to score exactly; use hf"
            )
        assert self.plan is not None  # set with the policies
        base, adapter = backend_target(self.policies.backends[policy_id])
        spec = self.plan.policies[policy_id]
        return score_model(
            base.model,
            base.tokenizer,
            adapter,
            self.config,
            spec.temperature,
            scored=spec.scored,
        )

    def info(self) -> dict[str, Any]:
        """Where this worker runs."""
        return {"index": self.index, "pid": os.getpid(), "credited_episodes": self.credited}
