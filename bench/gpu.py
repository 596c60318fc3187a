"""One GPU (or this CPU): generation, update and training-step throughput of SmolLM2-135M's shape.

Sized to run on one H100 in at most 5 minutes from a checkout and the carried wheels (no Ray, no
vLLM, nothing downloaded; ``ray=disabled``), and here with ``--device cpu`` at smaller sizes:

    source .gpu/setup.sh && python3 bench/gpu.py --model-path /tmp/smol     # a GPU machine
    make bench-gpu                                      # device auto: cuda if torch has one
    .venv/bin/python bench/gpu.py --device cpu --threads 1                   # this CPU

What it measures, in order (each value is in the JSON; the table gives the medians):

1. **Matmul peak.** The best of 5 timings of ``4096^3`` (CUDA: 10 in a row) or ``2048^3`` (CPU)
   matmuls in bf16, and in the run's dtype when that is not bf16, synchronised; measured again
   right after the update, and the better of the two kept.
2. **Generation.** 32 distinct chat prompts of about 190 tokens (a fixed system prompt, then
   seeded words) x ``n`` samples, 64 new tokens, at 16 / 64 / 256 rows (16 prompts x 1, 32 x 2,
   32 x 8), sampled at temperature 1 over the whole vocabulary: our backend
   (:class:`marl.agents.backends.hf.HFBackend`, one ``generate`` call, its default decoding
   loop unless ``--decode``) against transformers' own ``model.generate`` with
   ``cache_implementation="static"`` (on CUDA transformers then compiles the decoding step
   itself, ``mode="reduce-overhead"``: CUDA graphs; if that fails it runs eager and the JSON
   says why) on the same prompts and the same weights (a second copy of the model: our backend
   changes its model's attention function). One untimed call per size and contender first
   (transformers' compilation is in it: the JSON keeps its time), then ``--rounds`` rounds
   alternating the two. Tokens/s counts the tokens really generated (a row stops at its EOS)
   over the call's wall time, synchronised.
3. **Update.** A policy learner of the demo's settings (``configs/demo.yaml``: a LoRA adapter of
   rank 16 on every linear layer, minibatches of 16 turns in microbatches of 8) and its
   :meth:`~marl.runtime.policies.PolicyLearner.update` on the largest size's generations from part 2
   as turn records: the samples of a prompt form a group, with advantages +1, -1, +1, ...
   (nonzero, so every turn trains). Update tokens/s counts every turn's prompt and response
   tokens, as ``bench/trl_vs_marl.py`` does (a prompt shared by 8 samples counts 8 times).
   Positions/s counts what the model really ran (forward hooks: padding included, a shared
   prompt once). The share of the bf16 matmul peak counts nominal matmul FLOPs from those
   hooks: a position run with gradients costs ``4 N + 2 N_trainable`` (forward, backward to the
   activations, the trainable weights' gradients) and one without ``2 N``, with N the body's
   weights for every position and the output layer's only where it ran (the learner computes
   logits for the responses alone); embedding lookups and attention's own FLOPs are left out.
4. **Training steps.** ``marl.loop.train.train`` in this process on the demo's config
   (``marl train --config-name demo`` with ``model.kind=hf model.path=...``) minus the imitation
   warm-up, the held-out evaluation and the influence re-simulation (``warmup.steps=0
   train.eval_episodes=0 emergence.influence_every=0``, as ``bench/make_run_step.py`` does;
   ``--influence`` keeps the demo's), then the same at 256 episodes a step
   (``train.seeds_per_step=32 train.group_size=8``). ``--steps`` steps each; the last is
   reported (on CUDA the first of 2 pays for warming up), split by phase: the ``perf/*`` times
   train() logs (rollout, credit, update, sync, emergence) and ``perf/generated_tokens_per_s``,
   read back from the run's TensorBoard events. ``model.dtype`` and
   ``policy_defaults.num_gpus`` are passed explicitly (bf16 and an equal share of the GPU per
   trainable policy on CUDA; ``--dtype`` and 0 on a CPU), and so is ``ray=disabled``.

On a CPU the defaults are smaller, to finish in a few minutes: 4 and 8 rows of 16 new tokens,
one timed update, one step per run, and a big step of 1 x 8 episodes (``--rows``,
``--new-tokens``, ``--update-rounds``, ``--steps``, ``--big`` set them anywhere). On CUDA,
``--budget-s`` (240 s) skips the parts not yet started by then, so that a slow compilation
cannot push the run past 5 minutes; the table lists what was skipped. The JSON is rewritten
after every part (``complete: false`` until the end), and ``--out DIR`` writes it there too (a
GPU machine's ``$OUT``).

Rewards come from a fixed synthetic source. With random weights (no SmolLM2 weights on a GPU
machine) every episode of a group fails alike and GRPO would skip every update, so the bench
registers a reward-shaping kind, ``bench-synthetic`` (:mod:`marl.scenarios.shaping`): a turn
scores a hash of its completion's text in [0, 1], and ``scenario.overrides`` adds it to the
scenario's reward with weight 1. The scenario's rules and outcome reward are unchanged.

The model: ``--model-path DIR`` (a Hugging Face directory; .gpu/setup.sh writes SmolLM2's shape
with random weights to /tmp/smol); else the embedded SmolLM2-135M-Instruct when ``marl
fetch-model`` converted it (``--random-weights``: its shape with random weights instead); else
SmolLM2's shape with random weights, from the config and tokenizer the embedded model's cache
folder holds. ``--model tiny`` is the tests' tiny model.

Peak memory: ``torch.cuda.max_memory_allocated`` per part on CUDA; on a CPU the process's peak
RSS at the end of each part (it only grows). Writes ``bench/results/gpu.json`` on CUDA and
``bench/results/gpu_cpu.json`` on a CPU (``--name``), with the device (a CPU's name and its
bf16 flags), the torch / transformers / peft versions, the commit and the modified files, the
load average before and after, and the command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import compose, machine, read_scalars, row, write  # noqa: E402
from synthetic_reward import synthetic_overrides  # noqa: E402

# The demo's step without what the brief leaves out (make_run_step.py's HERE, too).
STEP_OVERRIDES = ["warmup.steps=0", "train.eval_episodes=0"]
NO_INFLUENCE = ["emergence.influence_every=0"]
PHASES = ("step", "rollout", "credit", "update", "sync", "emergence")
SYSTEM_PROMPT = (
    "You are an agent in a cooperative game with other agents. Read what you see, then answer "
    "with one short message to your partners and one action. Keep messages short."
)
WORDS = (
    "red green blue yellow circle square triangle star left right near far round two three "
    "four five small large bright dark north south east west river stone tree house road "
    "partner message action round score keep trade offer accept refuse wait share"
).split()
SMOL_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
)


# --------------------------------------------------------------------------- device and model


def resolve_device(name: str) -> str:
    """``auto``: cuda when torch has a GPU, else cpu."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    return name


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> dict[str, bool]:
    """Whether this CPU computes bf16 natively (avx512_bf16, AMX)."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {f: f in flags for f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2")}


def describe(device: str) -> dict[str, Any]:
    """The device and the versions the figures depend on."""
    import peft
    import torch
    import transformers

    out: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "cpu_cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out |= {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_gb": props.total_memory / 1e9,
            "cuda": torch.version.cuda,
            "gpu_count": torch.cuda.device_count(),
        }
    return out


def git_state() -> dict[str, Any]:
    """The checkout's commit and the files that differ from it (None outside git)."""
    import subprocess

    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *cmd],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "modified": status.splitlines() if status else ([] if status == "" else None),
    }


