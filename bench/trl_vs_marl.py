"""Our GRPO iteration and update against TRL's ``GRPOTrainer``, side by side on one machine.

Both contenders train SmolLM2-135M-Instruct (``--model embedded``, the default) on the same
real ``signal-v0`` prompts (the first prompt of each agent that must act in round 1, through the
model's chat template), with the same completion budget (``--max-new-tokens``), the same number
of completions per step (``--prompts`` x ``--generations``), the same reward function, GRPO
advantages normalised per group, no KL term, and ONE optimizer step per iteration:

- **marl**: ``HFBackend.generate`` (one batched call, ``n`` samples per prompt, shared prefill),
  then ``Learner.update`` with one minibatch of every completion;
- **trl**: ``GRPOTrainer.train`` with ``per_device_train_batch_size`` = completions per step,
  ``num_generations`` = ``--generations``, ``gradient_accumulation_steps=1``,
  ``loss_type="grpo"``, ``beta=0``.

Per iteration it records the wall time, the generation time (ours: the ``generate`` call;
TRL's: its ``_generate_and_score_completions``), the update time (the rest), the prompt and
completion tokens, and the process's peak RSS. Each contender runs in its own subprocess
(``--iterations`` timed iterations after ``--warmup`` untimed ones), and the two take turns
``--rounds`` times (marl, trl, marl, trl, ...); the table gives per contender the minimum and the
median of the per-round medians, and the ratios. ``--dtype bfloat16`` runs ours with bf16 weights
and fp32 master weights, and TRL with ``bf16=True`` (autocast over fp32 weights): each at its
best CPU setting. Torch threads: ``--threads`` (1 is fastest on a busy 2-core machine).

The update's achieved FLOP/s is reported as a share of this machine's matmul peak in the same
dtype, measured in the same run (a 2048^3 matmul, best of 5): nominal training FLOPs,
``6 x parameters x (prompt + completion tokens)``, over the update time. Ours computes a
shared prompt once, so its nominal figure counts work it skipped: an effective rate.

TRL is not in the default install: ``pip install -e ".[bench]"``. Measure on a quiet machine:

    .venv/bin/python bench/trl_vs_marl.py                         # SmolLM2, fp32
    .venv/bin/python bench/trl_vs_marl.py --dtype bfloat16
    .venv/bin/python bench/trl_vs_marl.py --model tiny --iterations 1 --rounds 1   # smoke test

Writes ``bench/results/trl_vs_marl.json`` (``trl_vs_marl_bfloat16.json`` with ``--dtype bfloat16``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, row, write  # noqa: E402

CONTENDERS = ("marl", "trl")


def reward(text: str) -> float:
    """The reward both contenders train on: the markup counts, then distinct words (0..1)."""
    score = 0.5 if "SAY:" in text or "ACTION:" in text else 0.0
    return score + 0.5 * min(1.0, len(set(text.split())) / 8)


def signal_chats(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` (system prompt, observation) pairs: round 1 of signal-v0 at successive seeds,
    every agent that must act."""
    import marl
    from marl.runtime.workers import step_seeds

    chats: list[tuple[str, str]] = []
    step = 0
    while len(chats) < count:
        for s in step_seeds(seed, step, count):
            env = marl.make("signal-v0")
            observations, _ = env.reset(seed=s)
            for agent in env.agents:
                if not env.is_idle(agent) and len(chats) < count:
                    chats.append((env.system_prompt(agent), observations[agent]))
        step += 1
    return chats


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from marl.agents.models import ModelSpec, load_model

    # fp32 weights for TRL (its bf16 is autocast); ours holds bf16 weights with fp32 masters
    dtype = args.dtype if args.contender == "marl" else "float32"
    return load_model(ModelSpec(kind=args.model, dtype=dtype))


def matmul_peak(dtype: str, threads: int, size: int = 2048) -> float:
    """FLOP/s of the best of 5 ``size``^3 matmuls in ``dtype`` with ``threads`` torch threads."""
    import torch

    torch.set_num_threads(threads)
    kind = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    a = torch.randn(size, size, dtype=kind)  # (n, n)
    b = torch.randn(size, size, dtype=kind)  # (n, n)
    a @ b  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(5))
    return 2 * size**3 / best


