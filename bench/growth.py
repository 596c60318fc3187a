"""Growth: time per agent turn as agents and parallel environments grow, with scripted agents.

The rollout runner (``marl.runtime.rollout.run_episodes``) plays ``public-goods-v0`` episodes with a
scripted backend in place of the model: each round it renders every live agent's prompt through
the chat template and tokenizes it (as for an LLM), makes one batched ``generate`` call per
policy, and the backend answers at once with a well-formed random reply (the scenario's random
bot). What is timed is everything around the model: environments, message routing, prompt
rendering and tokenization, turn records. Two sweeps:

- agents: 2, 4, 8, 16 agents in one scenario (``--envs`` environments, complete graph and a
  ring);
- parallel environments: 1, 2, 4, ..., 64 environments of 4 agents.

Each point is measured ``--rounds`` times, the points taking turns; the table gives the median
(and the minimum) seconds per agent turn. Writes ``bench/results/growth.json`` and
``bench/results/growth.png``. The goal in issue 10 (16 agents at most 0.4x the time per turn of
2) is about batching an LLM's turns; with scripted agents there is no model to batch, so this
shows the platform's own per-turn cost and how it scales.

    nice -n 19 .venv/bin/python bench/growth.py                  # BENCH_QUICK=1: shorter

``--model tiny`` times LLM turns instead: the real tiny test model (``model.kind=tiny``, HF
backend, 1 thread) generates every reply, and the agents sweep runs once per way of mapping
agents to policies: ``shared`` (one policy: every agent's turns in one call per round),
``lora`` (an adapter per agent on one base: since issue 10 also one call per round, each row
under its agent's adapter) and ``lora-separate`` (the same adapters, one call per adapter per
round: how ``lora`` ran before). Writes ``bench/results/growth_llm.json``.

    OMP_NUM_THREADS=1 nice -n 19 taskset -c 1 .venv/bin/python bench/growth.py --model tiny

``--model embedded`` does the same with SmolLM2-135M (``--dtype bfloat16 --threads 2`` as in
``make run``) and writes ``bench/results/growth_embedded.json``; ``--sweeps envs`` sweeps
parallel environments of 4 agents instead (``growth_embedded_envs.json``), and
``growth_embedded.png`` draws both. In the LLM sweeps replies start with the head their turn
needs (``SAY:`` / ``ACTION:``, as in ``make run``). Each row also gives the prompt tokens per
turn, the share of turns whose prompt no other turn of its round repeats (a repeated prompt is
prefilled once), the positions the prefill computed per turn (after sharing the round's common
prefix, padding included), and the turn's time in prefill and in decoding: with a complete
graph every agent reads every other agent's messages, so a turn's prompt grows with the agents,
and on a CPU its prefill is bound by arithmetic, which batching cannot share.

    .venv/bin/python bench/growth.py --model embedded --dtype bfloat16 --threads 2 \\
        --envs 1 --turns 64 --modes shared lora
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, alternate, inference_backends, machine, quick, row, write  # noqa: E402

import marl  # noqa: E402
from marl.agents.backends import Generation, SamplingConfig  # noqa: E402
from marl.agents.models import transformers_model  # noqa: E402
from marl.runtime.rollout import EpisodeSlot, run_episodes  # noqa: E402
from marl.scenarios.bots import random_bot  # noqa: E402

SCENARIO = "public-goods-v0"  # the LLM sweeps take --scenario


class ScriptedBackend:
    """A policy backend with no model: every prompt gets a random well-formed reply at once."""

    def __init__(self, tokenizer: Any, info: dict[str, Any], seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.info = info
        self.rng = random.Random(seed)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        adapters: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[list[Generation]]:
        """``sampling.n`` scripted replies per prompt."""
        out = []
        for prompt in prompts:
            group = []
            for _ in range(sampling.n):
                text = random_bot("agent", "", self.info, self.rng)
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                group.append(Generation(list(prompt), ids, [0.0] * len(ids), text, "stop"))
            out.append(group)
        return out


def _tokenizer(kind: str) -> Any:
    from marl.agents.models import ModelSpec, load_model

    if kind == "tiny":
        from marl.agents.models import build_char_tokenizer, prepare_tokenizer

        return prepare_tokenizer(build_char_tokenizer())
    return load_model(ModelSpec(kind="embedded"))[1]  # the tokenizer; the model is not run


def seconds_per_turn(
    tokenizer: Any, agents: int, envs: int, topology: str, episodes: int, seed: int = 0
) -> float:
    """Play ``episodes`` batches of ``envs`` environments of ``agents`` agents; wall seconds
    per generated agent turn."""
    names = [f"p{i}" for i in range(agents)]
    overrides = {"agents": names, "graph": {"topology": topology}}
    probe = marl.make(SCENARIO, **overrides)
    _, infos = probe.reset(seed=0)
    info = dict(infos[names[0]])
    info["valid_actions"] = [str(v) for v in range(11)]  # contributions, in the action rounds
    backend = ScriptedBackend(tokenizer, info, seed)
    sampling = SamplingConfig(max_new_tokens=16)
    turns = 0
    began = time.perf_counter()
    for batch in range(episodes):
        slots = [
            EpisodeSlot(marl.make(SCENARIO, **overrides), seed + batch * envs + i, i, i)
            for i in range(envs)
        ]
        result = run_episodes(slots, {"shared": backend}, lambda a: "shared", sampling, seed)
        turns += len(result.turns)
    return (time.perf_counter() - began) / max(1, turns)


class OwnCall:
    """A policy's backend without the ``base`` attribute of an adapter view, so
    :func:`marl.agents.generation.generate_by_policy` gives it a generate call of its own (how
    per-agent adapters ran before they were batched together)."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.tokenizer = view.tokenizer

    def generate(self, prompts: Any, sampling: Any, adapters: Any = None, seed: Any = None) -> Any:
        """The view's own call."""
        return self.view.generate(prompts, sampling, adapters=adapters, seed=seed)


