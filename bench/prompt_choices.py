"""What each prompting choice does to SmolLM2-135M on signal, before any training.

For signal-v0 and signal-v1, with and without the response head (``sampling.response_prefix``),
it plays N episodes with the base model through the real rollout runner and reports:
the share of speaker replies that send a message, the share whose message names the target,
the share of listener replies that parse (an ``ACTION:`` line with a valid pick), and the
success rate. A second table gives the listener's accuracy when it is handed the correct
message, to separate "the speaker says nothing useful" from "the listener cannot read it".

    .venv/bin/python bench/prompt_choices.py [--episodes 48]

Writes bench/results/prompt_choices.json and prints a Markdown table (docs/communication.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from statistics import fmean

import torch

from marl.agents.backends.base import SamplingConfig
from marl.agents.backends.hf import HFBackend
from marl.agents.heads import head_ids, response_head
from marl.agents.models import ModelSpec
from marl.agents.prompts import prompt_ids
from marl.runtime.rollout import EpisodeSlot, run_episodes
from marl.scenarios.registry import make

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402  (bench helpers)

ROOT = Path(__file__).resolve().parent.parent
CHOICES = [("signal-v0", False), ("signal-v0", True), ("signal-v1", False), ("signal-v1", True)]


def target_name(env) -> str:  # noqa: ANN001
    """The target's name ("green circle")."""
    return " ".join(env.rules.candidates[env.rules.target])


def play(backend: HFBackend, scenario: str, prefix: bool, n: int, sampling: SamplingConfig) -> dict:
    """N episodes with the base model; the rates of the module docstring."""
    slots = [EpisodeSlot(make(scenario), 1000 + i, i, i) for i in range(n)]
    began = time.time()
    sampling = replace(sampling, response_prefix=prefix)
    rollout = run_episodes(slots, {"p": backend}, lambda a: "p", sampling, seed=1)
    speaker = [t for t in rollout.turns if t.agent == "speaker"]
    listener = [t for t in rollout.turns if t.agent == "listener"]
    sent = [bool(s.env.log[0].delivered) for s in slots]
    named = [any(target_name(s.env) in m.text for m in s.env.log[0].delivered) for s in slots]
    return {
        "speaker_sends": fmean(sent),
        "message_names_target": fmean(named),
        "speaker_parse_ok": fmean(t.parse_ok for t in speaker),
        "listener_parse_ok": fmean(t.parse_ok for t in listener),
        "success": fmean(s.env.rules.success() or 0.0 for s in slots),
        "seconds": time.time() - began,
    }


def listener_given_truth(
    backend: HFBackend, scenario: str, prefix: bool, n: int, sampling: SamplingConfig
) -> float:
    """The listener's success when the speaker's message is the target's name."""
    envs = [make(scenario) for _ in range(n)]
    successes = []
    prompts, heads = [], []
    for i, env in enumerate(envs):
        env.reset(seed=1000 + i)
        obs, _, _, _, infos = env.step(
            {"speaker": f"SAY: {target_name(env)}", "listener": "ACTION: wait"}
        )
        head = response_head(infos["listener"]) if prefix else ""
        ids = prompt_ids(backend.tokenizer, env.system_prompt("listener"), obs["listener"])
        prompts.append(ids + head_ids(backend.tokenizer, head))
        heads.append(head)
    generations = backend.generate(prompts, sampling, seed=2)
    for env, head, options in zip(envs, heads, generations):
        env.step({"speaker": "ACTION: wait", "listener": head + options[0].text})
        successes.append(env.rules.success() or 0.0)
    return fmean(successes)


def main() -> None:
    """Run every choice and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.8)
    args = parser.parse_args()
    torch.manual_seed(0)
    backend = HFBackend(ModelSpec(kind="embedded", dtype="bfloat16"))
    sampling = SamplingConfig(max_new_tokens=12, temperature=args.temperature)
    rows = []
    for scenario, prefix in CHOICES:
        row = {"scenario": scenario, "response_prefix": prefix}
        row.update(play(backend, scenario, prefix, args.episodes, sampling))
        row["listener_success_given_truth"] = listener_given_truth(
            backend, scenario, prefix, args.episodes, sampling
        )
        rows.append(row)
        print(row, flush=True)
    lines = [
        "| scenario | head | speaker sends | message names target | listener parses | "
        "success | listener success given the true message |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {'yes' if r['response_prefix'] else 'no'} | "
            f"{r['speaker_sends']:.2f} | {r['message_names_target']:.2f} | "
            f"{r['listener_parse_ok']:.2f} | {r['success']:.2f} | "
            f"{r['listener_success_given_truth']:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    load = os.getloadavg()
    print(f"{args.episodes} episodes per row; load average {load[0]:.1f}")
    out = ROOT / "bench/results/prompt_choices.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    state = machine()
    print(f"machine: {state['line']}")
    payload = {"args": vars(args), "rows": rows, "load": load, "machine": state}
    out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
