"""Speaker x listener cross-play and the exact listening measures of trained pairs
(``marl eval --listening``, issue 26 item 4).

A *pair* is what one run trained for a two-agent cooperative scenario: the policy of its first
agent (the speaker) and of its second (the listener), read from a checkpoint (full models or
LoRA adapters), or the untrained base model (``model:<preset>``) in both seats. All pairs'
LoRA adapters load onto one shared base model (one copy in memory).

- :func:`role_crossplay`: every speaker with every listener (``P x P`` ordered pairings, the
  diagonal a run with itself): ``episodes`` held-out scenarios each, sampled as the rollout
  samples; the success rate with its 95% Wilson interval per cell. Pairs from different seeds
  off the diagonal show whether two runs learned the same convention; the base model's row
  and column show what a trained speaker or listener does with an untrained partner.
- :func:`self_play_gap`: how much better each trained pair does with itself than with the other
  runs' speakers and listeners, a number per run with a t-interval over runs: about 0 when the
  runs share one language, above 0 when each learned a convention of its own.
- :func:`pair_listening`: :func:`marl.analysis.listening.listening_per_scenario` for each pair with
  itself: CIC, influence, exact success, the null message and the message swap.

Tables: :func:`write_tables` writes ``crossplay_roles.md``, ``.csv`` and ``.png`` and
``listening.md`` / ``listening.json``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from marl.analysis.stats import wilson
from marl.errors import RunError

__all__ = [
    "Pair",
    "json_safe",
    "load_pairs",
    "pair_listening",
    "role_crossplay",
    "self_play_gap",
    "write_tables",
]


@dataclass
class Pair:
    """One run's speaker and listener, as generation backends (views of a shared base)."""

    name: str
    speaker: Any
    listener: Any
    config: dict[str, Any]  # the run's saved config ({} for the base model)
    listener_scored: bool = False  # its listener chooses by score (policies.<id>.choice)


