"""Typed configuration: one dataclass per Hydra config group, validated at the boundary.

Hydra composes YAML from ``configs/``; :func:`load_config` merges it into these schemas (so a
mistyped key is an error, not a silent default), builds the dataclasses (so ``__post_init__``
checks run), and raises :class:`ConfigError` naming the offending key.

A group whose settings a lower package owns is that package's dataclass, documented once where
it is declared: ``model`` is :class:`marl.agents.models.ModelSpec`, ``sampling`` is
:class:`marl.agents.backends.SamplingConfig`, ``credit`` is
:class:`marl.credit.registry.CreditConfig`, and ``algo`` extends :class:`UpdateSettings` (the
learner's hyper-parameters). The other groups are declared and documented here.

Importing this module loads no torch: the schemas it reuses are torch-free, and the loss and
advantage registries (which hold tensor functions) are imported when an ``algo`` is built.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from marl.agents.backends.base import LoraSettings, SamplingConfig, backend_names
from marl.agents.models import ModelSpec
from marl.credit.registry import CreditConfig


class ConfigError(ValueError):
    """An impossible or mistyped configuration; the message names the key."""


CHOICES = ("sample", "scored")  # how a policy answers a finite-choice turn (PolicyConfig.choice)


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}")


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    _finite(key, value)
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _finite(key: str, value: float) -> None:
    """NaN and infinities are refused: NaN fails every comparison, so range checks miss it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")


def _check_finite(key: str, value: Any) -> None:
    """Refuse a non-finite number anywhere under ``value`` (dataclasses, mappings, lists)."""
    if isinstance(value, float):
        _finite(key, value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _check_finite(f"{key}.{f.name}" if key else f.name, getattr(value, f.name))
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_finite(f"{key}.{k}" if key else str(k), v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_finite(f"{key}[{i}]", v)


SHARING_MODES = ("shared", "independent", "lora", "custom")


def _policy_config(key: str, value: Any) -> PolicyConfig:
    """A :class:`PolicyConfig` from a YAML/command-line mapping; errors name ``key.<field>``."""
    if isinstance(value, PolicyConfig):
        return value
    if value is None:
        return PolicyConfig()
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping of policy settings, got {value!r}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(PolicyConfig), value)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        inner = getattr(exc, "full_key", None)
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"{key}.{inner}: {reason}" if inner else f"{key}: {reason}") from None
    except ValueError as exc:  # a nested schema's own check; its message starts with its key
        raise ConfigError(f"{key}.{exc}") from None


def _check_policy(key: str, policy: PolicyConfig) -> None:
    """Range checks of one policy's own numbers (cross-field checks live in
    marl.runtime.policy_map)."""
    if policy.num_gpus is not None:
        _positive(f"{key}.num_gpus", policy.num_gpus, allow_zero=True)
        if policy.num_gpus > 1 and policy.num_gpus != int(policy.num_gpus):
            raise ConfigError(
                f"{key}.num_gpus: a request above 1 must be a whole number, got {policy.num_gpus}"
            )
    if policy.lr is not None:
        _positive(f"{key}.lr", policy.lr)
    if policy.beta is not None:
        _positive(f"{key}.beta", policy.beta, allow_zero=True)
    if policy.entropy is not None:
        _positive(f"{key}.entropy", policy.entropy, allow_zero=True)
    if policy.temperature is not None:
        _positive(f"{key}.temperature", policy.temperature, allow_zero=True)
    _choice(f"{key}.choice", policy.choice, CHOICES)
    lora = policy.lora
    if lora is not None:
        _positive(f"{key}.lora.r", lora.r)
        _positive(f"{key}.lora.alpha", lora.alpha)
        if not 0 <= lora.dropout < 1:
            raise ConfigError(f"{key}.lora.dropout: must be in [0, 1), got {lora.dropout}")
        if not lora.target_modules:
            raise ConfigError(f"{key}.lora.target_modules: name at least one module")