def _timed(fn: Any) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def run_marl(args: argparse.Namespace) -> list[dict[str, float]]:
    """Iterations of our generate + update; per iteration timings and token counts."""
    import torch

    from marl.agents.backends import SamplingConfig
    from marl.agents.backends.hf import HFBackend
    from marl.agents.prompts import prompt_ids
    from marl.protocols.turn import TurnRecord
    from marl.runtime.learner import Learner, LearnerSettings

    model, tokenizer = _load(args)
    backend = HFBackend(model, tokenizer)
    prompts = [prompt_ids(tokenizer, s, o) for s, o in signal_chats(args.prompts)]
    g = args.generations
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, n=g)
    learner = Learner(
        model,
        LearnerSettings(
            lr=args.lr,
            beta=0.0,
            minibatch_size=args.prompts * g,
            sampling=sampling,
        ),
        pad_token_id=tokenizer.pad_token_id,
    )
    out = []
    for it in range(args.warmup + args.iterations):
        began = time.perf_counter()
        groups = backend.generate(prompts, sampling, seed=it)
        generated = time.perf_counter()
        turns = []
        for i, group in enumerate(groups):
            rewards = torch.tensor([reward(x.text) for x in group])  # (G,)
            advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)  # (G,)
            for j, x in enumerate(group):
                turn = TurnRecord(
                    "agent",
                    "shared",
                    i,
                    i * g + j,
                    0,
                    x.prompt_ids,
                    x.response_ids,
                    x.logprobs,
                    [1] * len(x.response_ids),
                )
                turn.advantage = float(advantages[j])
                turns.append(turn)
        metrics = learner.update(turns)
        done = time.perf_counter()
        if it >= args.warmup:
            out.append(
                {
                    "step_s": done - began,
                    "generate_s": generated - began,
                    "update_s": done - generated,
                    "prompt_tokens": float(sum(len(t.prompt_ids) for t in turns)),
                    "completion_tokens": float(sum(len(t.response_ids) for t in turns)),
                    "optimizer_steps": metrics["optimizer_steps"],
                }
            )
    return out


def run_trl(args: argparse.Namespace) -> list[dict[str, float]]:
    """Iterations of TRL's GRPOTrainer; per step timings and token counts."""
    import tempfile

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = _load(args)
    chats = signal_chats(args.prompts)
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "system", "content": s}, {"role": "user", "content": o}]}
            for s, o in chats
        ]
    )

    def reward_fn(completions: list[Any], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(t) for t in texts]

    steps = args.warmup + args.iterations
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=args.prompts * args.generations,
            num_generations=args.generations,
            gradient_accumulation_steps=1,
            max_completion_length=args.max_new_tokens,
            temperature=args.temperature,
            learning_rate=args.lr,
            beta=0.0,
            loss_type="grpo",
            num_iterations=1,
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=args.dtype == "bfloat16",
            seed=0,
            disable_dropout=True,
            dataloader_num_workers=0,
        )
        times: dict[str, list[float]] = {"step": [], "generate": []}

        class StepTimer(TrainerCallback):
            def on_step_begin(self, *a: Any, **k: Any) -> None:
                self.began = time.perf_counter()

            def on_step_end(self, *a: Any, **k: Any) -> None:
                times["step"].append(time.perf_counter() - self.began)

        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_fn,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        generate = trainer._generate_and_score_completions

        def timed_generate(*a: Any, **k: Any) -> Any:
            began = time.perf_counter()
            result = generate(*a, **k)
            times["generate"].append(time.perf_counter() - began)
            return result

        trainer._generate_and_score_completions = timed_generate  # timing only
        trainer.train()
        logs = [e for e in trainer.state.log_history if "loss" in e]
    out = []
    previous_tokens = 0.0
    for it in range(steps):
        log = logs[it] if it < len(logs) else {}
        tokens = float(log.get("num_tokens", 0.0))
        completion = float(log.get("completions/mean_length", 0.0))
        completions = args.prompts * args.generations
        if it >= args.warmup:
            out.append(
                {
                    "step_s": times["step"][it],
                    "generate_s": times["generate"][it],
                    "update_s": times["step"][it] - times["generate"][it],
                    "prompt_tokens": tokens - previous_tokens - completion * completions,
                    "completion_tokens": completion * completions,
                }
            )
        previous_tokens = tokens
    return out