def load_pairs(
    specs: Sequence[str], base_preset: str | None = None, rules_module: str | None = None
) -> list[Pair]:
    """Pairs from ``name=checkpoint`` spellings (a run's ``checkpoints`` folder or one step's
    directory) and ``name=model:<preset>`` (the base model in both seats). Every checkpoint
    must hold a policy for each of its scenario's first two agents; LoRA adapters share one
    base backend per base model.

    A checkpoint's config is data (:func:`marl.competition.players.checkpoint_config`): a
    ``rules_module`` it names is not imported unless the command line names it
    (``rules_module``), and the model it names is checked before it is built
    (:func:`marl.runtime.checkpoint.saved_model_spec`)."""
    from marl.agents.backends import make_backend
    from marl.agents.models import ModelSpec, load_model
    from marl.competition.players import check_weight_shapes, checkpoint_config
    from marl.config import load_config
    from marl.runtime.checkpoint import load_checkpoint, saved_model_spec
    from marl.runtime.policies import AdapterBackend, peft_lora_config
    from marl.runtime.policy_map import plan_for
    from marl.scenarios.registry import make

    pairs: list[Pair] = []
    bases: dict[tuple, Any] = {}

    def base_backend(fields: Mapping[str, Any], source: str | None = None) -> Any:
        key = tuple(sorted((k, str(v)) for k, v in fields.items()))
        if key not in bases:
            spec = ModelSpec(**fields) if source is None else saved_model_spec(fields, source)
            model, tokenizer = load_model(spec)
            bases[key] = make_backend("hf", model=model, tokenizer=tokenizer)
        return bases[key]

    for spec in specs:
        name, _, body = spec.rpartition("=")
        name = name or Path(body).parent.name or body
        if body.startswith("model:"):
            from marl.competition.players import model_preset

            backend = base_backend(model_preset(body[len("model:") :]))
            view = AdapterBackend(backend, None)
            pairs.append(Pair(name, view, view, {}))
            continue
        if not Path(body).exists():
            raise RunError(f"eval: checkpoint not found: {body}")
        state = load_checkpoint(body, command="eval")
        saved = checkpoint_config(state.get("config") or {}, body, rules_module)
        config = load_config(saved)
        plan = plan_for(config)
        agents = list(make(config.scenario.name, **dict(config.scenario.overrides)).possible_agents)
        if len(agents) < 2:
            raise RunError(f"eval: --listening needs two agents; {body} trained {agents}")
        views = []
        for agent in agents[:2]:
            pid = plan.policy_of(agent)
            policy = (state.get("policies") or {}).get(pid)
            if policy is None:
                raise RunError(f"eval: {body} holds no policy {pid!r} for agent {agent!r}")
            pspec = plan.policies[pid]
            fields = {k: v for k, v in vars(pspec.model).items()}
            declared = saved.get("policies") if isinstance(saved.get("policies"), dict) else {}
            model_key = f"config.policies.{pid}.model" if pid in declared else "config.model"
            if policy.get("kind") == "adapter":
                backend = base_backend(fields, body)
                adapter = re.sub(r"\W", "_", f"pair_{name}__{pid}")  # peft: no dots
                lora = peft_lora_config(pspec.lora)
                backend.add_adapter(adapter, policy["weights"], config=lora)
                views.append(AdapterBackend(backend, adapter, lora))
            else:
                spec_ = saved_model_spec(fields, body, model_key, policy.get("weights"))
                model, tokenizer = load_model(spec_)
                check_weight_shapes(model, policy["weights"], f"eval: the weights in {body}")
                model.load_state_dict(policy["weights"], strict=False)
                views.append(make_backend("hf", model=model, tokenizer=tokenizer))
        listener_spec = plan.policies[plan.policy_of(agents[1])]
        pairs.append(Pair(name, views[0], views[1], saved, listener_spec.scored))
    names = [p.name for p in pairs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RunError(f"eval: two pairs are called {duplicates[0]!r}; label them (name=path)")
    return pairs


def role_crossplay(
    pairs: Sequence[Pair],
    scenario: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    episodes: int = 64,
    seed: int = 0,
    sampling: Any = None,
) -> list[dict[str, Any]]:
    """One row per (speaker pair, listener pair): ``success`` with its Wilson interval over
    ``episodes`` held-out scenarios (the same scenarios in every cell), sampled under
    ``sampling`` (a :class:`~marl.agents.backends.SamplingConfig`, ``response_prefix``
    included; default 12 tokens at temperature 1)."""
    from marl.agents.backends import SamplingConfig
    from marl.runtime.rollout import EpisodeSlot, run_episodes
    from marl.scenarios.registry import make

    overrides = dict(overrides or {})
    agents = list(make(scenario, **overrides).possible_agents)
    speaker, listener = agents[:2]
    backends: dict[str, Any] = {}
    for p in pairs:
        backends[f"{p.name}/speaker"] = p.speaker
        backends[f"{p.name}/listener"] = p.listener
    from marl.runtime.seeding import held_out_seeds

    seeds = held_out_seeds(f"{seed}:crossplay_roles", episodes)
    sampling = sampling or SamplingConfig(max_new_tokens=12, temperature=1.0)

    def nobody(agent: str) -> str:
        raise RunError(f"eval: agent {agent!r} has no policy (a bug: every seat is assigned)")

    outcomes_of: dict[tuple[str, str], list[Any]] = {}
    for row, s in enumerate(pairs):  # one batched rollout per speaker: memory stays bounded
        slots = [
            EpisodeSlot(
                env=make(scenario, **overrides),
                seed=k,
                group_id=col,
                episode_id=col * len(seeds) + i,
                policies={speaker: f"{s.name}/speaker", listener: f"{ll.name}/listener"},
            )
            for col, ll in enumerate(pairs)
            for i, k in enumerate(seeds)
        ]
        result = run_episodes(
            slots,
            backends,
            nobody,
            sampling,
            seed=seed * 1_000_003 + row,
            scored={f"{p.name}/listener" for p in pairs if p.listener_scored},
        )
        for col, ll in enumerate(pairs):
            outcomes_of[(s.name, ll.name)] = [
                e.success for e, slot in zip(result.episodes, slots) if slot.group_id == col
            ]
    rows = []
    for (s_name, l_name), outcomes in outcomes_of.items():
        if any(o is None for o in outcomes):
            raise RunError(f"eval: --listening needs a success measure; {scenario} has none")
        rate = fmean(outcomes)  # type: ignore[arg-type]
        low, high = wilson(rate * len(outcomes), len(outcomes))
        rows.append(
            {
                "speaker": s_name,
                "listener": l_name,
                "episodes": len(outcomes),
                "success": rate,
                "success_lo": low,
                "success_hi": high,
            }
        )
    return rows


def self_play_gap(cells: Sequence[Mapping[str, Any]], runs: Sequence[str]) -> dict[str, Any]:
    """Each run's success with itself minus its success with the other ``runs`` (its speaker
    with their listeners and their speakers with its listener, averaged over those
    ``2 (R - 1)`` cells of :func:`role_crossplay`), and the mean with a 95% t-interval over the
    runs (each run one value: the seed is the unit). About 0 when the runs share one language
    (any trained speaker works with any trained listener); above 0 when each pair learned a
    convention of its own, which another run's partner does not share. ``runs`` are the trained
    pairs' names (the base model left out); at least two."""
    from marl.analysis.stats import seed_clustered

    if len(runs) < 2:
        raise ValueError("self_play_gap: needs at least two runs")
    success = {(c["speaker"], c["listener"]): float(c["success"]) for c in cells}
    gaps = []
    for run in runs:
        others = [r for r in runs if r != run]
        try:
            own = success[run, run]
            mixed = [success[run, o] for o in others] + [success[o, run] for o in others]
        except KeyError as missing:
            raise ValueError(f"self_play_gap: no cross-play cell {missing.args[0]}") from None
        gaps.append(own - fmean(mixed))
    mean, low, high = seed_clustered([[g] for g in gaps])
    return {"runs": list(runs), "per_run": gaps, "mean": mean, "low": low, "high": high}


def pair_listening(
    pairs: Sequence[Pair],
    scenario: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    episodes: int = 32,
    counterfactuals: int = 8,
    seed: int = 0,
    sampling: Any = None,
    progress: bool = False,
    listener_sampling: Any = None,
    replies: int = 0,
) -> dict[str, dict[str, Any]]:
    """Each pair's exact listening measures with itself: ``{pair: {"summary": {metric:
    {mean, low, high, n}}, "per_scenario": {metric: [...]}, "replies": R}}`` on ``episodes``
    held-out scenarios (the same for every pair), under ``sampling`` as :func:`role_crossplay`;
    the listener scored under ``listener_sampling`` where it differs (a run whose listener
    samples at a temperature of its own, ``policies.listener.temperature``). ``replies`` > 0:
    each of the listener's distributions is read by the scenario's parser from that many of
    its sampled replies instead of scored exactly
    (:func:`marl.analysis.listening.listening_per_scenario`); R is 0 for the exact scoring."""
    from marl.agents.backends import SamplingConfig
    from marl.agents.generation import reply_sampler
    from marl.analysis.listening import hf_scorer, listening_per_scenario
    from marl.scenarios.registry import make

    overrides = dict(overrides or {})
    sampling = sampling or SamplingConfig(max_new_tokens=12, temperature=1.0)
    from marl.runtime.seeding import held_out_seeds

    seeds = held_out_seeds(f"{seed}:listening", episodes)
    out: dict[str, dict[str, Any]] = {}
    parsed = replies > 0
    for p in _progress(pairs, progress):
        result = listening_per_scenario(
            lambda: make(scenario, **overrides),
            seeds,
            reply_sampler(
                {"speaker": p.speaker},
                lambda agent: "speaker",
                sampling,
                seed=seed,
            ),
            None
            if parsed
            else hf_scorer(
                p.listener, sampling=listener_sampling or sampling, scored=p.listener_scored
            ),
            counterfactuals=counterfactuals,
            swap_seed=seed,
            listener_replies=reply_sampler(
                {"listener": p.listener},
                lambda agent: "listener",
                listener_sampling or sampling,
                seed=seed + 1,
                scored={"listener"} if p.listener_scored else frozenset(),
            )
            if parsed
            else None,
            replies=replies,
            spellings=not p.listener_scored,
        )
        out[p.name] = {
            "summary": result.summary(),
            "per_scenario": result.per_scenario,
            "replies": result.replies,
        }
    return out


def _progress(items: Sequence[Any], enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc="listening", unit="pair", disable=not enabled)


def write_tables(
    out: Path, cells: Sequence[dict[str, Any]], listening: Mapping[str, dict[str, Any]]
) -> list[Path]:
    """``crossplay_roles.md`` / ``.csv`` / ``.png`` and ``listening.md`` / ``.json`` in
    ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if cells:
        names = list(dict.fromkeys(c["speaker"] for c in cells))
        by = {(c["speaker"], c["listener"]): c for c in cells}
        lines = [
            "Success by speaker (rows) and listener (columns), 95% Wilson intervals, "
            f"{cells[0]['episodes']} held-out scenarios per cell.",
            "",
            "| speaker \\ listener | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for s in names:
            row = [
                f"{by[s, x]['success']:.2f} [{by[s, x]['success_lo']:.2f}, "
                f"{by[s, x]['success_hi']:.2f}]"
                for x in names
            ]
            lines.append(f"| {s} | " + " | ".join(row) + " |")
        md = out / "crossplay_roles.md"
        md.write_text("\n".join(lines) + "\n")
        csv_path = out / "crossplay_roles.csv"
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(cells[0]))
            writer.writeheader()
            writer.writerows(cells)
        written += [md, csv_path, _heatmap(out / "crossplay_roles.png", names, by)]
    if listening:
        metrics = list(next(iter(listening.values()))["summary"])
        lines = [
            "Exact listening measures of each pair with itself (mean over held-out scenarios, "
            "95% t-interval over scenarios).",
            "",
            "| pair | " + " | ".join(metrics) + " |",
            "|---|" + "---|" * len(metrics),
        ]
        for name, value in listening.items():
            cells_text = []
            for m in metrics:
                s = value["summary"].get(m)
                cells_text.append(
                    "-" if s is None else f"{s['mean']:.2f} [{s['low']:.2f}, {s['high']:.2f}]"
                )
            lines.append(f"| {name} | " + " | ".join(cells_text) + " |")
        md = out / "listening.md"
        md.write_text("\n".join(lines) + "\n")
        js = out / "listening.json"
        js.write_text(json.dumps(json_safe(listening), indent=1))
        written += [md, js]
    return written


def json_safe(x: Any) -> Any:
    """JSON without NaN: a NaN (no swap donor) becomes null."""
    if isinstance(x, float):
        return None if math.isnan(x) else x
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def _heatmap(path: Path, names: Sequence[str], by: Mapping[tuple[str, str], Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [[by[s, x]["success"] for x in names] for s in names]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(names), 1.0 + 0.8 * len(names)))
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("listener")
    ax.set_ylabel("speaker")
    for i in range(len(names)):
        for j in range(len(names)):
            ax.text(j, i, f"{grid[i][j]:.2f}", ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(image, ax=ax, label="success")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
