"""Emergent-communication metrics: is there a language, does it carry information, is it heard?

Everything is measured per agent (the agent as a speaker) and per directed edge ``u->v`` of the
communication graph, from finished episodes (``TextScenarioEnv`` s with their turn logs), and
logged under ``emergence/<agent>/<metric>`` and ``emergence/edges/<u>-><v>/<metric>``. The
formulas, estimators and references are in ``docs/emergence.md``; in short:

- ``message_rate``: messages delivered per *talk turn* (a round in which the agent could talk:
  the rules let it and it had at least one out-neighbour; per edge: the edge existed);
  ``length_chars`` / ``length_words``: mean length of those messages.
- ``vocab_messages`` / ``vocab_words``: distinct normalised messages / words; ``entropy``: the
  plug-in entropy (bits) of the normalised-message distribution.
- ``speaker_mi``: positive signalling (Lowe et al. 2019), I(M; S) in bits between the speaker's
  private label S (:meth:`Rules.private_label`) and the message M it *sent* in each talk turn
  (as parsed from its reply, delivered or not; silence is a message), bias-corrected by
  subtracting the mean MI of label-permuted copies; ``speaker_mi_plugin`` is the uncorrected
  plug-in value, ``speaker_mi_p`` its permutation p-value, ``speaker_mi_norm`` the corrected
  value over what a speaker that names its label every time would get on the same labels, and
  ``speaker_mi_content`` the same corrected MI between S and the *set* of content words of the
  message (:data:`STOP_WORDS` removed: free text, whose messages are rarely repeated word for
  word, and a namer that pads its messages keep their information there).
- ``influence_action`` / ``influence_return``: positive listening / causal influence (Jaques et
  al. 2019), from counterfactual re-simulation (:class:`~marl.credit.Resimulator`) with the
  speaker's messages replaced by a null message. ``influence_action`` is half the squared L2
  distance between the listener's action distribution with and without the message, estimated
  without bias from the recorded action, one fresh sample with the message and ``samples``
  samples without it; ``influence_return`` is the listener's return minus its mean return
  without the message.
- ``drift``: Jensen-Shannon divergence (bits) between the word distributions of consecutive
  logging steps.

The pure functions take plain data (:class:`TalkTurn` lists, counters, recorded episodes).
:func:`emergence_episode` reads what they need off a finished environment, in the process that
played it, into an :class:`EmergenceEpisode` (plain data that a rollout worker sends back);
:func:`emergence_metrics` computes everything from a list of those (or of finished
environments, read on the spot), and :class:`EmergenceTracker` keeps what ``marl train`` needs
between steps (previous words, the last influence values) so that every tag is logged at every
step, zeros included.
"""

from __future__ import annotations

import copy
import functools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from statistics import fmean
from typing import Any

from marl.credit.counterfactual import Generate, Resimulator
from marl.episodes import EmergenceEpisode, TalkTurn, as_emergence_episodes, normalise
from marl.runtime.resimulation import Effects, influence_effects

__all__ = [
    "INFLUENCE_METRICS",
    "STOP_WORDS",
    "EmergenceTracker",
    "content_words",
    "corrected_mutual_information",
    "aggregate_influence",
    "edge_key",
    "emergence_metrics",
    "entropy_bits",
    "js_divergence_bits",
    "listener_influence",
    "message_metrics",
    "mutual_information_bits",
    "permutation_mutual_information",
    "speaker_consistency",
    "tracker_for",
    "vocabulary_drift",
    "word_distributions",
]