@dataclass
class ScenarioConfig:
    """Which scenario to play.

    name:         a registered name (``signal``, ``relay-v0``) or a path to a YAML file.
    overrides:    deep-merged into the scenario YAML (``episode: {rounds: 6}``).
    rules_module: a Python module of your own to import before the scenario is read (its
                  ``@register_rules``, bots, topologies and shaping kinds register themselves),
                  as the YAML key ``rules_module`` does; it becomes
                  ``overrides.rules_module``. Importing runs its code: name only modules you
                  trust (docs/security.md). It must be importable in every process that
                  builds environments (an installed package, or on PYTHONPATH).
    """

    name: str = "signal"
    overrides: dict[str, Any] = field(default_factory=dict)
    rules_module: str | None = None

    def __post_init__(self) -> None:
        if self.rules_module is not None:
            self.overrides = {**self.overrides, "rules_module": self.rules_module}


@dataclass
class UpdateSettings:
    """The update's hyper-parameters: the ``algo`` config group (:class:`AlgoConfig` adds the
    estimator's name and checks the values; a learner takes them as they are, in
    :class:`marl.runtime.learner.LearnerSettings`).

    level:       the policy loss, a name in its registry (``marl.losses.register_policy_loss``);
                 built in: importance ratio per ``token`` (GRPO/PPO) or per ``sequence`` (GSPO,
                 Zheng et al. 2025).
    aggregation: ``seq_mean`` (GRPO), ``token_mean`` (DAPO) or ``constant`` (Dr. GRPO): one of
                 ``marl.losses.Aggregation``.
    clip_eps / clip_eps_high: the ratio clip range [1 - clip_eps, 1 + clip_eps_high].
    beta:        weight of the k3 KL to the frozen initial policy, the model RL starts from
                 (after the warm-up; a LoRA policy's base) (0 = no reference model).
    entropy:     weight of an entropy bonus: the loss subtracts this times the (aggregated)
                 entropy of the sampling distribution at each generated token, exact over the
                 vocabulary (``marl.losses``). It keeps a policy from collapsing onto one answer
                 early; with it, zero-advantage turns carry a gradient too (0 = off).
    lr, weight_decay, max_grad_norm: AdamW and gradient clipping.
    epochs:      passes over the policy's turns of an iteration, shuffled each time.
    minibatch_size: turns per optimizer step. Each pass cuts the policy's N turns that have a
                 response into ``ceil(N / minibatch_size)`` minibatches and steps once per
                 minibatch (PPO/TRL style), so from the second minibatch on the ratio moves
                 away from 1 and the clip can bind. A minibatch's loss is normalised over all
                 its turns, zero-advantage ones included; a minibatch in which no turn carries
                 a gradient (every advantage 0 and beta 0) takes no step, so an iteration takes
                 at most ``epochs * ceil(N / minibatch_size)`` steps.
    microbatch_tokens: positions per forward/backward pass within a minibatch. A minibatch's
                 turns are packed into rows without padding, a prompt shared by several turns
                 once (``marl.agents.packing``), and a row takes turns until the next would pass
                 this many positions (a longer turn goes alone). Gradients accumulate over the
                 rows, each loss normalised by the whole minibatch's denominator, so the step is
                 the same (to float rounding) and only the peak activation memory changes.
                 ``null`` sizes it from the device's free memory at start-up
                 (``marl.runtime.learner.default_microbatch_tokens``): on a GPU usually the
                 whole minibatch in one pass.
    max_nonfinite_updates: an optimizer step whose loss, gradient or new weights hold a NaN or
                 inf is skipped (weights and AdamW state left as before it) and counted in
                 ``policies/<id>/nonfinite_skips``; this many skipped steps in a row stop the run.
    share_prompts: the update's packed rows run a prefix that several turns share (a group's
                 prompt, a system prompt) once (the same loss and gradient, less compute);
                 before the minibatches are cut, turns with the same prompt are made adjacent
                 in the shuffled order (a group that straddles a cut is split). The HF backend
                 likewise prefills each distinct prompt of a generate call once. false = every
                 turn its own path in the row, and one prefill row per sample
                 (docs/benchmarks.md).
    """

    level: str = "token"
    aggregation: str = "seq_mean"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    entropy: float = 0.0
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int = 1
    minibatch_size: int = 16
    microbatch_tokens: int | None = None
    max_nonfinite_updates: int = 3
    share_prompts: bool = True


