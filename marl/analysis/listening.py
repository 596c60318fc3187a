"""Positive listening measured exactly, and interventions on the message: CIC, influence, swap,
null.

For a speaker -> listener pair of a cooperative scenario whose listener acts from a finite legal
set (:meth:`marl.scenarios.rules.Rules.legal_actions`: signal's candidates), on held-out
scenarios (one per seed), with the policies held fixed (no update in between):

1. the speaker's messages are sampled from its own policy: ``K`` replies in all
   (``counterfactuals``, default 8), ``ceil(K / L)`` for each of the ``L`` private labels it
   could have had in this scenario (stratified)
   (:meth:`~marl.scenarios.rules.Rules.alternative_labels`: signal's target could be any of
   the listener's candidates, drawn uniformly), each from the prompt the rollout would give it
   with that label (:meth:`~marl.scenarios.rules.Rules.set_private_label`). Together they are
   draws of ``p(m | s)``, ``s`` being what the listener sees (its candidates): the messages the
   listener can receive in its situation, as often as the speaker sends them;
2. for each distinct message ``m``, the episode is played to the listener's turn with the
   speaker's reply replaced by ``m`` (``do(m)``), and the listener's action distribution
   ``p(a | do(m))`` is computed exactly: each legal reply text scored teacher-forced
   (:func:`marl.agents.action_scores.action_scores`, each distinct prompt once), normalised
   over the set, and the texts of one action summed (signal-v1: a candidate's number and name);
3. per scenario, with ``q(a) = sum_m p(m | s) p(a | do(m))`` the listener's marginal:

   - ``cic`` = ``sum_m p(m | s) KL(p(. | do(m)) || q)``, in bits: the causal influence of
     communication of Lowe et al. 2019 ("On the pitfalls of measuring emergent
     communication"), the mutual information between message and action under intervention;
     at most log2 of the number of actions (2 bits for 4 candidates), reached by a speaker
     that names each target distinctly and a listener that follows;
   - ``cic_given_target``: the same with ``s`` including the speaker's real target (its K
     replies to that target alone); 0 for a speaker that always says the same thing about one
     target, however well it is heard: a measure of message variety, not of listening;
   - ``influence`` = ``KL(p(. | do(m_1)) || q)`` for the message ``m_1`` actually sent (the
     first reply to the real target): the causal influence of Jaques et al. 2019 ("Social
     influence as intrinsic motivation for multi-agent deep RL"), whose mean over the messages
     is the CIC;
   - ``success`` = ``p(target | do(m_1))``: the exact probability that the listener picks the
     target, given the sent message;
   - ``null_success`` = ``p(target | no message)``: the speaker's reply replaced by one with
     no SAY line (the listener's inbox empty);
   - ``swap_follow`` / ``swap_success``: the listener given the sent message of another held-out
     scenario whose target is one of this scenario's other candidates; the probability that it
     picks that other target (follows the message) / this scenario's target. Scenarios with no
     such donor are left out of the swap;
   - ``off_set``: the listener's probability of a reply that is none of the scored texts,
     given the sent message. The scored texts of an action are every spelling of it that the
     scenario's parser accepts among the common variants (case, a full stop, ``the red
     circle``: :func:`marl.scenarios.spellings.accepted_texts`), so ``off_set`` is the mass on
     malformed replies and rarer spellings: an upper bound on what the parser rejects.

**Read by the parser** (``listener_replies``, ``replies`` = R): each distribution ``p(a | do(m))``
is estimated instead from R replies sampled from the listener's own policy, each read as the
scenario reads a reply (:meth:`marl.scenarios.base.TextScenarioEnv.read_action`: the markup, the
lenient fallback, the rules' parser). Every reply the parser accepts is then scored, however the
listener words it (signal's parser accepts any reply that names exactly one candidate: an
infinite set no list of spellings covers), and ``off_set`` is the fraction the parser rejects.
The price is sampling noise: each ``p(a | do(m))`` is a frequency out of R, and the CIC, a
plug-in mutual information, is biased upwards by about ``(A - 1)(M - 1) / (2 N ln 2)`` bits for
``A`` actions, ``M`` distinct messages and ``N`` replies the parser accepted in the scenario
(Miller 1955), so a listener that ignores the message reads above 0, the more so the fewer of
its replies the parser accepts (with 8 distinct messages, 4 actions and 4 accepted replies a
message, about 0.5 bits). A run whose exact ``off_set`` is
flagged is read this way.

Each value is reported as the mean over scenarios with a 95% t-interval over scenarios
(:func:`marl.analysis.stats.mean_interval`), clipped to the measure's range (:data:`BOUNDS`:
a probability's interval stops at 0 and 1, a divergence's at 0, and a CIC's at the mean of
``log2`` of the scenarios' action counts, which no mutual information with the action passes:
2 bits for signal's four candidates). A pair whose mean ``off_set``
is above 0.5 (:data:`OFF_SET_LIMIT`) is flagged: ``eval/listening/off_set_flag`` is 1 and the
printed line says so, since its normalised distributions then describe replies the listener
rarely writes; across training runs, report the mean of per-run means
with a t-interval over runs (:func:`marl.analysis.stats.seed_clustered`).

The speaker's message is measured as it is delivered: with the edge cut (a control), the
listener never receives any ``m`` and the CIC is 0 by measurement, not by construction.

Limits: the listener must be idle until the speaker has talked (signal: round 0 is the
speaker's), and its acting turn must offer a finite legal set; anything else is refused with
one line naming the scenario.
"""