SILENCE = "<silence>"  # the message of a talk turn in which nothing was sent
MESSAGE_METRICS = (
    "message_rate",
    "length_chars",
    "length_words",
    "vocab_messages",
    "vocab_words",
    "entropy",
)
CONSISTENCY_METRICS = (
    "speaker_mi",
    "speaker_mi_plugin",
    "speaker_mi_p",
    "speaker_mi_norm",
    "speaker_mi_content",
)
# the value of a metric without data, where 0 would mislead (a p-value of 0 is "significant")
EMPTY_VALUE = {"speaker_mi_p": 1.0}
STOP_WORDS = frozenset(
    """a an the this that these those it its is are was be i you we my your our me us
    to of in on at for with and or but so which one please target object""".split()
)
"""Words that ``speaker_mi_content`` drops: articles, pronouns, copulas, prepositions,
conjunctions and the politeness and task words a speaker pads a name with ("the target is the
red one, please"). Kept short on purpose: a word that can name something (a colour, a
shape, a number, "left") must never be here. Fixed, so runs stay comparable."""
INFLUENCE_METRICS = ("influence_action", "influence_return")
PREFIX = "emergence/"


# --- plain data -------------------------------------------------------------------------------
def edge_key(sender: str, receiver: str) -> str:
    """The key of a directed edge in metric names: ``edges/<u>-><v>``."""
    return f"edges/{sender}->{receiver}"


def content_words(texts: Iterable[str]) -> frozenset[str]:
    """The content of a turn's messages: the set of their normalised words minus
    :data:`STOP_WORDS` (order and repeats do not count). Silence (no text at all) is
    ``{SILENCE}``, told apart from a message of stop words only (the empty set)."""
    texts = list(texts)
    if not texts:
        return frozenset((SILENCE,))
    return frozenset(w for t in texts for w in normalise(t).split() if w not in STOP_WORDS)


def _keys(turns: Iterable[TalkTurn]) -> Iterable[tuple[str, TalkTurn, str | None]]:
    """Each talk turn under its agent key, and under each edge it could use."""
    for turn in turns:
        yield turn.agent, turn, None
        for v in turn.neighbours:
            yield edge_key(turn.agent, v), turn, v


# --- estimators -------------------------------------------------------------------------------
def entropy_bits(counts: Iterable[int]) -> float:
    """Plug-in Shannon entropy, in bits, of a histogram (0 for an empty one)."""
    counts = [c for c in counts if c > 0]
    total = sum(counts)
    if not total:
        return 0.0
    return -sum(c / total * math.log2(c / total) for c in counts)


def mutual_information_bits(pairs: Sequence[tuple[Hashable, Hashable]]) -> float:
    """Plug-in mutual information I(X; Y) = H(X) + H(Y) - H(X, Y), in bits, of (x, y) samples."""
    if not pairs:
        return 0.0
    xs = Counter(x for x, _ in pairs)
    ys = Counter(y for _, y in pairs)
    joint = Counter(pairs)
    return max(
        entropy_bits(xs.values()) + entropy_bits(ys.values()) - entropy_bits(joint.values()),
        0.0,
    )


def permutation_mutual_information(
    pairs: Sequence[tuple[Hashable, Hashable]], permutations: int = 20, seed: int = 0
) -> tuple[float, float, float]:
    """``(corrected, plugin, p)``: the plug-in MI in bits, the MI corrected by the mean MI of
    ``permutations`` copies with the x's shuffled (the MI that chance alone gives at this
    sample size and these marginals), and the permutation p-value of the plug-in MI,
    ``(1 + #{null MI >= plugin}) / (1 + permutations)`` (Phipson & Smyth 2010: never 0, and
    exact for a test at that level). Corrected is about 0 when X and Y are independent and may
    dip below 0. Without permutations or with fewer than 2 samples: ``(plugin, plugin, 1)``.
    """
    xs = [x for x, _ in pairs]
    ys = [y for _, y in pairs]
    plugin = mutual_information_bits(list(zip(xs, ys)))
    if permutations <= 0 or len(pairs) < 2:
        return plugin, plugin, 1.0
    rng = random.Random(seed)
    null = []
    for _ in range(permutations):
        rng.shuffle(xs)
        null.append(mutual_information_bits(list(zip(xs, ys))))
    # a shuffle that keeps the joint histogram gives the same MI up to rounding: a tie counts
    exceed = sum(m >= plugin - 1e-12 for m in null)
    return plugin - fmean(null), plugin, (1 + exceed) / (1 + permutations)