def worker(args: argparse.Namespace) -> None:
    """One contender in this (sub)process; prints its JSON on the last line."""
    import torch

    torch.set_num_threads(args.threads)
    runs = run_marl(args) if args.contender == "marl" else run_trl(args)
    params = sum(p.numel() for p in _load(args)[0].parameters())
    print(json.dumps({"iterations": runs, "peak_rss_gb": _peak_rss_gb(), "parameters": params}))


def _per_round(
    iterations: list[dict[str, float]], args: argparse.Namespace, params: int, peak: float
) -> dict[str, float]:
    """Medians over one round's iterations, plus throughput and the share of the matmul peak."""
    med = {k: statistics.median(x[k] for x in iterations) for k in iterations[0]}
    tokens = med["prompt_tokens"] + med["completion_tokens"]
    med["turns_per_s"] = args.prompts * args.generations / med["step_s"]
    med["update_tokens_per_s"] = tokens / med["update_s"] if med["update_s"] > 0 else 0.0
    med["update_flops_share_of_peak"] = 6 * params * med["update_tokens_per_s"] / peak
    return med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    p.add_argument("--generations", type=int, default=4, help="completions per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations per run")
    p.add_argument("--iterations", type=int, default=2, help="timed iterations per run")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the two contenders")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--contender", choices=CONTENDERS, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.contender:
        worker(args)
        return
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit('trl_vs_marl: TRL is not installed; pip install -e ".[bench]"')
    state = machine()
    peak = matmul_peak(args.dtype, args.threads)
    state["matmul_peak_flops"] = peak
    rounds: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    forwarded = list(sys.argv[1:])
    for _ in range(args.rounds):
        for contender in CONTENDERS:
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            done = subprocess.run(
                [sys.executable, __file__, *forwarded, "--contender", contender],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-4000:])
                sys.exit(f"trl_vs_marl: the {contender} run failed")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            per_round = _per_round(result["iterations"], args, result["parameters"], peak)
            rounds[contender].append({**per_round, "peak_rss_gb": result["peak_rss_gb"]})
    state["load_average_after"] = machine()["load_average"]
    summary: list[dict[str, Any]] = []
    figures = {}
    for contender, per_round in rounds.items():
        figures[contender] = {
            key: {
                "min": min(r[key] for r in per_round),
                "median": statistics.median(r[key] for r in per_round),
            }
            for key in per_round[0]
        }
        f = figures[contender]
        summary += [
            row(f"{contender}: step", f["step_s"]["median"], "s", f"min {f['step_s']['min']:.3g}"),
            row(f"{contender}: generate", f["generate_s"]["median"], "s"),
            row(
                f"{contender}: update",
                f["update_s"]["median"],
                "s",
                f"{f['update_tokens_per_s']['median']:.0f} tokens/s",
            ),
            row(f"{contender}: peak RSS", f["peak_rss_gb"]["median"], "GB"),
            row(
                f"{contender}: update FLOP/s, share of the matmul peak",
                f["update_flops_share_of_peak"]["median"],
                "",
                f"nominal 6 N tokens; peak {peak / 1e9:.0f} GFLOP/s {args.dtype}",
            ),
        ]
    ours, theirs = figures["marl"], figures["trl"]
    summary += [
        row(
            "step: trl / marl",
            theirs["step_s"]["median"] / ours["step_s"]["median"],
            "x",
            "agent turns per second, ours over TRL's",
        ),
        row(
            "update tokens/s: marl / trl",
            ours["update_tokens_per_s"]["median"]
            / max(theirs["update_tokens_per_s"]["median"], 1e-9),
            "x",
        ),
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"{args.dtype}, {args.threads} thread(s), model {args.model}",
        ),
    ]
    write(
        "trl_vs_marl" + ("" if args.dtype == "float32" else f"_{args.dtype}"),
        {"args": vars(args), "rounds": rounds, "figures": figures, "machine": state},
        summary,
    )


if __name__ == "__main__":
    main()