from __future__ import annotations

import copy
import functools
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marl.agents.backends.base import SamplingConfig
from marl.agents.generation import sample_in_batches
from marl.errors import RunError

__all__ = [
    "LISTENING_METRICS",
    "ListeningResult",
    "Scorer",
    "Sampler",
    "kl_bits",
    "listening_per_scenario",
]

LISTENING_METRICS = (
    "cic",
    "cic_given_target",
    "influence",
    "success",
    "null_success",
    "swap_follow",
    "swap_success",
    "off_set",
)
NULL_REPLY = "ACTION: wait"  # a speaker's reply with no SAY line: nothing is sent
# Each measure's range: a t-interval is clipped to it (a probability's interval never passes 1,
# a divergence's never goes below 0). The CICs' upper bound is the scenarios' own (the mean
# log2 of their action counts, ListeningResult.bits_ceiling); influence has none.
BOUNDS = {
    "cic": (0.0, math.inf),
    "cic_given_target": (0.0, math.inf),
    "influence": (0.0, math.inf),
    "success": (0.0, 1.0),
    "null_success": (0.0, 1.0),
    "swap_follow": (0.0, 1.0),
    "swap_success": (0.0, 1.0),
    "off_set": (0.0, 1.0),
}
CIC_METRICS = ("cic", "cic_given_target")


def measure_range(name: str, bits_ceiling: float = math.inf) -> tuple[float, float]:
    """The range a measure's interval is clipped to: :data:`BOUNDS` (unbounded for a name not
    there), a CIC's top lowered to ``bits_ceiling``: no mutual information with the action
    passes ``log2`` of the actions."""
    lo, hi = BOUNDS.get(name, (-math.inf, math.inf))
    return (lo, min(hi, bits_ceiling)) if name in CIC_METRICS else (lo, hi)


OFF_SET_LIMIT = 0.5
"""Above this mean off-set mass, the listener mostly writes replies that are none of the scored
texts: its normalised distributions describe replies it rarely writes, and every measure of the
pair is flagged (``eval/listening/off_set_flag`` = 1, and in the printed line)."""

Sampler = Callable[[Sequence[Any], int], list[list[str]]]
"""``(requests, k) -> k reply texts per request``: the speaker's policy, sampled
(:class:`marl.agents.generation.PromptRequest` s, head included in each text)."""

Scorer = Callable[[Sequence[Any], Sequence[Sequence[str]]], tuple[list[list[float]], list[float]]]
"""``(requests, texts) -> (probabilities, off-set mass)``: the listener's exact distribution
over each request's reply texts (each a full reply, ``"ACTION: 2"``), normalised per request,
and the mass on no listed text."""