def llm_policies(
    mode: str, agents: int, model: str = "tiny", dtype: str = "float32", scenario: str = SCENARIO
) -> tuple[dict[str, Any], Any]:
    """Backends (``model``: tiny or embedded) and ``policy_of`` for ``agents`` agents under
    ``mode``."""
    names = [f"p{i}" for i in range(agents)]
    backends, owner = inference_backends(
        {
            "scenario": {"name": scenario, "overrides": {"agents": names}},
            "model": {"kind": model, "dtype": dtype},
            "sharing": "shared" if mode == "shared" else "lora",
        }
    )
    if mode == "lora-separate":
        backends = {pid: OwnCall(b) for pid, b in backends.items()}
    return backends, owner.__getitem__


def llm_seconds_per_turn(
    mode: str,
    agents: int,
    envs: int,
    episodes: int,
    key: str,
    seed: int = 0,
    model: str = "tiny",
    dtype: str = "float32",
    scenario: str = SCENARIO,
    max_new_tokens: int = 16,
) -> float:
    """Wall seconds per agent turn of ``episodes`` batches of ``envs`` environments, ``model``
    generating (up to ``max_new_tokens`` new tokens a reply); building the policies is not
    timed. Under ``key`` (the point's name): the share of that time spent in the environments'
    ``reset`` and ``step`` goes to ``ENV_SHARE``, the prompt tokens per turn to
    ``PROMPT_TOKENS`` and the forward passes' seconds per turn to ``PHASES``."""
    backends, policy_of = llm_policies(mode, agents, model, dtype, scenario)
    forward = time_forwards(backends.values())
    names = [f"p{i}" for i in range(agents)]
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, response_prefix=True)
    turns = prompt_tokens = distinct = 0  # distinct: prompts not repeated within their round
    in_env = [0.0]  # seconds inside the environments' reset and step (environment + protocol)

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                in_env[0] += time.perf_counter() - began

        return call

    began = time.perf_counter()
    for batch in range(episodes):
        slots = [
            EpisodeSlot(marl.make(scenario, agents=names), seed + batch * envs + i, i, i)
            for i in range(envs)
        ]
        for slot in slots:
            slot.env.reset, slot.env.step = timed(slot.env.reset), timed(slot.env.step)
        # replies start with the head their turn needs (SAY:/ACTION:), as in make run: a base
        # model's free-form replies rarely parse, and then every environment shows its agents
        # the same prompts, which the shared prefill would run once
        result = run_episodes(slots, backends, policy_of, sampling, seed)
        turns += len(result.turns)
        prompt_tokens += sum(len(t.prompt_ids) for t in result.turns)
        rounds: dict[int, set[tuple[int, ...]]] = {}
        for t in result.turns:
            rounds.setdefault(t.round, set()).add(tuple(t.prompt_ids))
        distinct += sum(len(p) for p in rounds.values())
    wall = time.perf_counter() - began
    ENV_SHARE.setdefault(key, []).append(in_env[0] / wall)
    for phase in ("prefill", "decode"):
        PHASES.setdefault(key, {}).setdefault(phase, []).append(forward[phase] / max(1, turns))
    PROMPT_TOKENS[key] = prompt_tokens / max(1, turns)
    PREFILL_TOKENS[key] = forward["prefill_positions"] / max(1, turns)
    DISTINCT[key] = distinct / max(1, turns)
    return wall / max(1, turns)