def corrected_mutual_information(
    pairs: Sequence[tuple[Hashable, Hashable]], permutations: int = 20, seed: int = 0
) -> tuple[float, float]:
    """``(corrected, plugin)`` of :func:`permutation_mutual_information`."""
    corrected, plugin, _ = permutation_mutual_information(pairs, permutations, seed)
    return corrected, plugin


def js_divergence_bits(p: Mapping[Hashable, float], q: Mapping[Hashable, float]) -> float:
    """Jensen-Shannon divergence in bits (0..1) of two histograms (normalised here). Two empty
    histograms are equal (0); an empty one against a non-empty one is maximally apart (1)."""
    total_p, total_q = sum(p.values()), sum(q.values())
    if not total_p and not total_q:
        return 0.0
    if not total_p or not total_q:
        return 1.0
    value = 0.0
    for key in set(p) | set(q):
        a, b = p.get(key, 0) / total_p, q.get(key, 0) / total_q
        m = (a + b) / 2
        if a:
            value += a / 2 * math.log2(a / m)
        if b:
            value += b / 2 * math.log2(b / m)
    return min(max(value, 0.0), 1.0)


# --- message statistics -----------------------------------------------------------------------
def message_metrics(turns: Sequence[TalkTurn]) -> dict[str, float]:
    """Rate, length, vocabulary and entropy per agent and per edge, as ``{"<key>/<metric>"}``.

    Keys that had talk turns but sent nothing get zeros."""
    talk: Counter[str] = Counter()
    texts: dict[str, list[str]] = defaultdict(list)
    for key, turn, receiver in _keys(turns):
        talk[key] += 1
        texts[key] += turn.texts_to(receiver)
    out: dict[str, float] = {}
    for key in talk:
        sent = texts[key]
        norm = [normalise(t) for t in sent]
        words = [w for n in norm for w in n.split()]
        out[f"{key}/message_rate"] = len(sent) / talk[key]
        out[f"{key}/length_chars"] = fmean(len(t) for t in sent) if sent else 0.0
        out[f"{key}/length_words"] = fmean(len(n.split()) for n in norm) if sent else 0.0
        out[f"{key}/vocab_messages"] = float(len(set(norm)))
        out[f"{key}/vocab_words"] = float(len(set(words)))
        out[f"{key}/entropy"] = entropy_bits(Counter(norm).values())
    return out


def speaker_consistency(
    turns: Sequence[TalkTurn], permutations: int = 20, seed: int = 0
) -> dict[str, float]:
    """Positive signalling: I(M; S) per agent and per edge, over the talk turns of agents with a
    private label, from what each turn *sent* (:attr:`TalkTurn.sent`: a message into a cut edge
    counts). M is the turn's normalised messages (addressed to that receiver, for an edge),
    joined; ``SILENCE`` when nothing was sent. Per key:

    - ``speaker_mi``, ``speaker_mi_plugin``, ``speaker_mi_p``: the corrected and plug-in MI and
      the permutation p-value (:func:`permutation_mutual_information`);
    - ``speaker_mi_norm``: the corrected value over its ceiling, the corrected MI of the labels
      with themselves (a speaker whose message always names its label scores 1);
    - ``speaker_mi_content``: the corrected I(C; S) with C the turn's :func:`content_words`, a
      set, so that filler, word order and repeats change nothing: a perfect namer scores the
      same at any message length.

    Keys without labelled turns get zeros (and p = 1)."""
    samples: dict[str, list[tuple[str, str]]] = defaultdict(list)
    contents: dict[str, list[tuple[str, frozenset[str]]]] = defaultdict(list)
    for key, turn, receiver in _keys(turns):
        samples.setdefault(key, [])
        contents.setdefault(key, [])
        if turn.label is None:
            continue
        texts = turn.texts_sent(receiver)
        samples[key].append((turn.label, " | ".join(normalise(t) for t in texts) or SILENCE))
        contents[key].append((turn.label, content_words(texts)))
    out: dict[str, float] = {}
    for key, pairs in sorted(samples.items()):  # one seed for all: equal data, equal values
        out[f"{key}/speaker_mi_content"], _ = corrected_mutual_information(
            contents[key], permutations, seed
        )
        corrected, plugin, p = permutation_mutual_information(pairs, permutations, seed)
        # what a speaker whose every message names its label would score on these labels
        ceiling, _ = corrected_mutual_information([(s, s) for s, _ in pairs], permutations, seed)
        out[f"{key}/speaker_mi"] = corrected
        out[f"{key}/speaker_mi_plugin"] = plugin
        out[f"{key}/speaker_mi_p"] = p
        out[f"{key}/speaker_mi_norm"] = corrected / ceiling if ceiling > 1e-12 else 0.0
    return out