def device_label(info: dict[str, Any]) -> str:
    if info["device"] == "cuda":
        return info["gpu"]
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if info["cpu_flags"].get(f)]
    return f"{info['cpu']} ({info['cpu_cores']} cores; bf16: {', '.join(bf16) or 'none'})"


def random_weights(source: Path, target: Path, seed: int = 0) -> Path:
    """SmolLM2's shape (``source``'s config.json) with random weights, saved to ``target`` with
    ``source``'s tokenizer files, as .gpu/setup.sh builds /tmp/smol."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    model.save_pretrained(target)
    for name in SMOL_TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    return target


def model_overrides(args: argparse.Namespace, scratch: Path) -> tuple[dict[str, Any], str]:
    """The ``model`` config of the run (kind, path; dtype comes later) and what it is, in
    words: ``--model tiny``, ``--model-path``, the embedded model, or random weights of its
    shape."""
    from marl.agents.models import embedded_model_dir, is_complete

    if args.model == "tiny":
        return {"kind": "tiny"}, "the tests' tiny model (random weights)"
    if args.model_path:
        path = Path(args.model_path).expanduser()
        return {"kind": "hf", "path": str(path)}, f"--model-path {path}"
    embedded = embedded_model_dir()
    if is_complete(embedded) and not args.random_weights:
        return {"kind": "hf", "path": str(embedded)}, f"SmolLM2-135M-Instruct ({embedded})"
    if not (embedded / "config.json").is_file() or not (embedded / "tokenizer.json").is_file():
        raise SystemExit(
            f"no SmolLM2 config and tokenizer in {embedded}: run `marl fetch-model` once, or "
            "pass --model-path (a GPU machine: source .gpu/setup.sh, then --model-path /tmp/smol)"
        )
    built = random_weights(embedded, scratch / "smol-random")
    return {"kind": "hf", "path": str(built)}, "SmolLM2-135M's shape, random weights"


# --------------------------------------------------------------------------- timing helpers


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of ``fn()`` between two synchronisations, and its result."""
    synchronize(device)
    began = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - began, out


def reset_peak(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> dict[str, float]:
    """Peak GPU memory since :func:`reset_peak` (CUDA) and the process's peak RSS, in GB."""
    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}
    if device == "cuda":
        import torch

        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return out


# --------------------------------------------------------------------------- 1. generation