@dataclass
class AlgoConfig(UpdateSettings):
    """The policy-gradient update: :class:`UpdateSettings` (every field documented there), plus

    name:      the preset's name (``grpo``, ``gspo``, ``dr_grpo``, ``rae``, ``marshal``); only a
               label.
    advantage: the advantage estimator, a name in the advantage registry
               (``marl.credit.advantages.register_advantage``); built in: ``grpo``
               ((r - mean) / std, Shao et al. 2024), ``dr_grpo`` (r - mean, Liu et al. 2025),
               ``rloo`` (leave-one-out), ``marshal`` (turn-level reward-to-go normalised per
               agent, Yuan et al. 2025) and ``rae`` (r - b_role, a per-role EMA baseline:
               SPIRAL, Liu et al. 2025).
    baseline_decay: ``rae``'s EMA decay alpha in ``b <- alpha b + (1 - alpha) mean(r_role)``
               (0 = the batch mean of the role; SPIRAL uses 0.95).
    """

    name: str = "grpo"
    advantage: str = "grpo"
    baseline_decay: float = 0.95

    def __post_init__(self) -> None:
        # the registries hold tensor functions: imported when a config is built, never when
        # the schema is imported (marl play / train --help load no torch; tested)
        from marl.credit.advantages import ADVANTAGES
        from marl.losses import AGGREGATIONS, POLICY_LOSSES

        if self.advantage not in ADVANTAGES:
            raise ConfigError(ADVANTAGES.unknown_message(self.advantage, key="algo.advantage"))
        if not 0.0 <= self.baseline_decay < 1.0:
            raise ConfigError(f"algo.baseline_decay: must be in [0, 1), got {self.baseline_decay}")
        if self.level not in POLICY_LOSSES:
            raise ConfigError(POLICY_LOSSES.unknown_message(self.level, key="algo.level"))
        _choice("algo.aggregation", self.aggregation, AGGREGATIONS)
        _positive("algo.clip_eps", self.clip_eps)
        if self.clip_eps_high is not None:
            _positive("algo.clip_eps_high", self.clip_eps_high)
        _positive("algo.beta", self.beta, allow_zero=True)
        _positive("algo.entropy", self.entropy, allow_zero=True)
        _positive("algo.lr", self.lr)
        _positive("algo.weight_decay", self.weight_decay, allow_zero=True)
        _positive("algo.max_grad_norm", self.max_grad_norm)
        _positive("algo.epochs", self.epochs)
        _positive("algo.minibatch_size", self.minibatch_size)
        if self.microbatch_tokens is not None:
            _positive("algo.microbatch_tokens", self.microbatch_tokens)
        _positive("algo.max_nonfinite_updates", self.max_nonfinite_updates)


MAX_EPISODES_PER_STEP = 65_536  # episodes one step (or one evaluation) plays at once