def word_distributions(turns: Sequence[TalkTurn]) -> dict[str, Counter[str]]:
    """The words each agent (and each edge) sent, counted (an empty counter for silence)."""
    out: dict[str, Counter[str]] = {}
    for key, turn, receiver in _keys(turns):
        counter = out.setdefault(key, Counter())
        for text in turn.texts_to(receiver):
            counter.update(normalise(text).split())
    return out


def vocabulary_drift(
    previous: Mapping[str, Mapping[str, float]], current: Mapping[str, Mapping[str, float]]
) -> dict[str, float]:
    """``<key>/drift``: JS divergence between the previous and current word distributions of
    every key in ``current`` (0 for a key seen for the first time)."""
    return {
        f"{key}/drift": js_divergence_bits(previous[key], words) if key in previous else 0.0
        for key, words in current.items()
    }


# --- listener influence -----------------------------------------------------------------------
def listener_influence(
    episodes: Sequence[Any],
    engine: Resimulator,
    generate: Generate,
    samples: int = 2,
) -> dict[str, float]:
    """Causal influence of every speaker on every listener it reached, per edge and per agent:
    :func:`aggregate_influence` of :func:`influence_effects`.

    ``episodes`` are :class:`EmergenceEpisode` s (or finished environments). For each episode
    and each agent u that delivered a message, ``samples`` branches replay the
    episode with all of u's messages replaced by nothing (null). For each listener v of u:

    - ``influence_return``: v's recorded return minus its mean return over the null branches;
    - ``influence_action``: :func:`discrete_energy` between v's action in its first acting round
      after u's first message (the recorded one plus one fresh sample from the same prompt,
      asked of ``generate``) and v's action in that round of each null branch.

    Each edge u->v averages over the episodes where the edge existed (an episode in which u sent
    v nothing, or v never acted after it, counts 0); the agent key averages over all its edges.
    """
    data = as_emergence_episodes(episodes)
    return aggregate_influence(data, influence_effects(data, engine, generate, samples))


def aggregate_influence(
    episodes: Sequence[EmergenceEpisode], effects: Sequence[Effects]
) -> dict[str, float]:
    """``<key>/influence_action`` and ``<key>/influence_return`` per edge and per agent: each
    edge averages over the episodes in which it existed (0 where nothing was measured), each
    agent over all its edges."""
    if len(effects) != len(episodes):
        raise ValueError(f"influence: {len(effects)} effects for {len(episodes)} episodes")
    totals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for ep, mine in zip(episodes, effects):
        for u, v in ep.edges:
            effect = mine.get((u, v), (0.0, 0.0))
            totals[edge_key(u, v)].append(effect)
            totals[u].append(effect)
    out: dict[str, float] = {}
    for key, values in totals.items():
        out[f"{key}/influence_action"] = fmean(a for a, _ in values)
        out[f"{key}/influence_return"] = fmean(r for _, r in values)
    return out


# --- everything at once -----------------------------------------------------------------------
def _all_keys(episodes: Sequence[EmergenceEpisode]) -> set[str]:
    """Every agent and every edge key of these episodes."""
    keys: set[str] = set()
    for ep in episodes:
        keys.update(ep.agents)
        keys.update(edge_key(u, v) for u, v in ep.edges)
    return keys