def kl_bits(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """KL(p || q) in bits over the keys of ``p`` (``q`` must cover ``p``'s support)."""
    total = 0.0
    for key, pk in p.items():
        if pk > 0.0:
            qk = q.get(key, 0.0)
            if qk <= 0.0:
                return math.inf
            total += pk * math.log2(pk / qk)
    return max(total, 0.0)


@dataclass
class _Scenario:
    """One held-out scenario while it is measured."""

    seed: int
    env: Any  # reset, before anyone acted
    label: str  # the speaker's private label: the target
    labels: list[str]  # the labels the speaker could have had here (the listener cannot tell)
    sent: list[str] = field(default_factory=list)  # replies to the real label; [0] is sent
    others: dict[str, list[str]] = field(default_factory=dict)  # replies per other label
    donor: int | None = None  # the scenario whose sent message is swapped in

    def messages(self) -> list[str]:
        """Every sampled reply, as many per possible label: draws of p(m | the listener's
        view)."""
        return [
            *self.sent,
            *(
                m
                for label in self.labels
                if label != self.label
                for m in self.others.get(label, [])
            ),
        ]


@dataclass(frozen=True)
class ListeningResult:
    """Per-scenario values (``per_scenario[metric]``: one float per measured scenario, NaN
    where a metric is undefined for it) and their summary."""

    per_scenario: dict[str, list[float]]
    seeds: tuple[int, ...]
    counterfactuals: int
    bits_ceiling: float = math.inf  # the mean over scenarios of log2(the listener's actions)
    replies: int = 0  # 0: exact; else each distribution read by the parser from this many replies

    def summary(self) -> dict[str, dict[str, float]]:
        """``{metric: {"mean", "low", "high", "n"}}`` with 95% t-intervals over scenarios,
        clipped to the measure's range (:data:`BOUNDS`)."""
        from marl.analysis.stats import mean_interval

        out = {}
        for name, values in self.per_scenario.items():
            finite = [v for v in values if not math.isnan(v)]
            if not finite:
                continue
            mean, low, high = mean_interval(finite)
            lo, hi = measure_range(name, self.bits_ceiling)
            if not math.isnan(low):
                low, high = max(low, lo), min(high, hi)
            out[name] = {"mean": mean, "low": low, "high": high, "n": float(len(finite))}
        return out

    def off_set_exceeded(self) -> bool:
        """Whether the listener's mean off-set mass is above :data:`OFF_SET_LIMIT`."""
        off = self.summary().get("off_set")
        return off is not None and off["mean"] > OFF_SET_LIMIT

    def scalars(self, prefix: str = "eval/listening/") -> dict[str, float]:
        """The means as TensorBoard scalars (``<prefix><metric>``), with ``_low``/``_high``,
        and ``<prefix>off_set_flag``: 1 when the off-set mass is above :data:`OFF_SET_LIMIT`
        (logged every time, 0 included)."""
        out: dict[str, float] = {}
        for name, s in self.summary().items():
            out[f"{prefix}{name}"] = s["mean"]
            out[f"{prefix}{name}_low"] = s["low"]
            out[f"{prefix}{name}_high"] = s["high"]
        out[f"{prefix}off_set_flag"] = float(self.off_set_exceeded())
        return out


def _pair(env: Any, speaker: str | None, listener: str | None) -> tuple[str, str]:
    agents = list(env.possible_agents)
    speaker = speaker or agents[0]
    listener = listener or agents[1 if len(agents) > 1 else 0]
    for role, name in (("speaker", speaker), ("listener", listener)):
        if name not in agents:
            raise RunError(
                f"listening: {role} {name!r} is not an agent of {env.spec.name!r} "
                f"(agents: {', '.join(agents)})"
            )
    return speaker, listener


def _request(env: Any, agent: str, n: int = 1) -> Any:
    """``agent``'s prompt request in ``env``'s current round (``n`` replies)."""
    from marl.agents.generation import PromptRequest

    observations, infos = env.observe()
    return PromptRequest(agent, env.system_prompt(agent), observations[agent], infos[agent], n)


def _listener_turn(
    env: Any, speaker: str, listener: str, speaker_reply: str, spellings: bool = True
) -> tuple[Any, Any, dict[str, str]]:
    """Play a copy of ``env`` (reset) with the speaker's first reply replaced by
    ``speaker_reply`` until the listener must act: that copy, the listener's request and its
    legal texts (every spelling its parser reads; the canonical texts alone without
    ``spellings``)."""
    from marl.protocols.markup import IDLE_REPLY
    from marl.scenarios.spellings import accepted_texts

    env = copy.deepcopy(env)
    for _ in range(64):  # a scenario's rounds are few; a runaway loop is a bug
        if not env.agents:
            break
        if listener in env.agents and not env.is_idle(listener):
            legal = (  # every spelling its parser reads, or the texts a scored choice picks from
                accepted_texts(env.rules, listener)
                if spellings
                else env.rules.legal_actions(listener)
            )
            if not legal:
                raise RunError(
                    f"listening: {listener!r} in {env.spec.name!r} acts from open text (its "
                    "rules give no legal_actions), so its distribution cannot be computed "
                    "exactly"
                )
            return env, _request(env, listener), legal
        replies = {}
        for agent in env.agents:
            if env.is_idle(agent):
                replies[agent] = IDLE_REPLY
            elif agent == speaker and env.round == 0:
                replies[agent] = speaker_reply
            else:
                raise RunError(
                    f"listening: {agent!r} in {env.spec.name!r} acts in round {env.round} "
                    f"before {listener!r} does; the measure needs a speaker who talks in round "
                    "0 and a listener who acts next"
                )
        env.step(replies)
    raise RunError(f"listening: {listener!r} never acts in {env.spec.name!r}")


def listening_per_scenario(
    env_factory: Callable[[], Any],
    seeds: Sequence[int],
    sample: Sampler,
    score: Scorer | None,
    *,
    counterfactuals: int = 8,
    speaker: str | None = None,
    listener: str | None = None,
    swap_seed: int = 0,
    listener_replies: Sampler | None = None,
    replies: int = 32,
    spellings: bool = True,
) -> ListeningResult:
    """Measure every metric of the module docstring on the scenarios of ``seeds``.

    ``env_factory`` builds the scenario's environment; ``sample`` draws the speaker's replies,
    ``score`` the listener's exact distribution (:func:`marl.agents.generation.reply_sampler`
    and :func:`hf_scorer` build them from policies). ``speaker`` / ``listener``: agent names
    (default: the first two agents). ``counterfactuals``: K, the speaker's replies sampled per
    scenario, spread evenly over its possible labels (at least one each).
    ``swap_seed`` picks the donors of the swap. ``listener_replies``: the listener's sampler;
    when given, every distribution is read by the parser from ``replies`` sampled replies (the
    module docstring) and ``score`` is not used. ``spellings=False``: the listener's
    distributions are over its canonical legal texts only, the set a listener that chooses by
    score (``policies.<id>.choice: scored``) draws from; give it a scorer built with
    ``hf_scorer(..., scored=True)``.
    """
    if listener_replies is None and score is None:
        raise RunError("listening: give a scorer (exact) or the listener's sampler (parsed)")
    if listener_replies is not None and replies < 1:
        raise RunError(f"listening: replies must be >= 1, got {replies}")
    if counterfactuals < 1:
        raise RunError(f"listening: counterfactuals must be >= 1, got {counterfactuals}")
    if not seeds:
        raise RunError("listening: no held-out scenarios to measure (seeds is empty)")
    scenarios: list[_Scenario] = []
    requests, owners = [], []
    label_counts: list[list[str]] = []
    for seed in seeds:
        env = env_factory()
        env.reset(seed=seed)
        speaker, listener = _pair(env, speaker, listener)
        label = env.rules.private_label(speaker)
        if label is None:
            raise RunError(
                f"listening: {speaker!r} in {env.spec.name!r} has no private label (the target)"
            )
        labels = list(env.rules.alternative_labels(speaker)) or [label]
        label_counts.append(labels)
        sc = _Scenario(seed, env, label, labels)
        scenarios.append(sc)
        for other in labels:
            counterfactual = env
            if other != label:
                counterfactual = copy.deepcopy(env)
                counterfactual.rules.set_private_label(speaker, other)
            requests.append(_request(counterfactual, speaker))
            owners.append((sc, other))
    assert speaker is not None and listener is not None
    per_label = max(math.ceil(counterfactuals / len(labels)) for labels in label_counts)
    for (sc, label), drawn in zip(owners, sample(requests, per_label)):
        if label == sc.label:
            sc.sent = list(drawn)
        else:
            sc.others[label] = list(drawn)
    _choose_donors(scenarios, speaker, listener, swap_seed)
    rows: dict[tuple[int, str], int] = {}  # (scenario, speaker reply) -> scored row
    row_envs, row_requests, row_texts, row_meaning = [], [], [], []

    def add(i: int, reply: str) -> None:
        if (i, reply) in rows:
            return
        env, request, legal = _listener_turn(scenarios[i].env, speaker, listener, reply, spellings)
        rows[(i, reply)] = len(row_requests)
        row_envs.append(env)
        row_requests.append(request)
        texts = list(legal)
        row_texts.append([f"ACTION: {t}" for t in texts])
        row_meaning.append([legal[t] for t in texts])

    for i, sc in enumerate(scenarios):
        for reply in dict.fromkeys(sc.messages()):
            add(i, reply)
        add(i, NULL_REPLY)
        if sc.donor is not None:
            add(i, scenarios[sc.donor].sent[0])
    if listener_replies is not None:
        sampled = sample_in_batches(listener_replies, row_requests, replies)
        probs, off = _read_replies(sampled, row_envs, listener, row_texts, row_meaning)
    else:
        assert score is not None
        probs, off = score(row_requests, row_texts)

    def dist(i: int, reply: str) -> dict[str, float]:
        row = rows[(i, reply)]
        out: dict[str, float] = {}
        for meaning, p in zip(row_meaning[row], probs[row]):
            out[meaning] = out.get(meaning, 0.0) + p
        return out

    values: dict[str, list[float]] = {name: [] for name in LISTENING_METRICS}
    ceilings = []  # per scenario: log2 of the listener's distinct actions
    for i, sc in enumerate(scenarios):
        sent = sc.sent[0]
        ceilings.append(math.log2(len(set(row_meaning[rows[(i, sent)]]))))
        given = functools.partial(dist, i)
        values["cic"].append(_mutual_information(sc.messages(), given))
        values["cic_given_target"].append(_mutual_information(sc.sent, given))
        values["influence"].append(kl_bits(given(sent), _marginal(sc.messages(), given)))
        values["success"].append(dist(i, sent).get(sc.label, 0.0))
        values["off_set"].append(off[rows[(i, sent)]])
        values["null_success"].append(dist(i, NULL_REPLY).get(sc.label, 0.0))
        if sc.donor is None:
            values["swap_follow"].append(math.nan)
            values["swap_success"].append(math.nan)
        else:
            donor = scenarios[sc.donor]
            swapped = dist(i, donor.sent[0])
            values["swap_follow"].append(swapped.get(donor.label, 0.0))
            values["swap_success"].append(swapped.get(sc.label, 0.0))
    return ListeningResult(
        values,
        tuple(seeds),
        counterfactuals,
        sum(ceilings) / len(ceilings),
        replies if listener_replies is not None else 0,
    )


def _read_replies(
    sampled: Sequence[Sequence[str]],
    envs: Sequence[Any],
    listener: str,
    texts: Sequence[Sequence[str]],
    meanings: Sequence[Sequence[str]],
) -> tuple[list[list[float]], list[float]]:
    """The :data:`Scorer`'s shape, read by the parser
    (:meth:`~marl.scenarios.base.TextScenarioEnv.read_shares`, normalised over the accepted
    replies as the exact scores are over the scored texts): each action's share on its first
    scored text, and the fraction of replies the parser rejects."""
    probs: list[list[float]] = []
    off: list[float] = []
    for replies, env, options, meaning in zip(sampled, envs, texts, meanings):
        first: dict[str, int] = {}
        for j, action in enumerate(meaning):
            first.setdefault(action, j)
        shares, rejected = env.read_shares(listener, replies, first)
        row = [0.0] * len(options)
        for action, j in first.items():
            row[j] = shares[action]
        probs.append(row)
        off.append(rejected)
    return probs, off


def _marginal(
    messages: Sequence[str], given: Callable[[str], Mapping[str, float]]
) -> dict[str, float]:
    """``q(a) = sum_m p(m) p(a | do(m))``, ``p(m)`` the messages' empirical distribution."""
    q: dict[str, float] = {}
    for m, count in Counter(messages).items():
        for a, p in given(m).items():
            q[a] = q.get(a, 0.0) + count / len(messages) * p
    return q


def _mutual_information(
    messages: Sequence[str], given: Callable[[str], Mapping[str, float]]
) -> float:
    """``sum_m p(m) KL(p(. | do(m)) || q)`` in bits: the MI of message and action under
    intervention, ``p(m)`` the messages' empirical distribution."""
    q = _marginal(messages, given)
    return sum(
        count / len(messages) * kl_bits(given(m), q) for m, count in Counter(messages).items()
    )


def _choose_donors(scenarios: Sequence[_Scenario], speaker: str, listener: str, seed: int) -> None:
    """For each scenario, another whose target is one of this one's other candidates (so its
    listener can follow the donor's message), drawn at random; None when there is none."""
    rng = random.Random(f"{seed}:listening:swap")
    meanings = []
    for sc in scenarios:
        _, _, legal = _listener_turn(sc.env, speaker, listener, NULL_REPLY)
        meanings.append(set(legal.values()))
    for i, sc in enumerate(scenarios):
        options = [
            j
            for j, other in enumerate(scenarios)
            if j != i and other.label != sc.label and other.label in meanings[i]
        ]
        sc.donor = rng.choice(options) if options else None


# --- policies as a sampler and a scorer --------------------------------------------------------
def _groups(sizes: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """``(start, stop)`` runs of consecutive items whose sizes sum to at most ``limit`` (an item
    larger than ``limit`` alone): bounds the rows, so the memory, of one scoring pass."""
    runs, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            runs.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        runs.append((start, len(sizes)))
    return runs


def hf_scorer(
    backend: Any,
    *,
    sampling: SamplingConfig | None = None,
    chunk: int = 512,
    scored: bool = False,
) -> Scorer:
    """The listener's exact distributions from an HF backend (a view of a shared base scores
    with its adapter active; the model's train/eval mode is restored), at the run's
    ``sampling.temperature``, after the prompt the rollout samples from
    (:func:`marl.agents.prompts.turn_prompt`: ``sampling.response_prefix``'s head included;
    default :class:`SamplingConfig`'s). Prompts are scored a group at a time, each group
    holding at most ``chunk`` reply texts (whole prompts: one with more is a group of its own),
    in one packed row
    (:func:`~marl.agents.action_scores.action_scores`: logits only where a reply token is
    predicted), which bounds the memory of the pass. ``scored``: the listener chooses by score
    (``policies.<id>.choice: scored``): its distribution is the normalised scores, as here, and
    its off-set mass is 0 (it writes nothing but the listed texts)."""
    from marl.agents.action_scores import action_scores
    from marl.agents.backends import backend_target
    from marl.agents.scored_choice import replies_after_head
    from marl.runtime.policies import adapter_active

    sampling = sampling or SamplingConfig()

    def score(
        requests: Sequence[Any], texts: Sequence[Sequence[str]]
    ) -> tuple[list[list[float]], list[float]]:
        base, adapter = backend_target(backend)
        model, tokenizer = base.model, base.tokenizer
        prompts, replies = [], []
        for request, options in zip(requests, texts):
            ids, _, after = replies_after_head(
                tokenizer, request, options, response_prefix=sampling.response_prefix
            )
            prompts.append(ids)
            replies.append(after)
        was_training = model.training
        model.eval()  # no dropout while scoring
        probs: list[list[float]] = []
        off: list[float] = []
        try:
            with adapter_active(model, adapter):
                for start, stop in _groups([len(r) for r in replies], chunk):
                    part = replies[start:stop]
                    scores = action_scores(
                        model,
                        tokenizer,
                        prompts[start:stop],
                        part,
                        temperature=sampling.temperature,
                    )
                    probs += [
                        [float(scores.probs[i, j]) for j in range(len(options))]
                        for i, options in enumerate(part)
                    ]
                    off += [0.0 if scored else float(x) for x in scores.off_set]
        finally:
            model.train(was_training)
        return probs, off

    return score