@dataclass
class CurriculumStage:
    """One stage of ``train.curriculum``: ``steps`` updates trained on the scenario with
    ``overrides`` deep-merged over ``scenario.overrides`` (``{params: {n_candidates: 2}}``)."""

    steps: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainSettings:
    """The training loop. Each step plays ``seeds_per_step`` scenario seeds x ``group_size``
    episodes (the GRPO group); ``checkpoint_every`` steps (0 = only at the end) a checkpoint is
    written under ``<run dir>/checkpoints``.

    eval_episodes: held-out scenarios played (one episode each, no update) before the first
                   update, after the last and every ``eval_every`` updates (0 = no evaluation).
                   The same seeds every time, disjoint from training's by construction
                   (``marl.runtime.seeding.HELD_OUT_SEEDS``); ``eval/*`` tags.
    eval_every:    updates between evaluations (0 = only at the start and the end).
    exploitability_every: for a scenario whose rules declare a game tree (Kuhn Poker) and
                   ``agents=llm``: score the first trainable policy exactly as a table of
                   the game (:mod:`marl.competition.exploitability_log`) before the first update,
                   after the last and every this many updates; its exploitability, NashConv and
                   chips against the Nash and random bots are logged at every step, the last
                   values repeated between scorings (``league/exploitability``,
                   ``league/nash_conv``, ``eval/chips_vs_nash``, ``eval/chips_vs_random``).
                   0 = never. None for scenarios without a tree; under Ray rollout
                   worker 0 scores the policy (backend ``hf``; skipped with another).
    curriculum:    easier versions of the scenario first: a list of stages, each
                   ``{steps: N, overrides: {...}}`` (:class:`CurriculumStage`), trained in
                   order; the steps after the last stage train the scenario as configured. The
                   held-out evaluation and every measure always play the scenario as configured
                   (the task), so a curriculum changes what is trained, never what is measured
                   (:mod:`marl.runtime.curriculum`; ``curriculum/stage`` in TensorBoard).
    """

    steps: int = 20
    seeds_per_step: int = 2
    group_size: int = 4
    checkpoint_every: int = 0
    eval_episodes: int = 0
    eval_every: int = 0
    exploitability_every: int = 5
    curriculum: list[CurriculumStage] = field(default_factory=list)

    def __post_init__(self) -> None:
        _positive("train.steps", self.steps, allow_zero=True)
        _positive("train.seeds_per_step", self.seeds_per_step)
        _positive("train.group_size", self.group_size)
        episodes = self.seeds_per_step * self.group_size
        if episodes > MAX_EPISODES_PER_STEP:  # every episode of a step is held in memory at once
            raise ConfigError(
                f"train.seeds_per_step x train.group_size: {self.seeds_per_step} x "
                f"{self.group_size} = {episodes} episodes a step, over the limit of "
                f"{MAX_EPISODES_PER_STEP} (a step holds all its episodes in memory at once)"
            )
        if self.eval_episodes > MAX_EPISODES_PER_STEP:
            raise ConfigError(
                f"train.eval_episodes: {self.eval_episodes}, over the limit of "
                f"{MAX_EPISODES_PER_STEP} (an evaluation holds its episodes in memory at once)"
            )
        _positive("train.checkpoint_every", self.checkpoint_every, allow_zero=True)
        _positive("train.eval_episodes", self.eval_episodes, allow_zero=True)
        _positive("train.eval_every", self.eval_every, allow_zero=True)
        _positive("train.exploitability_every", self.exploitability_every, allow_zero=True)
        for i, stage in enumerate(self.curriculum):
            _positive(f"train.curriculum[{i}].steps", stage.steps)
        staged = sum(stage.steps for stage in self.curriculum)
        if self.curriculum and self.steps and staged >= self.steps:  # steps 0: evaluation only
            raise ConfigError(
                f"train.curriculum: its stages take {staged} of train.steps={self.steps} "
                "updates, so the scenario as configured (what the held-out evaluation measures) "
                "would never be trained; shorten the stages or raise train.steps"
            )


@dataclass
class WarmupConfig:
    """The imitation warm-up before RL (:mod:`marl.loop.warmup`), one per trainable policy.

    steps:      supervised steps on transcripts before the first RL step (0 = no warm-up).
    bot:        the scripted bot whose play is imitated: ``format`` (the markup and message style
                with random content: teaches the protocol, not the answer), ``rule`` (also the
                answer), ``random``, or any bot registered for the scenario's rules.
    bots:       per-agent exceptions to ``bot``, agent -> bot name.
    agents:     the agents whose turns are imitated (empty = all). The others' bots still play,
                so ``bot: rule, agents: [listener]`` teaches signal's listener to pick the
                candidate it hears (the listening convention) and never trains the speaker, the
                only agent that knows the answer.
    episodes:   bot episodes played per step (each gives one turn per agent per active round).
    batch_size: turns per forward pass (gradients are accumulated over a step).
    lr:         the warm-up's own AdamW learning rate.
    data:       a JSONL transcript file to imitate instead of bots (format: marl.loop.warmup).
    """

    steps: int = 0
    bot: str = "format"
    bots: dict[str, str] = field(default_factory=dict)
    agents: list[str] = field(default_factory=list)
    episodes: int = 8
    batch_size: int = 16
    lr: float = 1e-4
    data: str | None = None

    def __post_init__(self) -> None:
        _positive("warmup.steps", self.steps, allow_zero=True)
        _positive("warmup.episodes", self.episodes)
        _positive("warmup.batch_size", self.batch_size)
        if not (self.lr == self.lr and 0 < self.lr < float("inf")):
            raise ConfigError(f"warmup.lr: must be a finite number > 0, got {self.lr}")