def emergence_metrics(
    envs: Sequence[Any],
    *,
    generate: Generate | None = None,
    env_factory: Callable[[], Any] | None = None,
    engine: Resimulator | None = None,
    influence_samples: int = 2,
    permutations: int = 20,
    seed: int = 0,
    previous_words: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, float]:
    """Every emergence metric of a list of finished episodes, as ``emergence/...`` scalars.

    ``envs`` are :class:`EmergenceEpisode` s (what a rollout sends back) or finished
    environments.

    Influence is measured when ``generate`` is given (scripted bots:
    ``marl.credit.responders.bot_generate(get_bot(rules, "rule"))``; LLM policies:
    :func:`marl.runtime.resimulation.backend_generate`), re-simulating through ``engine`` (its
    ``generate`` is set to ``generate``) or a new :class:`Resimulator` over environments from
    ``env_factory`` (default: deep copies of ``envs[0]``). Drift is measured against
    ``previous_words`` (a :func:`word_distributions` result) when given. Every agent and every
    edge gets every metric measured, zeros included.
    """
    return _measure(
        envs, generate, env_factory, engine, influence_samples, permutations, seed, previous_words
    )[0]


def _measure(
    envs: Sequence[Any],
    generate: Generate | None,
    env_factory: Callable[[], Any] | None,
    engine: Resimulator | None,
    influence_samples: int,
    permutations: int,
    seed: int,
    previous_words: Mapping[str, Mapping[str, float]] | None,
    effects: Sequence[Effects] | None = None,
) -> tuple[dict[str, float], dict[str, Counter[str]]]:
    """:func:`emergence_metrics` plus this step's word distributions (for the next drift).
    ``effects``: influence measured elsewhere (by the rollout workers), used as it is."""
    episodes = as_emergence_episodes(envs)
    turns = [replace(t, episode=i) for i, ep in enumerate(episodes) for t in ep.talk]
    words = word_distributions(turns)
    if not episodes:
        return {}, words
    values = message_metrics(turns)
    values.update(speaker_consistency(turns, permutations, seed))
    if previous_words is not None:
        values.update(vocabulary_drift(previous_words, words))
    if generate is not None:
        if engine is None:
            if env_factory is None and not isinstance(envs[0], EmergenceEpisode):
                env_factory = functools.partial(copy.deepcopy, envs[0])
            if env_factory is None:
                raise ValueError(
                    "emergence influence re-simulates episodes: pass env_factory= or engine= "
                    "with episodes given as data"
                )
            engine = Resimulator(None, generate, env_factory=env_factory)
        engine.generate = generate
        values.update(listener_influence(episodes, engine, generate, influence_samples))
    elif effects is not None:
        values.update(aggregate_influence(episodes, effects))
    metrics = [*MESSAGE_METRICS, *CONSISTENCY_METRICS]
    metrics += ["drift"] if previous_words is not None else []
    measured = generate is not None or effects is not None
    metrics += list(INFLUENCE_METRICS) if measured else []
    scalars = {
        f"{PREFIX}{key}/{name}": float(values.get(f"{key}/{name}", EMPTY_VALUE.get(name, 0.0)))
        for key in sorted(_all_keys(episodes))
        for name in metrics
    }
    return scalars, words


InfluenceFn = Callable[[int, Sequence[EmergenceEpisode]], Sequence[Effects]]
"""``(step, episodes) -> each episode's influence effects``: how ``marl train`` measures
influence, on the rollout workers that hold the environments (``runtime.influence``)."""