def make_prompts(tokenizer: Any, count: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """``count`` distinct chat prompts of about ``tokens`` tokens each (the target drawn within
    5%; a prompt is the shortest that reaches it, or the bare chat when that is longer): the
    fixed system prompt, then seeded words as the observation, through the tokenizer's chat
    template."""
    from marl.agents.prompts import prompt_ids

    rng = random.Random(seed)
    prompts: list[list[int]] = []
    for i in range(count):
        target = round(tokens * rng.uniform(0.95, 1.05))
        words = [f"Observation {i}:"]

        def ids(k: int, words: list[str] = words) -> list[int]:
            return prompt_ids(tokenizer, SYSTEM_PROMPT, " ".join(words[:k]))

        while len(ids(len(words))) < target:  # enough words, then the fewest that reach it
            words += [rng.choice(WORDS) for _ in range(len(words))]
        low, high = 1, len(words)
        while low < high:
            middle = (low + high) // 2
            low, high = (middle + 1, high) if len(ids(middle)) < target else (low, middle)
        prompts.append(ids(low))
    return prompts


def layout(rows: int, distinct: int) -> tuple[int, int]:
    """(prompts, samples each) for ``rows`` rows out of ``distinct`` prompts: every prompt once
    up to ``distinct`` rows, then ``rows // distinct`` samples each."""
    prompts = min(rows, distinct)
    if rows % prompts:
        raise SystemExit(f"--rows: {rows} rows is not a multiple of {prompts} prompts")
    return prompts, rows // prompts


def hf_static_generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    n: int,
    new_tokens: int,
    compile_decoding: bool,
    width: int = 0,
) -> int:
    """transformers' own ``generate`` with a static cache: every prompt repeated ``n`` times,
    left-padded to ``width`` tokens at least (one cache shape for every size: fewer
    recompilations), sampled at temperature 1 over the whole vocabulary. Returns the tokens
    generated (each row up to and including its first EOS)."""
    import torch
    from transformers import GenerationConfig

    rows = [list(p) for p in prompts for _ in range(n)]
    width = max([width] + [len(r) for r in rows])
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (R, P)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # (R, P)
    eos = tokenizer.eos_token_id
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        cache_implementation="static",
        pad_token_id=pad,
        eos_token_id=eos,
        disable_compile=not compile_decoding,
    )
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
        )  # (R, P + T)
    new = out[:, width:].cpu()  # (R, T)
    return sum(_generated(r, eos) for r in new.tolist())


def _generated(tokens: Sequence[int], eos: int) -> int:
    """Tokens a row generated: up to and including its first EOS."""
    return tokens.index(eos) + 1 if eos in tokens else len(tokens)


def generation(
    spec: Any,
    prompts: list[list[int]],
    sizes: Sequence[int],
    new_tokens: int,
    rounds: int,
    device: str,
    compile_decoding: bool = True,
    static: bool = True,
    decode: str | None = None,
    profile: bool = False,
) -> tuple[dict[str, Any], list[list[Any]]]:
    """Our backend against transformers' static-cache ``generate`` at each of ``sizes`` rows,
    alternating, ``rounds`` timed rounds after one untimed call each (``static=False``: ours
    alone; ``decode``: our backend's decoding loop, None for its default; ``profile``: one more
    call of ours at the largest size under the profiler, in ``results["profile"]``). Returns the
    figures per size and the generations of our last call at the largest size (the update's
    turns)."""
    from marl.agents.backends.hf import HFBackend
    from marl.agents.models import load_model

    model, tokenizer = load_model(spec)
    ours = HFBackend(model.to(device), tokenizer, **({"decode": decode} if decode else {}))
    theirs = None
    if static:  # the same weights, untouched by our backend (it sets its attention function)
        theirs = load_model(spec)[0].to(device)
    width = max(len(p) for p in prompts)  # one padded width: one static cache shape
    contenders = Contenders(
        ours, theirs, tokenizer, new_tokens, device, compile_decoding and device == "cuda", width
    )
    results: dict[str, Any] = {}
    for rows in sizes:
        count, n = layout(rows, len(prompts))
        results[str(rows)] = contenders.measure(prompts[:count], n, rounds)
        results[str(rows)]["ours_decode"] = getattr(ours, "decode", "generate")
        results[str(rows)]["ours_graph_error"] = getattr(ours, "graph_error", None)
        m = results[str(rows)]["median"]
        if static:
            print(
                f"  {rows} rows: ours {m['ours']:,.0f} tok/s, transformers static "
                f"{m['static']:,.0f} tok/s",
                flush=True,
            )
    if profile:
        from profiling import profile_call

        count, n = layout(sizes[-1], len(prompts))
        _, results["profile"] = profile_call(
            lambda: contenders.run_ours(prompts[:count], n), device
        )
        results["profile"]["rows"] = sizes[-1]
    return results, contenders.last