@dataclass
class LoggingConfig:
    """What goes to TensorBoard and the terminal. ``transcripts_every``: log a sample episode
    transcript every this many steps (0 = never); ``progress``: show a progress bar."""

    tensorboard: bool = True
    transcripts_every: int = 5
    progress: bool = True

    def __post_init__(self) -> None:
        _positive("logging.transcripts_every", self.transcripts_every, allow_zero=True)


@dataclass
class EmergenceConfig:
    """Emergent-communication metrics (``emergence/*``, :mod:`marl.analysis.emergence`,
    docs/emergence.md).

    influence_every:   measure listener influence (counterfactual re-simulation, which costs
                       generation with LLM agents) at step 0, every this many steps and at the
                       last step; 0 = never; null = every step for scripted agents, every 10
                       for LLM agents. Between measurements the last values are logged again.
    influence_samples: null-message branches per speaker and episode (>= 2).
    permutations:      label-permuted copies whose mean MI is subtracted from the speaker MI.
    counterfactuals:   the exact listening measures on held-out scenarios (CIC, influence,
                       message swap, null message: :mod:`marl.analysis.listening`), at every
                       held-out evaluation: the speaker's replies sampled per label it could
                       have had (K, default 8); 0 = off. Measured where the scenario allows
                       it (a speaker with alternative labels, a listener with a finite legal
                       set).
    listening_episodes: held-out scenarios the listening measures use (the first of the
                       evaluation's, default 16: about 30 s a measurement for SmolLM2 on a
                       laptop CPU); null = all ``train.eval_episodes``.
    listening_replies: 0 (default) scores each listener distribution exactly over the
                       scenario's listed spellings; N > 0 reads it by the scenario's parser
                       from N sampled replies, so a listener that answers in its own words
                       is measured on what the game accepts (``off_set``: what it rejects).
                       Costs N listener replies per distribution; ``bench/listening.py`` and
                       ``marl eval --replies`` read checkpoints the same way.
    """

    influence_every: int | None = None
    influence_samples: int = 2
    permutations: int = 20
    counterfactuals: int = 8
    listening_episodes: int | None = 16
    listening_replies: int = 0

    def __post_init__(self) -> None:
        if self.influence_every is not None:
            _positive("emergence.influence_every", self.influence_every, allow_zero=True)
        if self.influence_samples < 2:
            raise ConfigError(
                f"emergence.influence_samples: must be >= 2, got {self.influence_samples}"
            )
        _positive("emergence.permutations", self.permutations, allow_zero=True)
        _positive("emergence.counterfactuals", self.counterfactuals, allow_zero=True)
        if self.listening_episodes is not None:
            _positive("emergence.listening_episodes", self.listening_episodes)
        _positive("emergence.listening_replies", self.listening_replies, allow_zero=True)