class EmergenceTracker:
    """The emergence metrics of each training step, with what they need between steps.

    env_factory:    builds an environment of the scenario, for influence measured here.
    generate_for:   step -> the batched ``generate`` for influence measured here at that step.
    influence_for:  measures influence elsewhere instead (:data:`InfluenceFn`); with neither,
                    influence is never measured.
    influence_every: measure influence at step 0, every this many steps and at the last
                    step (0: never). Between measurements the last values are logged again,
                    and ``emergence/influence_fresh`` says whether this step measured (1) or not.
    Every key once logged is logged at every later step (0 when it had no data this step).
    """

    def __init__(
        self,
        env_factory: Callable[[], Any] | None,
        generate_for: Callable[[int], Generate] | None,
        *,
        influence_for: InfluenceFn | None = None,
        influence_every: int = 1,
        influence_samples: int = 2,
        permutations: int = 20,
        seed: int = 0,
        total_steps: int | None = None,
    ) -> None:
        self.env_factory = env_factory
        self.generate_for = generate_for
        self.influence_for = influence_for
        self.influence_every = influence_every
        self.influence_samples = influence_samples
        self.permutations = permutations
        self.seed = seed
        self.total_steps = total_steps
        self.engine: Resimulator | None = None
        self.words: dict[str, dict[str, float]] | None = None
        self.last: dict[str, float] = {}

    def measures_influence(self, step: int) -> bool:
        """Whether influence is measured at ``step`` (0-based)."""
        n = self.influence_every
        if (self.generate_for is None and self.influence_for is None) or n <= 0:
            return False
        return step % n == 0 or (self.total_steps is not None and step + 1 == self.total_steps)

    def step(self, envs: Sequence[Any], step: int) -> dict[str, float]:
        """The ``emergence/...`` scalars of one step's finished episodes
        (:class:`EmergenceEpisode` s, or finished environments)."""
        envs = as_emergence_episodes(envs)
        generate = None
        effects = None
        if self.measures_influence(step) and self.influence_for is not None:
            effects = list(self.influence_for(step, envs))
        elif self.measures_influence(step):
            assert self.generate_for is not None and self.env_factory is not None
            generate = self.generate_for(step)
            if self.engine is None:
                self.engine = Resimulator(None, generate, env_factory=self.env_factory)
        values, words = _measure(
            envs,
            generate,
            None,
            self.engine,
            self.influence_samples,
            self.permutations,
            self.seed * 1_000_003 + step,
            self.words or {},
            effects,
        )
        self.words = {k: dict(c) for k, c in words.items()}
        measured = generate is not None or effects is not None
        if not measured:  # not measured this step (or never): the last values, else 0
            for key in _all_keys(envs):
                for name in INFLUENCE_METRICS:
                    tag = f"{PREFIX}{key}/{name}"
                    values[tag] = self.last.get(tag, 0.0)
        for tag in self.last:  # a tag logged before but without data now: 0, never a gap
            values.setdefault(tag, 0.0)
        values[f"{PREFIX}influence_fresh"] = 1.0 if measured else 0.0
        self.last = dict(values)
        return values

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that a resumed run logs what an unbroken one would."""
        return {"words": self.words, "last": dict(self.last)}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (``None``: a checkpoint written before emergence metrics)."""
        if state:
            self.words = state.get("words")
            self.last = dict(state.get("last") or {})


def tracker_for(config: Any, influence_for: InfluenceFn | None) -> EmergenceTracker:
    """The tracker ``marl train`` uses for ``config`` (a :class:`marl.config.Config`).

    Influence is measured by ``influence_for`` (the runtime's ``influence``: each rollout worker
    re-simulates the episodes it played), by default at every step for scripted agents and
    every 10 steps for LLM agents (``emergence.influence_every``), and never under a league.
    """
    e = config.emergence
    default = 1 if config.agents == "scripted" else 10
    league = getattr(config, "league", None)
    if league is not None and league.enabled:
        default = 0  # re-simulation knows the run's policy map, not the league's opponents
    return EmergenceTracker(
        None,
        None,
        influence_for=influence_for,
        influence_every=default if e.influence_every is None else e.influence_every,
        influence_samples=e.influence_samples,
        permutations=e.permutations,
        seed=config.seed,
        total_steps=config.train.steps,
    )