class Contenders:
    """Our backend and transformers' static-cache ``generate``, timed on the same prompts."""

    def __init__(
        self,
        ours: Any,
        theirs: Any,
        tokenizer: Any,
        new_tokens: int,
        device: str,
        compiled: bool,
        width: int,
    ) -> None:
        self.ours, self.theirs, self.tokenizer = ours, theirs, tokenizer
        self.new_tokens, self.device, self.compiled = new_tokens, device, compiled
        self.width = width
        self.error: str | None = None
        self.calls = 0
        self.last: list[list[Any]] = []  # our last call's generations, per prompt

    def run_ours(self, prompts: list[list[int]], n: int) -> int:
        from marl.agents.backends import SamplingConfig

        sampling = SamplingConfig(max_new_tokens=self.new_tokens, temperature=1.0, top_p=1.0, n=n)
        self.calls += 1
        self.last = self.ours.generate(prompts, sampling, seed=self.calls)
        return sum(len(g.response_ids) for group in self.last for g in group)

    def run_theirs(self, prompts: list[list[int]], n: int) -> int:
        return hf_static_generate(
            self.theirs, self.tokenizer, prompts, n, self.new_tokens, self.compiled, self.width
        )

    def measure(self, prompts: list[list[int]], n: int, rounds: int) -> dict[str, Any]:
        """One untimed call each, then ``rounds`` rounds (ours, theirs, ours, ...)."""
        reset_peak(self.device)
        warm = {"ours": timed(self.device, lambda: self.run_ours(prompts, n))[0]}
        if self.theirs is not None:
            try:
                warm["static"] = timed(self.device, lambda: self.run_theirs(prompts, n))[0]
            except Exception as exc:  # noqa: BLE001 - a failed compile falls back to eager
                if not self.compiled:
                    raise
                self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(
                    f"  transformers' compiled decoding failed ({self.error}); eager instead",
                    flush=True,
                )
                self.compiled = False
                warm["static"] = timed(self.device, lambda: self.run_theirs(prompts, n))[0]
        runs = {"ours": self.run_ours}
        if self.theirs is not None:
            runs["static"] = self.run_theirs
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, fn in runs.items():
                seconds, tokens = timed(self.device, lambda fn=fn: fn(prompts, n))
                rates[name].append(tokens / seconds)
        return {
            "prompts": len(prompts),
            "samples": n,
            "prompt_tokens": [len(p) for p in prompts],
            "new_tokens": self.new_tokens,
            "tokens_per_s": rates,
            "median": {k: statistics.median(v) for k, v in rates.items() if v},
            "warmup_s": warm,
            "static_compiled": self.compiled,
            "static_compile_error": self.error,
            **peak_memory(self.device),
        }


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- 2. matmul peak