ENV_SHARE: dict[str, list[float]] = {}  # point -> share of its wall time in reset/step, per run
PROMPT_TOKENS: dict[str, float] = {}  # point -> prompt tokens per agent turn
DISTINCT: dict[str, float] = {}  # point -> share of turns whose prompt is not repeated that round
PHASES: dict[str, dict[str, list[float]]] = {}  # point -> prefill/decode -> seconds a turn, per run
PREFILL_TOKENS: dict[str, float] = {}  # point -> positions prefilled per agent turn


def time_forwards(backends: Any) -> dict[str, float]:
    """Add up the wall seconds of every forward pass of the backends' models: ``prefill``
    (more than one new token a row) and ``decode`` (one). Returns the running totals, with
    ``prefill_positions``: the positions the prefills computed (rows x new tokens, padding
    included)."""
    totals = {"prefill": 0.0, "decode": 0.0, "prefill_positions": 0.0}
    models = {}
    for backend in backends:
        model = getattr(backend, "model", None)
        if model is not None:  # inside a peft wrapper, the model that runs
            model = transformers_model(model)
            models[id(model)] = model
    for model in models.values():
        began: list[tuple[str, float]] = []

        def before(module: Any, args: Any, kwargs: Any, began: list = began) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            phase = "decode" if ids is not None and ids.shape[1] == 1 else "prefill"
            if phase == "prefill" and ids is not None:
                totals["prefill_positions"] += ids.numel()
            began.append((phase, time.perf_counter()))

        def after(module: Any, args: Any, kwargs: Any, out: Any, began: list = began) -> None:
            phase, start = began.pop()
            totals[phase] += time.perf_counter() - start

        model.register_forward_pre_hook(before, with_kwargs=True)
        model.register_forward_hook(after, with_kwargs=True)
    return totals


