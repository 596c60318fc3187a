"""The end-of-run summary ``marl train`` prints, and the PNG of the headline curves.

Start is the first iteration's rollout (before any RL update: after the warm-up, if any); end is
the mean of the last ``last`` iterations (:meth:`RunSummary.finals`, also the final metrics of
the run's TensorBoard HParams session). A success rate gets a 95% Wilson interval over the
pooled episodes of those iterations; the reward gets a 95% t-interval over the iterations
(:mod:`marl.analysis.stats`). Both describe this one run, not the recipe: that needs seeds.

The held-out evaluations play the same scenarios each time, so the first and the last are also
compared scenario by scenario: how many got worse, how many got better, and McNemar's exact
p-value (:func:`marl.analysis.evaluation.paired_metrics`), logged as ``eval/paired/*`` at every
evaluation against the run's first one, and among the finals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean

from marl.analysis.evaluation import GOT_BETTER, GOT_WORSE, MCNEMAR_P, PAIRED, paired_metrics
from marl.analysis.stats import mean_interval, wilson

SUCCESS = "team/success"
REWARD = "team/reward"
PARSE_FAILURES = "team/parse_failure_rate"
EVAL_SUCCESS = "eval/success"
EVAL_REWARD = "eval/reward"
EVAL_EPISODES = "eval/episodes"
MI_SUFFIX = "/speaker_mi_content"
RATE_SUFFIX = "/message_rate"
INFLUENCE_SUFFIX = "/influence_action"
LISTENING = "eval/listening/"
EXPLOITABILITY = (
    "league/exploitability",
    "league/nash_conv",
    "eval/chips_vs_nash",
    "eval/chips_vs_random",
)
CIC = LISTENING + "cic"
ENDINGS = (MI_SUFFIX, INFLUENCE_SUFFIX, RATE_SUFFIX)


def final_value(tag: str, points: Sequence[tuple[int, float]], last: int = 3) -> float:
    """A run's final value of a metric from its (step, value) points: the mean of the last
    ``last``; for ``eval/*`` tags (logged only at evaluations) and the exact exploitability
    the last measurement."""
    # measured at evaluations (or repeated between exact scorings): the last measurement
    tail = points[-1:] if tag.startswith("eval/") or tag in EXPLOITABILITY else points[-last:]
    return fmean(v for _, v in tail)


def _listening(key: str) -> bool:
    """The exact listening measures and their intervals (``eval/listening/*``), and the exact
    exploitability of a game with a tree (Kuhn Poker: ``league/exploitability`` and the rest)."""
    return key.startswith(LISTENING) or key in EXPLOITABILITY


class RunSummary:
    """Collects the headline scalars of every iteration; prints and plots them at the end."""

    def __init__(self, episodes_per_step: int, last: int = 3) -> None:
        self.episodes = episodes_per_step
        self.last = last
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        # each evaluation's per-scenario outcomes: updates done -> scenario seed -> success
        self.evaluations: dict[int, dict[int, bool]] = {}

    def add(self, step: int, metrics: dict[str, float]) -> None:
        """Keep this iteration's headline metrics."""
        for key, value in metrics.items():
            headline = (SUCCESS, REWARD, PARSE_FAILURES, EVAL_SUCCESS, EVAL_REWARD, EVAL_EPISODES)
            if key in headline or key in PAIRED or key.endswith(ENDINGS) or _listening(key):
                self.history[key].append((step, float(value)))

    def add_evaluation(self, step: int, successes: dict[int, bool] | None) -> dict[str, float]:
        """Keep a held-out evaluation's per-scenario outcomes (scenario seed -> success, from
        :func:`marl.analysis.evaluation.evaluation_successes`) and return the paired comparison with
        this run's first evaluation (``eval/paired/*``: zeros and p = 1 at the first itself), for
        the caller to log with the evaluation's other metrics. Nothing when ``successes`` is
        None."""
        if not successes:
            return {}
        self.evaluations[step] = dict(successes)
        return paired_metrics(next(iter(self.evaluations.values())), successes)

    def finals(self) -> dict[str, float]:
        """The final value of every headline metric (team reward, success, parse failures,
        held-out success and reward, the last evaluation against the first scenario by scenario
        (``eval/paired/*``: got worse, got better, McNemar p); per agent message rate, speaker
        MI and listener influence), as ``final/<tag>``: the mean of the last ``last``
        iterations; for ``eval/*`` (logged only at evaluations) the last evaluation.
        These are the metrics of the run's TensorBoard HParams session
        (:mod:`marl.analysis.hparams`)."""
        return {
            f"final/{key}": final_value(key, points, self.last)
            for key, points in sorted(self.history.items())
            if points and key != EVAL_EPISODES and self._headline_final(key)
        }

    @staticmethod
    def _headline_final(key: str) -> bool:
        """Per agent, not per edge: an edge's metrics are in the run's curves, and one column
        per edge would bury the team's in the HParams table."""
        return "/edges/" not in key

    def last_step(self, default: int = 0) -> int:
        """The last iteration any headline metric was recorded at (``default`` if none)."""
        return max((s for points in self.history.values() for s, _ in points), default=default)

    def _ends(self, key: str) -> tuple[float, float, int]:
        values = [v for _, v in self.history[key]]
        tail = values[-self.last :]
        return values[0], fmean(tail), len(tail)

    def lines(self) -> list[str]:
        """Human-readable lines: success and reward at the start and the end, speaker MI."""
        out = []
        if self.history.get(EVAL_SUCCESS):
            (s0, first), (s1, final) = self.history[EVAL_SUCCESS][0], self.history[EVAL_SUCCESS][-1]
            n = int(self.history[EVAL_EPISODES][-1][1])
            lo0, hi0 = wilson(first * n, n)
            lo1, hi1 = wilson(final * n, n)
            head = f"held-out success ({n} unseen scenarios): after {s0} updates {first:.2f} "
            head += f"[{lo0:.2f}, {hi0:.2f}]"
            if len(self.history[EVAL_SUCCESS]) > 1:
                head += f" -> after {s1} updates {final:.2f} [{lo1:.2f}, {hi1:.2f}]"
            head += " (95% Wilson intervals)"
            if len(self.history[EVAL_SUCCESS]) > 1 and len(self.history.get(MCNEMAR_P, [])) > 1:
                p = self.history[MCNEMAR_P][-1][1]
                worse = int(self.history[GOT_WORSE][-1][1])
                better = int(self.history[GOT_BETTER][-1][1])
                head += f"; McNemar exact p = {p:.3g}, {worse} got worse, {better} got better"
            out.append(head)
        if self.history.get(SUCCESS):
            start, end, k = self._ends(SUCCESS)
            lo0, hi0 = wilson(start * self.episodes, self.episodes)
            lo1, hi1 = wilson(end * self.episodes * k, self.episodes * k)
            out.append(
                f"success: start {start:.2f} [{lo0:.2f}, {hi0:.2f}] ({self.episodes} episodes)"
                f" -> end {end:.2f} [{lo1:.2f}, {hi1:.2f}] (last {k} steps, "
                f"{self.episodes * k} episodes; 95% Wilson intervals)"
            )
        if self.history.get(REWARD):
            values = [v for _, v in self.history[REWARD]]
            start, end, k = self._ends(REWARD)
            _, _, high = mean_interval(values[-k:])  # the mean is ``end``
            half = high - end if k > 1 else 0.0
            out.append(f"team reward: start {start:+.3f} -> end {end:+.3f} ± {half:.3f}")
        for key in sorted(self.history):
            if key.endswith(MI_SUFFIX) and "/edges/" not in key:
                start, end, _ = self._ends(key)
                agent = key.split("/")[1]
                rate = self.history.get(f"emergence/{agent}{RATE_SUFFIX}", [])
                if rate and not any(v > 0 for _, v in rate):
                    continue  # an agent that never had anyone to talk to signals nothing
                out.append(
                    f"speaker MI ({agent}, content words): start {start:.2f} -> end {end:.2f} bits"
                )
            if key.endswith(INFLUENCE_SUFFIX) and "/edges/" in key and not self.history.get(CIC):
                start, end, _ = self._ends(key)
                edge = key.split("/")[2]
                out.append(
                    f"listener influence ({edge}, sampled null message): start {start:.2f} -> "
                    f"end {end:.2f}"
                )
        out += self._listening_lines()
        if self.history.get(EXPLOITABILITY[0]):
            start, end = self.history[EXPLOITABILITY[0]][0], self.history[EXPLOITABILITY[0]][-1]
            line = (
                f"exploitability (exact, chips a hand; uniform random 0.458, Nash 0): after "
                f"{start[0]} updates {start[1]:.3f} -> after {end[0]} updates {end[1]:.3f}"
            )
            for tag in EXPLOITABILITY[2:]:
                if self.history.get(tag):
                    line += (
                        f"; {tag.split('/')[-1].replace('_', ' ')} {self.history[tag][-1][1]:+.3f}"
                    )
            out.append(line)
        return out

    def _listening_lines(self) -> list[str]:
        """The exact listening measures (``eval/listening/*``) at the first and last held-out
        evaluation, with their 95% t-intervals over scenarios."""
        if not self.history.get(CIC):
            return []

        def at(name: str, index: int) -> str:
            points = self.history.get(f"{LISTENING}{name}")
            if not points:
                return "-"
            step, value = points[index]
            low = dict(self.history.get(f"{LISTENING}{name}_low", [])).get(step, math.nan)
            high = dict(self.history.get(f"{LISTENING}{name}_high", [])).get(step, math.nan)
            if math.isnan(low):
                return f"{value:.2f}"
            return f"{value:.2f} [{low:.2f}, {high:.2f}]"

        points = self.history[CIC]
        head = f"after {points[0][0]} updates"
        tail = f" -> after {points[-1][0]} updates" if len(points) > 1 else ""
        given = ""
        if self.history.get(f"{LISTENING}cic_given_target"):
            given = f" (given the target: {at('cic_given_target', -1)})"
        lines = [
            f"listening (held-out, exact; 95% t-intervals over scenarios): CIC {head} "
            f"{at('cic', 0)}{tail}{' ' + at('cic', -1) if tail else ''} bits{given}",
            f"interventions {'after ' + str(points[-1][0]) + ' updates'}: message swap followed "
            f"{at('swap_follow', -1)}, success with no message {at('null_success', -1)}, "
            f"with the sent message {at('success', -1)}",
        ]
        flags = [step for step, flag in self.history.get(f"{LISTENING}off_set_flag", []) if flag]
        if flags:
            lines.append(
                f"listening: FLAGGED after {', '.join(map(str, flags))} updates: the listener put "
                f"more than half its mass on replies none of the scored texts "
                f"(off-set {at('off_set', -1)}), so these measures describe replies it rarely "
                "writes"
            )
        return lines

    def plot(self, path: Path) -> Path | None:
        """A PNG of success (or reward), speaker MI and influence per iteration."""
        keys = [k for k in (EVAL_SUCCESS, SUCCESS, REWARD) if self.history.get(k)][:2]
        keys += sorted(k for k in self.history if k.endswith(MI_SUFFIX) and "/edges/" not in k)
        keys += sorted(k for k in self.history if k.endswith(INFLUENCE_SUFFIX) and "/edges/" in k)
        if not keys:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
        for ax, key in zip(axes[0], keys):
            steps = [s for s, _ in self.history[key]]
            values = [v for _, v in self.history[key]]
            ax.plot(steps, values, marker="o")
            if key in (SUCCESS, EVAL_SUCCESS):
                n = self.episodes
                if key == EVAL_SUCCESS:
                    n = int(self.history[EVAL_EPISODES][-1][1])
                bands = [wilson(v * n, n) for v in values]
                ax.fill_between(steps, [b[0] for b in bands], [b[1] for b in bands], alpha=0.2)
                ax.set_ylim(0, 1)
            ax.set_title(key)
            ax.set_xlabel("iteration")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