@dataclass
class LeagueConfig:
    """Self-play against a league of opponents (:mod:`marl.competition.league`,
    docs/competition.md).

    Two-player scenarios only, with one trainable full-model policy that plays both seats. Each
    step draws one opponent; in each GRPO group the learner plays one seat (alternating with
    the step and the group) and the opponent the other. Only the learner's turns train.

    enabled:        false (the default) leaves training exactly as without a league.
    mix:            weight of each opponent kind (normalised; 0 = never; ``league=pool`` sets a
                    mix of all of them), a name in the opponent registry
                    (:func:`marl.opponents.register_opponent`). Built in: ``self`` (the learner
                    on both seats, both trained: plain self-play), ``latest`` (the newest
                    snapshot), ``uniform`` (a snapshot drawn uniformly from the pool),
                    ``pfsp`` (a snapshot drawn with weight ``(1 - p_win)^pfsp_power``, where
                    ``p_win`` is the learner's smoothed score against it: prioritised fictitious
                    self-play, Vinyals et al. 2019) and ``bot_<name>`` (a scripted bot of the
                    scenario, e.g. ``bot_random``, ``bot_rule``).
    pool_size:      snapshots kept (the oldest beyond it is dropped; the initial one is kept
                    while ``keep_initial``).
    snapshot_every: steps between snapshots of the learner (a frozen copy joins the pool); the
                    initial weights are the first snapshot.
    keep_initial:   never drop the initial snapshot from the pool.
    pfsp_power:     the exponent p of PFSP's weighting (larger: focus on the hardest).
    elo_k:          the K factor of the learner's online Elo (``league/elo``).
    window:         games per opponent kind that the logged win/draw/loss rates cover.
    """

    enabled: bool = False
    mix: dict[str, float] = field(default_factory=dict)
    pool_size: int = 8
    snapshot_every: int = 5
    keep_initial: bool = True
    pfsp_power: float = 1.0
    elo_k: float = 16.0
    window: int = 64

    def __post_init__(self) -> None:
        _positive("league.pool_size", self.pool_size)
        _positive("league.snapshot_every", self.snapshot_every)
        _positive("league.pfsp_power", self.pfsp_power, allow_zero=True)
        _positive("league.elo_k", self.elo_k)
        _positive("league.window", self.window)
        from marl.opponents import resolve_kind

        for kind, weight in self.mix.items():
            try:
                resolve_kind(kind)
            except ValueError as exc:
                raise ConfigError(f"league.mix.{kind}: {exc}") from None
            _positive(f"league.mix.{kind}", weight, allow_zero=True)
        if self.enabled and not any(w > 0 for w in self.mix.values()):
            raise ConfigError("league.mix: give at least one opponent kind a weight > 0")


@dataclass
class PolicyConfig:
    """One policy: what model it runs, whether it trains, and where its learner goes.

    model:     its base model; null = the run's ``model``.
    lora:      a LoRA adapter over that base (the base stays frozen); null = full fine-tuning.
               LoRA policies over the same base share ONE copy of it on the rollout side.
    trainable: false = a frozen policy (an opponent, a fixed partner): it plays, never learns,
               and gets no learner and no device of its own.
    num_gpus:  GPUs for its learner (fractions share a GPU); null = packed onto the GPUs there
               are: one each when there are enough, equal shares when there are fewer (2
               policies on 1 GPU: 0.5 each), none without GPUs. The rollout shares them.
    lr, beta, entropy: this policy's learning rate, KL weight and entropy bonus; null =
               ``algo.lr`` / ``algo.beta`` / ``algo.entropy`` (a listener that must not collapse
               early: ``policies.listener.entropy: 0.01``).
    temperature: the softmax temperature this policy samples at, in the rollout, the held-out
               evaluation, the re-simulations and the exact measures, and the one its learner's
               ratio is taken under; null = ``sampling.temperature`` (0 = greedy, as there).
               A listener that keeps exploring its answers while the speaker stays fluent:
               ``policies.listener.temperature: 1.5``.
    choice:    how it answers a turn whose reply is one action of a finite legal set and no
               message (a signal listener's pick): ``sample`` (the default) writes a reply token
               by token, as every turn; ``scored`` scores each legal answer's text after the
               prompt and samples one of them by those scores, normalised over the set (a
               listener that can never write a malformed answer and explores exactly its
               candidates: GLAM, Carta et al. 2023). Other turns are sampled either way. Needs
               ``backend: hf`` (the scores come from the model it holds).
    """

    model: ModelSpec | None = None
    lora: LoraSettings | None = None
    trainable: bool = True
    num_gpus: float | None = None
    lr: float | None = None
    beta: float | None = None
    entropy: float | None = None
    temperature: float | None = None
    choice: str = "sample"