def llm_main(args: argparse.Namespace) -> None:
    """The ``--model tiny`` / ``--model embedded`` sweeps (see the module docstring)."""
    import torch

    torch.set_num_threads(args.threads)
    state = machine()
    rounds_per_episode = marl.make(args.scenario).spec.rounds

    def point(mode: str, agents: int, envs: int, key: str) -> Any:
        episodes = max(1, round(args.turns / (agents * envs * rounds_per_episode)))
        return lambda: llm_seconds_per_turn(
            mode,
            agents,
            envs,
            episodes,
            key,
            model=args.model,
            dtype=args.dtype,
            scenario=args.scenario,
            max_new_tokens=args.max_new_tokens,
        )

    modes = tuple(args.modes)
    points = {}
    if "agents" in args.sweeps:
        points.update(
            {f"{m}/{n}": point(m, n, args.envs, f"{m}/{n}") for m in modes for n in args.agents}
        )
    if "envs" in args.sweeps:  # the first mode, 4 agents
        points.update(
            {
                f"{modes[0]}/4/envs{e}": point(modes[0], 4, e, f"{modes[0]}/4/envs{e}")
                for e in args.env_counts
            }
        )
    measured = alternate(points, args.rounds)
    state["load_average_after"] = machine()["load_average"]

    def figure(key: str, label: str) -> dict[str, Any]:
        r = measured[key]
        phases = {k: statistics.median(v) * 1e3 for k, v in PHASES[key].items()}
        return row(
            label,
            r["median"] * 1e3,
            "ms",
            f"min {r['min'] * 1e3:.2f}; {PROMPT_TOKENS[key]:.0f} prompt tokens a turn, "
            f"{DISTINCT[key]:.0%} distinct, {PREFILL_TOKENS[key]:.0f} prefilled; "
            f"prefill {phases['prefill']:.1f} ms, decoding {phases['decode']:.1f} ms a turn",
        )

    summary = []
    if "agents" in args.sweeps:
        lo, hi = min(args.agents), max(args.agents)
        for mode in modes:
            summary += [figure(f"{mode}/{n}", f"{mode}: {n} agents, per turn") for n in args.agents]
            ratio = measured[f"{mode}/{hi}"]["median"] / measured[f"{mode}/{lo}"]["median"]
            bound = (
                statistics.median(PHASES[f"{mode}/{hi}"]["prefill"])
                / measured[f"{mode}/{lo}"]["median"]
            )
            summary.append(
                row(
                    f"{mode}: {hi} vs {lo} agents",
                    ratio,
                    "x",
                    f"goal <= 0.4: {'met' if ratio <= 0.4 else 'NOT met'}; with free decoding at "
                    f"{hi} agents it would still be {bound:.2f}x (its prefill)",
                )
            )
        if {"lora", "lora-separate"} <= set(modes):
            for n in args.agents:
                ratio = measured[f"lora-separate/{n}"]["median"] / measured[f"lora/{n}"]["median"]
                summary.append(
                    row(f"lora, {n} agents: one call per adapter vs one call", ratio, "x")
                )
    if "envs" in args.sweeps:
        summary += [
            figure(f"{modes[0]}/4/envs{e}", f"{modes[0]}: 4 agents x {e} envs, per turn")
            for e in args.env_counts
        ]
    shares = [v for values in ENV_SHARE.values() for v in values]
    summary.append(
        row(
            "environment + protocol share of the wall time",
            max(shares) * 100,
            "%",
            f"largest over all points; median {statistics.median(shares) * 100:.2f}% (goal < 1%)",
        )
    )
    summary.append(
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"after {state['load_average_after'][0]:.2f}; {args.envs} envs; "
            f"{args.model} {args.dtype}, {args.threads} thread(s), "
            f"replies of up to {args.max_new_tokens} tokens",
        )
    )
    base = "growth_llm" if args.model == "tiny" else f"growth_{args.model}"
    name = base
    if args.scenario != SCENARIO:
        name += f"_{args.scenario.split('-v')[0].replace('-', '_')}"
    if args.sweeps == ["envs"]:
        name += "_envs"
    if args.max_new_tokens != 16:
        name += f"_{args.max_new_tokens}tokens"
    if "shared" not in modes:  # the files without a suffix hold the shared policy's curve
        name += "".join(f"_{mode.replace('-', '_')}" for mode in modes)
    write(
        name,
        {
            "args": vars(args),
            "results": measured,
            "env_share": ENV_SHARE,
            "prompt_tokens_per_turn": PROMPT_TOKENS,
            "distinct_prompt_share": DISTINCT,
            "prefilled_tokens_per_turn": PREFILL_TOKENS,
            "seconds_per_turn_by_phase": PHASES,
            "machine": state,
        },
        summary,
    )
    if args.max_new_tokens == 16:
        plot_llm(base, args.model)