def matmul_peak(device: str, dtype: str, size: int, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` timings of ``size``^3 matmuls in ``dtype`` (10 in a
    row between two synchronisations on CUDA, where one takes a fraction of a millisecond)."""
    import torch

    kind = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    a = torch.randn(size, size, dtype=kind, device=device)  # (n, n)
    b = torch.randn(size, size, dtype=kind, device=device)  # (n, n)
    burst = 10 if device == "cuda" else 1

    def matmuls() -> None:
        for _ in range(burst):
            a @ b

    timed(device, matmuls)  # warm-up
    best = min(timed(device, matmuls)[0] for _ in range(repeats))
    return 2 * size**3 * burst / best


# --------------------------------------------------------------------------- 3. update


class PositionCounter:
    """Counts the positions a model's transformer body and its output layer run, with and
    without gradients (forward pre-hooks; padding included), and turns them into nominal
    matmul FLOPs."""

    def __init__(self, model: Any) -> None:
        from marl.agents.models import transformers_model

        outer = transformers_model(model)  # LlamaForCausalLM
        body = getattr(outer, "model", outer)  # LlamaModel
        head = outer.get_output_embeddings()  # (V, H) weight, tied to the embedding here
        self.counts = {"body": [0, 0], "head": [0, 0]}  # [with grad, without]
        self.handles = [
            body.register_forward_pre_hook(self._body, with_kwargs=True),
            head.register_forward_pre_hook(self._head),
        ]
        embedding = outer.get_input_embeddings().weight
        names = {id(p): n for n, p in model.named_parameters()}
        self.head_params = head.weight.numel()
        self.body_params = sum(
            p.numel()
            for p in model.parameters()
            if "lora_" not in names.get(id(p), "") and p is not embedding and p is not head.weight
        )  # the body's matmuls (norms included, a rounding error); lookups are not matmuls
        self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def _add(self, part: str, positions: int) -> None:
        import torch

        self.counts[part][0 if torch.is_grad_enabled() else 1] += positions

    def _body(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"][..., 0]
        self._add("body", ids.numel())  # (B, L)

    def _head(self, module: Any, args: tuple) -> None:
        self._add("head", args[0].numel() // args[0].shape[-1])  # (B, k, H): B * k positions

    def flops(self) -> float:
        """Matmul FLOPs of what was counted: a position with gradients costs the forward (2 per
        weight), the backward to the activations (2) and the trainable weights' gradients (2
        per trainable weight, charged to the body); one without, the forward alone."""
        (body_grad, body_free), (head_grad, head_free) = self.counts["body"], self.counts["head"]
        with_grad = body_grad * (4 * self.body_params + 2 * self.trainable)
        with_grad += head_grad * 4 * self.head_params
        return with_grad + body_free * 2 * self.body_params + head_free * 2 * self.head_params

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def turn_records(groups: Sequence[Sequence[Any]], policy_id: str, agent: str) -> list[Any]:
    """Our generations as turn records of one policy: each prompt's samples form a group, with
    advantages +1, -1, +1, ... (nonzero: every turn trains)."""
    from marl.protocols.turn import TurnRecord

    turns = []
    for g, group in enumerate(groups):
        for j, sample in enumerate(group):
            turns.append(
                TurnRecord(
                    agent=agent,
                    policy_id=policy_id,
                    group_id=g,
                    episode_id=len(turns),
                    round=1,
                    prompt_ids=list(sample.prompt_ids),
                    response_ids=list(sample.response_ids),
                    logprobs=list(sample.logprobs),
                    mask=[1] * len(sample.response_ids),
                    advantage=1.0 if j % 2 == 0 else -1.0,
                )
            )
    return turns


def update(
    cfg: dict[str, Any],
    groups: Sequence[Sequence[Any]],
    rounds: int,
    device: str,
    profile: bool = False,
) -> dict[str, Any]:
    """Time :meth:`PolicyLearner.update` of the config's first trainable policy on ``groups``
    (our generations) as turn records, ``rounds`` times (on CUDA after one untimed update on a
    minibatch); ``profile``: one more update under the profiler, with where every tensor of
    the learner and every batch lived, in ``["profile"]``."""
    from marl.config import load_config
    from marl.runtime.policies import PolicyLearner
    from marl.runtime.policy_map import plan_for

    config = load_config(cfg)
    plan = plan_for(config)
    pid = plan.trainable[0]
    spec = plan.policies[pid]
    reset_peak(device)
    learner = PolicyLearner(spec, config, device=device if device == "cuda" else None)
    turns = turn_records(groups, pid, spec.agents[0])
    # CUDA: one untimed minibatch first (kernels, allocator); a CPU has nothing to warm
    warm_turns = turns[: config.algo.minibatch_size] if device == "cuda" else []
    warm_s = timed(device, lambda: learner.update(warm_turns))[0] if warm_turns else 0.0
    counter = PositionCounter(learner.model)
    seconds: list[float] = []
    metrics: dict[str, float] = {}
    for _ in range(rounds):
        s, metrics = timed(device, lambda: learner.update(turns))
        seconds.append(s)
    counter.close()
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in turns)
    per_round = {part: [c / rounds for c in counts] for part, counts in counter.counts.items()}
    flops = counter.flops() / rounds
    median = statistics.median(seconds)
    out = {
        "policy": pid,
        "turns": len(turns),
        "prompt_tokens": sum(len(t.prompt_ids) for t in turns),
        "response_tokens": sum(len(t.response_ids) for t in turns),
        "tokens": tokens,
        "positions_with_grad": per_round["body"][0],
        "positions_without_grad": per_round["body"][1],
        "output_layer_positions": per_round["head"],
        "parameters": {
            "body": counter.body_params,
            "output_layer": counter.head_params,
            "trainable": counter.trainable,
        },
        "flops": flops,
        "seconds": seconds,
        "warmup_s": warm_s,
        "median_s": median,
        "tokens_per_s": tokens / median,
        "positions_per_s": sum(per_round["body"]) / median,
        "flops_per_s": flops / median,
        "trained_turns": metrics.get("trained_turns"),
        "optimizer_steps": metrics.get("optimizer_steps"),
        **peak_memory(device),
    }
    if profile:
        from profiling import placement, profile_call, record_batch_devices

        batches, stop = record_batch_devices(learner.model)
        _, out["profile"] = profile_call(lambda: learner.update(turns), device)
        stop()
        out["profile"]["placement"] = placement(learner.learner, batches)
    return out


# --------------------------------------------------------------------------- 4. training steps


def with_reward(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with the synthetic score added to the scenario's reward."""
    scenario = dict(cfg.get("scenario") or {})
    overrides = dict(scenario.get("overrides") or {})
    reward = dict(overrides.get("reward") or {})
    added = synthetic_overrides()["reward"]["shaping"]
    reward["shaping"] = [*(reward.get("shaping") or []), *added]
    scenario["overrides"] = {**overrides, "reward": reward}
    return {**cfg, "scenario": scenario}


def gpu_share(cfg: dict[str, Any], device: str) -> list[str]:
    """``policy_defaults.num_gpus``: on CUDA every trainable policy takes an equal share of the
    one GPU (until ``num_gpus: null`` packs them itself), on a CPU none."""
    if device != "cuda":
        return ["policy_defaults.num_gpus=0"]
    from marl.config import load_config
    from marl.runtime.policy_map import plan_for

    cfg = dict(cfg)
    cfg["policy_defaults"] = {**(cfg.get("policy_defaults") or {}), "num_gpus": 0}
    trainable = len(plan_for(load_config(cfg)).trainable)
    return [f"policy_defaults.num_gpus={1 / max(trainable, 1):.6g}"]


def train_step(cfg: dict[str, Any], device: str, scratch: Path, label: str) -> dict[str, Any]:
    """Run ``marl.loop.train.train`` on ``cfg``; every step's ``perf/*`` times, the generated
    tokens/s of its rollout, what the learners trained, and peak memory."""
    from marl.loop.train import train

    run_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=scratch))
    reset_peak(device)
    began = time.perf_counter()
    train(cfg, run_dir=run_dir)
    wall = time.perf_counter() - began
    curves = read_scalars(run_dir / "tensorboard")
    steps = []
    for i in range(len(curves.get("perf/step_time", []))):
        step = {
            phase: curves[f"perf/{phase}_time"][i]
            for phase in PHASES
            if f"perf/{phase}_time" in curves
        }
        step["generated_tokens_per_s"] = curves["perf/generated_tokens_per_s"][i]
        for tag, values in curves.items():
            if tag.startswith("policies/") and tag.rsplit("/", 1)[1] in (
                "trained_turns",
                "turns",
                "optimizer_steps",
                "n_tokens",
            ):
                step[tag] = values[i]
        steps.append(step)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"steps": steps, "last": steps[-1], "wall_s": wall, **peak_memory(device)}


# --------------------------------------------------------------------------- the run


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument(
        "--model",
        choices=("smollm2", "tiny"),
        default="smollm2",
        help="tiny: the tests' tiny model (a smoke test)",
    )
    p.add_argument("--model-path", help="a Hugging Face model directory (GPU machine: /tmp/smol)")
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="the embedded model's shape with random weights, even when it is there",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="model dtype (default: bfloat16 on CUDA, float32 on a CPU)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=None,
        help="generation rows (default: 16 64 256 on CUDA, 4 8 on a CPU)",
    )
    p.add_argument("--prompts", type=int, default=32, help="distinct prompts")
    p.add_argument("--prompt-tokens", type=int, default=190)
    p.add_argument(
        "--new-tokens",
        type=int,
        default=None,
        help="new tokens a row (default: 64 on CUDA, 16 on a CPU)",
    )
    p.add_argument("--rounds", type=int, default=3, help="timed generation rounds (alternating)")
    p.add_argument(
        "--update-rounds",
        type=int,
        default=None,
        help="timed updates (default: 3 on CUDA, 1 on a CPU)",
    )
    p.add_argument(
        "--decode",
        default=None,
        help="our backend's decoding loop (HFBackend decode=: auto, generate, "
        "static, graph; default: the backend's own, auto)",
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="transformers' static-cache generate without its automatic compile",
    )
    p.add_argument(
        "--matmul-size",
        type=int,
        default=None,
        help="peak matmul size (default: 4096 on CUDA, 2048 on a CPU)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps a run, the last reported (default: 2 on CUDA, where "
        "the first warms up; 1 on a CPU)",
    )
    p.add_argument(
        "--big",
        default=None,
        help="the big step as SEEDSxGROUP (default: 32x8 on CUDA, 1x8 on a CPU)",
    )
    p.add_argument(
        "--influence",
        action="store_true",
        help="keep the demo's influence re-simulation in the training steps",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile one update and one rollout call (torch.profiler): <name>_profile.json",
    )
    p.add_argument("--skip", nargs="*", default=[], choices=PARTS, help="parts to leave out")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip the parts not started by then (default: 240 on CUDA, none on a "
        "CPU), so that a slow compile cannot push the run past 5 minutes",
    )
    p.add_argument(
        "--name",
        default=None,
        help="bench/results/<name>.json (default: gpu on CUDA, gpu_cpu on a CPU)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="also write the JSON here after every part (a GPU machine's $OUT)",
    )
    p.add_argument("overrides", nargs="*", help="more marl train overrides for both steps")
    return p.parse_args(argv)


PARTS = ("generation", "update", "demo", "big")


def defaults(args: argparse.Namespace, device: str) -> argparse.Namespace:
    """Fill the device-dependent defaults: the GPU sizes of the brief, and on a CPU sizes that
    finish in a few minutes."""
    gpu = device == "cuda"
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.rows = args.rows or ([16, 64, 256] if gpu else [4, 8])
    args.new_tokens = args.new_tokens or (64 if gpu else 16)
    args.update_rounds = args.update_rounds or (3 if gpu else 1)
    args.matmul_size = args.matmul_size or (4096 if gpu else 2048)
    args.steps = args.steps or (2 if gpu else 1)
    args.big = args.big or ("32x8" if gpu else "1x8")
    args.budget_s = args.budget_s if args.budget_s is not None else (240.0 if gpu else None)
    args.name = args.name or ("gpu" if gpu else "gpu_cpu")
    return args


class Run:
    """The bench's state between parts: the figures so far, saved after every part."""

    def __init__(self, args: argparse.Namespace, device: str, command: str) -> None:
        self.args, self.device = args, device
        self.profiles: dict[str, Any] = {}  # --profile: by part, written beside the JSON
        self.began = time.perf_counter()
        self.state = machine()
        self.info = describe(device)
        self.data: dict[str, Any] = {
            "args": vars(args),
            "command": command,
            "device": self.info,
            "git": git_state(),
            "skipped": {},
            "complete": False,
            "machine": self.state,  # in every partial save too
        }

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def starts(self, part: str) -> bool:
        """Whether ``part`` runs: not skipped, and the budget not spent."""
        if part in self.args.skip:
            self.data["skipped"][part] = "--skip"
            return False
        budget = self.args.budget_s
        if budget is not None and self.elapsed() > budget:
            self.data["skipped"][part] = f"budget: {self.elapsed():.0f} s > {budget:.0f} s"
            print(f"== {part}: skipped ({self.data['skipped'][part]})", flush=True)
            return False
        print(f"== {part} (at {self.elapsed():.0f} s)", flush=True)
        return True

    def save(self) -> None:
        """The figures so far, to the JSON (and ``--out``), without the table."""
        import json

        from common import RESULTS

        self.data["wall_s"] = self.elapsed()
        profiles = {
            part: self.data[part].pop("profile")
            for part in ("generation", "update")
            if isinstance(self.data.get(part), dict) and "profile" in self.data[part]
        }
        self.profiles.update(profiles)
        files = {f"{self.args.name}.json": {"bench": self.args.name, **self.data}}
        if self.profiles:  # beside the JSON: where one update's and one rollout's time went
            files[f"{self.args.name}_profile.json"] = {
                "bench": self.args.name,
                "device": self.data.get("device"),
                **self.profiles,
            }
        for folder in [RESULTS, *([Path(self.args.out)] if self.args.out else [])]:
            folder.mkdir(parents=True, exist_ok=True)
            for name, payload in files.items():
                (folder / name).write_text(json.dumps(payload, indent=2, default=str) + "\n")

    def finish(self) -> None:
        """The table and the final JSON."""
        self.data["wall_s"] = self.elapsed()
        self.data["complete"] = True
        self.state["load_average_after"] = list(os.getloadavg())
        self.data["machine"] = self.state
        path = write(self.args.name, self.data, summary(self.data, self.info, self.state))
        if self.args.out:
            shutil.copy(path, Path(self.args.out) / path.name)


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The whole bench; returns what it wrote."""
    args = parse(argv)
    import torch

    device = resolve_device(args.device)
    args = defaults(args, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    shown = sys.argv[1:] if argv is None else list(argv)
    bench = Run(args, device, " ".join(["bench/gpu.py", *shown]))
    data = bench.data
    print(f"bench/gpu.py on {device_label(bench.info)}, {args.dtype}", flush=True)
    with tempfile.TemporaryDirectory(prefix="marl-bench-gpu-") as tmp:
        scratch = Path(tmp)
        model, what = model_overrides(args, scratch)
        data["model"] = {**model, "what": what}
        from marl.agents.models import ModelSpec

        spec = ModelSpec(**model, dtype=args.dtype)
        base = [f"model.{k}={v}" for k, v in model.items()] + [
            f"model.dtype={args.dtype}",
            "ray=disabled",
            "logging.progress=false",
            "train.checkpoint_every=0",
            f"train.steps={args.steps}",
            *STEP_OVERRIDES,
            *([] if args.influence else NO_INFLUENCE),
            *([f"runtime.threads={args.threads}"] if args.threads else []),
            *args.overrides,
        ]
        base += gpu_share(compose(base), device)
        data["train_overrides"] = base

        print(f"== matmul peak (at {bench.elapsed():.0f} s)", flush=True)
        dtypes = sorted({"bfloat16", args.dtype})
        peaks = {d: matmul_peak(device, d, args.matmul_size) for d in dtypes}
        data["matmul_peak_flops"] = peaks
        print("  " + ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in peaks.items()))

        groups: list[list[Any]] = []
        generate = bench.starts("generation")
        if generate or "update" not in args.skip:
            prompts = make_prompts(tokenizer_of(model), args.prompts, args.prompt_tokens)
            data["generation"], groups = generation(
                spec,
                prompts,
                args.rows if generate else args.rows[-1:],
                args.new_tokens,
                args.rounds if generate else 0,
                device,
                compile_decoding=not args.no_compile,
                static=generate,
                decode=args.decode,
                profile=args.profile and generate,
            )
            if not generate:
                data.pop("generation")
            _free(device)
            bench.save()
        if groups and bench.starts("update"):
            cfg = compose(
                [*base, "sampling.temperature=1.0", f"sampling.max_new_tokens={args.new_tokens}"]
            )
            data["update"] = update(cfg, groups, args.update_rounds, device, args.profile)
            # the peak again, beside the update: the best of both (a busy CPU lowers one)
            again = {d: matmul_peak(device, d, args.matmul_size) for d in dtypes}
            data["matmul_peak_runs"] = {d: [peaks[d], again[d]] for d in dtypes}
            peaks.update({d: max(peaks[d], again[d]) for d in dtypes})
            u = data["update"]
            print(
                f"  {u['turns']} turns: {u['tokens_per_s']:,.0f} tokens/s, "
                f"{u['flops_per_s'] / peaks['bfloat16']:.3f} of the bf16 peak",
                flush=True,
            )
            _free(device)
            bench.save()
        seeds, group = (int(x) for x in args.big.lower().split("x"))
        for part, extra in (
            ("demo", []),
            ("big", [f"train.seeds_per_step={seeds}", f"train.group_size={group}"]),
        ):
            if not bench.starts(part):
                continue
            cfg = with_reward(compose([*base, *extra]))
            result = train_step(cfg, device, scratch, part)
            result["episodes"] = cfg["train"]["seeds_per_step"] * cfg["train"]["group_size"]
            data[f"{part}_step"] = result
            last = result["last"]
            print(
                f"  {result['episodes']} episodes: step {last['step']:.2f} s ("
                + ", ".join(f"{p} {last[p]:.2f}" for p in PHASES[1:] if p in last)
                + f"), rollout {last['generated_tokens_per_s']:,.0f} generated tokens/s",
                flush=True,
            )
            _free(device)
            bench.save()
    bench.finish()
    return data


def tokenizer_of(model: dict[str, Any]) -> Any:
    """The tokenizer of the ``model`` config (the tiny model's character tokenizer, or the
    directory's)."""
    from transformers import AutoTokenizer

    from marl.agents.models import build_char_tokenizer, prepare_tokenizer

    if model["kind"] == "tiny":
        return prepare_tokenizer(build_char_tokenizer())
    return prepare_tokenizer(AutoTokenizer.from_pretrained(model["path"], local_files_only=True))


def summary(data: dict[str, Any], info: dict[str, Any], state: dict[str, Any]) -> list[dict]:
    """The table's rows."""
    what = f"{data['args']['dtype']}; {data['model']['what']}"
    rows = [row("device", device_label(info), "", what)]
    memory = "peak_gpu_gb" if info["device"] == "cuda" else "peak_rss_gb"
    for size, g in (data.get("generation") or {}).items():
        m = g["median"]
        shape = f"{g['prompts']} prompts x {g['samples']}, {g['new_tokens']} new tokens"
        static = "compiled" if g["static_compiled"] else "eager"
        rows += [
            row(
                f"generate {size} rows: ours",
                m["ours"],
                "tok/s",
                f"{shape}; decode={g.get('ours_decode')}"
                + ("; graph capture failed: eager" if g.get("ours_graph_error") else ""),
            ),
            row(
                f"generate {size} rows: transformers static",
                m["static"],
                "tok/s",
                f"{static}; warm-up {g['warmup_s']['static']:.1f} s",
            ),
            row(
                f"generate {size} rows: ours / static",
                m["ours"] / m["static"],
                "x",
                f"{memory} {g[memory]:.2f}",
            ),
        ]
    peaks = data["matmul_peak_flops"]
    for dtype, flops in peaks.items():
        rows.append(
            row(f"matmul peak {dtype}", flops / 1e12, "TFLOP/s", f"{data['args']['matmul_size']}^3")
        )
    u = data.get("update")
    if u:
        note = (
            f"{u['turns']} turns, {u['tokens']:,} tokens; {u['median_s']:.2f} s; "
            f"{memory} {u[memory]:.2f}"
        )
        rows += [
            row("update tokens/s", u["tokens_per_s"], "tok/s", note),
            row(
                "update positions/s (computed)",
                u["positions_per_s"],
                "pos/s",
                f"{u['positions_with_grad']:,.0f} with grad",
            ),
            row(
                "update share of bf16 matmul peak",
                u["flops_per_s"] / peaks["bfloat16"],
                "",
                f"{u['flops_per_s'] / 1e12:.3g} TFLOP/s of nominal matmul FLOPs",
            ),
        ]
        dtype = data["args"]["dtype"]
        if dtype != "bfloat16":
            rows.append(
                row(f"update share of {dtype} matmul peak", u["flops_per_s"] / peaks[dtype], "")
            )
    for part, title in (("demo_step", "demo step"), ("big_step", "big step")):
        s = data.get(part)
        if not s:
            continue
        last = s["last"]
        trained = sum(v for k, v in last.items() if k.endswith("/trained_turns"))
        rows.append(
            row(
                f"{title} ({s['episodes']} episodes)",
                last["step"],
                "s",
                f"step {len(s['steps'])} of {len(s['steps'])}; {trained:.0f} turns "
                f"trained; {memory} {s[memory]:.2f}",
            )
        )
        rows += [
            row(f"{title}: {phase}", last[phase], "s") for phase in PHASES[1:] if phase in last
        ]
        rows.append(
            row(f"{title}: rollout generated tokens/s", last["generated_tokens_per_s"], "tok/s")
        )
    for part, why in data["skipped"].items():
        rows.append(row(f"{part}: skipped", "-", "", why))
    rows.append(
        row(
            "load average",
            state["load_average"][0],
            "",
            f"-> {state['load_average_after'][0]:.2f} at the end; wall {data['wall_s']:.0f} s",
        )
    )
    return rows


def main() -> None:
    run()


if __name__ == "__main__":
    main()