@dataclass
class RayConfig:
    """Running on Ray: rollout worker actors, one learner actor per trainable policy.

    enabled:             false = everything in one process (the default; ``marl play`` never
                         starts Ray).
    address:             join this existing cluster (``auto``, ``ray://host:10001``,
                         ``host:6379``); null = start a local one and shut it down at the end.
                         A process that already called ``ray.init`` keeps its session.
    num_cpus, num_gpus:  the local cluster's logical CPUs / GPUs (null = detected; logical GPUs
                         on a CPU machine are for testing placement).
    num_rollout_workers: rollout worker actors; each plays whole GRPO groups.
    worker_num_cpus, worker_num_gpus: each rollout worker's request. ``worker_num_gpus: null``
                         (the default) packs the workers onto the GPUs there are together with
                         the learners whose ``num_gpus`` is null, every actor an equal share
                         (``marl.runtime.policy_map.packed_shares``; none without GPUs); a number
                         is taken as written (1 for a vLLM worker of its own).
    learner_num_cpus:    each learner's CPUs (its GPUs come from ``policies.<id>.num_gpus``).
    placement_strategy:  how the learners' placement group spreads them over nodes.
    placement_timeout_s: fail (naming the policies) if the learners cannot be placed by then.
    max_worker_restarts: replacements of dead rollout workers allowed per iteration.
    """

    enabled: bool = False
    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    num_rollout_workers: int = 1
    worker_num_cpus: float = 1.0
    worker_num_gpus: float | None = None
    learner_num_cpus: float = 1.0
    placement_strategy: str = "PACK"
    placement_timeout_s: float = 120.0
    max_worker_restarts: int = 3

    def __post_init__(self) -> None:
        _choice(
            "ray.placement_strategy",
            self.placement_strategy,
            ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
        )
        _positive("ray.num_rollout_workers", self.num_rollout_workers)
        _positive("ray.worker_num_cpus", self.worker_num_cpus, allow_zero=True)
        if self.worker_num_gpus is not None:
            _positive("ray.worker_num_gpus", self.worker_num_gpus, allow_zero=True)
        _positive("ray.learner_num_cpus", self.learner_num_cpus)
        _positive("ray.placement_timeout_s", self.placement_timeout_s)
        _positive("ray.max_worker_restarts", self.max_worker_restarts, allow_zero=True)
        for key in ("num_cpus", "num_gpus"):
            value = getattr(self, key)
            if value is not None:
                _positive(f"ray.{key}", value, allow_zero=key == "num_gpus")


@dataclass
class RuntimeSettings:
    """How this process uses the machine (:mod:`marl.runtime.threads`).

    threads: torch's CPU threads (``torch.set_num_threads``), set when ``marl train`` or
             ``marl play`` starts; null = the cores this process may use
             (``os.sched_getaffinity``), or ``OMP_NUM_THREADS`` when set. A library call of
             ``marl.loop.train.train`` applies only an explicit value. When the load average at
             start is above the core count, one line warns that the machine is oversubscribed.
             Ray actors (``ray.enabled``) each run their reserved CPUs
             (``ray.learner_num_cpus``, ``ray.worker_num_cpus``; at least 1) capped by this
             value, in torch and in OMP_NUM_THREADS / MKL_NUM_THREADS
             (:func:`marl.runtime.threads.actor_threads`).
    """

    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ConfigError(f"runtime.threads: must be a whole number >= 1, got {self.threads!r}")