def _powers_of_two_axis(ax: Any, xs: Sequence[int], xlabel: str, ylabel: str) -> None:
    """A log-2 x axis ticked at ``xs`` in plain numbers, a y axis from 0, a light grid."""
    import matplotlib.ticker

    ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


PLOTTED = (  # (file suffix, what the curve is): the agents sweeps drawn side by side
    ("", f"{SCENARIO} (complete graph)"),
    ("_majority", "majority-vote-v0 (ring)"),
)


def plot_llm(base: str, model: str) -> None:
    """Time per agent turn, and its prefill and decoding parts, against agents (one curve per
    scenario of :data:`PLOTTED`: ``<base>.json``, ``<base>_majority.json``) and against parallel
    environments (``<base>_envs.json``), into ``<base>.png``; from the files under
    bench/results that exist."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = (
        (axes[0], PLOTTED, "agents in one scenario"),
        (axes[1], (("_envs", f"{SCENARIO}, 4 agents"),), "parallel environments"),
    )
    colors = iter(f"C{i}" for i in range(10))
    for ax, sources, xlabel in panels:
        xs: list[int] = []
        for suffix, label in sources:
            source = RESULTS / f"{base}{suffix}.json"
            if not source.exists():
                continue
            data = json.loads(source.read_text())
            lines: dict[str, list[tuple[int, str]]] = {}
            for key in data["results"]:
                parts = key.split("/")
                x = int(parts[2][4:]) if suffix == "_envs" else int(parts[1])
                lines.setdefault(parts[0], []).append((x, key))
            for mode, keys in sorted(lines.items()):
                color = next(colors)
                keys.sort()
                xs = sorted({*xs, *(x for x, _ in keys)})
                ys = [data["results"][k]["median"] * 1e3 for _, k in keys]
                ratio = f", {keys[-1][0]} vs {keys[0][0]}: {ys[-1] / ys[0]:.2f}x"
                ax.plot(
                    [x for x, _ in keys],
                    ys,
                    "o-",
                    color=color,
                    label=f"{label}, {mode}: per turn{ratio}",
                )
                phases = data.get("seconds_per_turn_by_phase", {})  # absent from older results
                for phase, style in (("prefill", "--"), ("decode", ":")):
                    if all(k in phases for _, k in keys):
                        ys = [statistics.median(phases[k][phase]) * 1e3 for _, k in keys]
                        ax.plot(
                            [x for x, _ in keys],
                            ys,
                            style,
                            color=color,
                            label=f"{label}, {mode}: {phase}",
                        )
        if not xs:
            ax.set_title("not measured")
            continue
        _powers_of_two_axis(ax, xs, xlabel, "ms per agent turn")
        ax.legend(fontsize=6)
    name = "SmolLM2-135M" if model == "embedded" else f"the {model} model"
    fig.suptitle(f"{name} generating up to 16 tokens a turn: time per agent turn")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{base}.png", dpi=100)
    plt.close(fig)


def plot(results: dict[str, Any], path: Path) -> None:
    """Seconds per agent turn against agents and against parallel environments."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for topology, points in results["agents"].items():
        xs = sorted(int(k) for k in points)
        ys = [points[str(x)]["median"] * 1e6 for x in xs]
        left.plot(xs, ys, marker="o", label=f"{topology} graph")
    agents = sorted({int(x) for pts in results["agents"].values() for x in pts})
    _powers_of_two_axis(left, agents, "agents in one scenario", "µs per agent turn")
    left.set_title(f"{results['envs_for_agents']} parallel environments")
    left.legend()
    points = results["envs"]
    xs = sorted(int(k) for k in points)
    right.plot(xs, [points[str(x)]["median"] * 1e6 for x in xs], marker="o")
    _powers_of_two_axis(right, xs, "parallel environments", "µs per agent turn")
    right.set_title("4 agents, complete graph")
    fig.suptitle(f"{SCENARIO}, scripted agents: the platform's cost per agent turn")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", nargs="+", type=int, default=[2, 4, 8, 16])
    p.add_argument("--envs", type=int, default=8, help="parallel environments, agents sweep")
    p.add_argument("--env-counts", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument(
        "--turns",
        type=int,
        default=200 if quick() else 2000,
        help="about this many agent turns per point",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokenizer", choices=("tiny", "embedded"), default="tiny")
    p.add_argument(
        "--model",
        choices=("scripted", "tiny", "embedded"),
        default="scripted",
        help="tiny / embedded: LLM turns of the tiny test model or SmolLM2",
    )
    p.add_argument("--dtype", default="float32", help="the model's dtype (LLM sweeps)")
    p.add_argument("--scenario", default=SCENARIO, help="the scenario (LLM sweeps)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (LLM sweeps)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=16,
        help="LLM sweeps: the longest reply; 16 cuts most replies of SmolLM2 "
        "before their ACTION line, the platform's default is 48",
    )
    p.add_argument(
        "--sweeps",
        nargs="+",
        default=["agents"],
        choices=("agents", "envs"),
        help="LLM sweeps: agents (--agents, --envs), envs (--env-counts, 4 agents)",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=["shared", "lora", "lora-separate"],
        choices=("shared", "lora", "lora-separate"),
        help="LLM sweeps",
    )
    args = p.parse_args()
    if args.model != "scripted":
        llm_main(args)
        return
    tokenizer = _tokenizer(args.tokenizer)
    state = machine()
    rounds_per_episode = marl.make(SCENARIO).spec.rounds

    def episodes(agents: int, envs: int) -> int:
        return max(1, round(args.turns / (agents * envs * rounds_per_episode)))

    points: dict[str, Any] = {}
    for topology in ("complete", "ring"):
        for n in args.agents:
            points[f"agents/{topology}/{n}"] = lambda n=n, t=topology: seconds_per_turn(
                tokenizer, n, args.envs, t, episodes(n, args.envs)
            )
    for e in args.env_counts:
        points[f"envs/{e}"] = lambda e=e: seconds_per_turn(
            tokenizer, 4, e, "complete", episodes(4, e)
        )
    measured = alternate(points, args.rounds)
    state["load_average_after"] = machine()["load_average"]
    results: dict[str, Any] = {"agents": {}, "envs": {}, "envs_for_agents": args.envs}
    for key, r in measured.items():
        parts = key.split("/")
        if parts[0] == "agents":
            results["agents"].setdefault(parts[1], {})[parts[2]] = r
        else:
            results["envs"][parts[1]] = r
    png = RESULTS / "growth.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(results, png)
    summary = []
    for topology, by_n in results["agents"].items():
        for n in args.agents:
            r = by_n[str(n)]
            summary.append(
                row(
                    f"{n} agents ({topology}), per turn",
                    r["median"] * 1e6,
                    "µs",
                    f"min {r['min'] * 1e6:.0f}",
                )
            )
        lo, hi = min(args.agents), max(args.agents)
        ratio = by_n[str(hi)]["median"] / by_n[str(lo)]["median"]
        summary.append(
            row(
                f"{hi} vs {lo} agents ({topology})",
                ratio,
                "x",
                "per-turn time ratio (issue goal <= 0.4 is for LLM turns)",
            )
        )
    for e in args.env_counts:
        r = results["envs"][str(e)]
        summary.append(
            row(
                f"{e} envs x 4 agents, per turn",
                r["median"] * 1e6,
                "µs",
                f"min {r['min'] * 1e6:.0f}",
            )
        )
    summary.append(
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"{state['cores_available']} cores; PNG {png.name}",
        )
    )
    write(
        "growth",
        {"args": vars(args), "results": results, "machine": state, "png": str(png)},
        summary,
    )


if __name__ == "__main__":
    main()