@dataclass
class Config:
    """Everything ``marl play`` and ``marl train`` read.

    agents:  ``llm`` (the model plays) or ``scripted`` (the ``bot`` plays every agent).
    bot:     scripted bot name (``random`` fits every scenario; ``rule`` where one exists).
    backend: policy backend for generation, a name in the backend registry
             (:func:`marl.agents.backends.register_backend`): ``hf`` (the default) or ``vllm``
             built in, or one you registered.
    seed:    seeds every random generator; the same seed gives the same run on CPU.
    resume:  path of a checkpoint directory to continue from.
    resume_allow_scenario_change: resume a checkpoint trained on another scenario (refused
             otherwise, as a likely mistake).

    Policies (``marl.runtime.policy_map`` resolves them against the scenario's agents):
    sharing:         the policies generated for agents that ``policy_map`` leaves out:
                     ``shared`` (one policy, id ``shared``, for all of them), ``independent``
                     (one full policy per agent, id = agent name), ``lora`` (one LoRA adapter
                     per agent over the frozen ``model``, id = agent name) or ``custom`` (none:
                     ``policy_map`` must name every agent).
    policy_defaults: the settings of every generated policy (a :class:`PolicyConfig`).
    policies:        explicitly declared policies, id -> :class:`PolicyConfig`; a declared id
                     that a generated one would take wins.
    policy_map:      agent -> policy id, as RLlib's policy mapping; ``"*"``-style glob patterns
                     are allowed, an exact agent name wins over a pattern.
    ray:             the Ray runtime (:class:`RayConfig`).
    emergence:       the emergent-communication metrics (:class:`EmergenceConfig`).
    league:          self-play against a league of past snapshots and bots
                     (:class:`LeagueConfig`; off by default).
    runtime:         torch threads of this process (:class:`RuntimeSettings`).
    """

    scenario: ScenarioConfig = field(default_factory=ScenarioConfig)
    model: ModelSpec = field(default_factory=ModelSpec)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    train: TrainSettings = field(default_factory=TrainSettings)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    agents: str = "llm"
    bot: str = "rule"
    backend: str = "hf"
    seed: int = 0
    resume: str | None = None
    resume_allow_scenario_change: bool = False
    sharing: str = "shared"
    policy_defaults: PolicyConfig = field(default_factory=PolicyConfig)
    # Typed as Any so that Hydra can add a policy from the command line
    # (`+policies.opp={trainable:false}`); __post_init__ makes each a checked PolicyConfig.
    policies: dict[str, Any] = field(default_factory=dict)
    policy_map: dict[str, str] = field(default_factory=dict)
    ray: RayConfig = field(default_factory=RayConfig)
    emergence: EmergenceConfig = field(default_factory=EmergenceConfig)
    league: LeagueConfig = field(default_factory=LeagueConfig)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)

    def __post_init__(self) -> None:
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed accepts, as model.seed
            shown = str(self.seed) if len(str(self.seed)) <= 40 else f"{len(str(self.seed))} digits"
            raise ConfigError(f"seed: must be in [-2**63, 2**64), got {shown}")
        _choice("agents", self.agents, ("llm", "scripted"))
        _choice("backend", self.backend, tuple(backend_names()))
        _choice("sharing", self.sharing, SHARING_MODES)
        self.policies = {
            str(pid): _policy_config(f"policies.{pid}", value)
            for pid, value in self.policies.items()
        }
        for pid, policy in self.policies.items():
            _check_policy(f"policies.{pid}", policy)
        _check_policy("policy_defaults", self.policy_defaults)
        if self.backend != "hf":
            for key, policy in [("policy_defaults", self.policy_defaults)] + [
                (f"policies.{pid}", p) for pid, p in self.policies.items()
            ]:
                if policy.choice == "scored":
                    raise ConfigError(
                        f"{key}.choice: scored answers are scored by the model the backend "
                        f"holds; backend {self.backend!r} serves one it does not hold (use "
                        "backend=hf, or choice: sample)"
                    )
        if self.sampling.n != 1:
            raise ConfigError(
                f"sampling.n: a run samples one reply per prompt (its GRPO group is "
                f"train.group_size episodes), got {self.sampling.n}"
            )
        _check_finite("", self)  # every number the checks above do not range-check


# keys a release replaced: a config that still names one is told what to write instead
RENAMED_KEYS = {
    "algo.microbatch_size": "algo.microbatch_tokens (since issue 37: a budget of packed "
    "positions per forward pass, not a count of turns; null sizes it from free memory)",
}


def load_config(cfg: DictConfig | dict) -> Config:
    """Merge a composed Hydra config into the schema and validate it; raises ConfigError."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg = {k: v for k, v in dict(cfg).items() if k != "hydra"}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except ConfigError:
        raise
    except ValueError as exc:  # a schema's own __post_init__ check (they name their key)
        raise ConfigError(str(exc)) from None
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        reason = str(exc).splitlines()[0]
        if key in RENAMED_KEYS:
            reason = f"{reason}; it was replaced by {RENAMED_KEYS[key]}"
        raise ConfigError(f"{key}: {reason}" if key else reason) from None
