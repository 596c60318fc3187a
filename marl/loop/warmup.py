"""The imitation warm-up: supervised fine-tuning on transcripts before RL (the "cold start" of
DeepSeek-R1 and ReTool).

A small model that never writes the markup gives RL nothing to learn from: every reply is
malformed, every group has equal returns, every advantage is 0. The warm-up teaches it the
protocol first. Its transcripts come from the scenario's scripted bots (``warmup.bot``) or from
a JSONL file a user supplies (``warmup.data``). ``warmup.bot=format`` (where the scenario has
one) teaches the markup and the style of messages with content drawn at random, never the
answer; ``warmup.bot=rule`` teaches the answer too, which proves nothing about RL.

Each turn becomes ``(prompt ids, response ids)``, the prompt built by the rollout's own builder
(:func:`marl.agents.prompts.turn_prompt`: same chat template, note and response head), and the
loss is the mean negative log-likelihood of the response tokens only: the same mask as RL
(received messages and environment text are prompt).
There is one warm-up per trainable policy, on its own agents' turns; frozen policies are never
touched. Logged under ``warmup/<policy>/*``.

A transcript file has one JSON object per line::

    {"agent": "listener", "system": "<system prompt>", "observation": "<observation text>",
     "completion": "ACTION: red circle"}
"""

from __future__ import annotations

import json
import math
import os
import random
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from marl.agents.heads import response_note, turn_head
from marl.agents.logprobs import response_logprobs
from marl.agents.prompts import turn_prompt, untrusted_ids
from marl.config import Config, ConfigError
from marl.protocols.tools import RESULT_HEAD, find_call
from marl.runtime.learner import MasterWeights
from marl.runtime.seeding import HELD_OUT_SEEDS

MAX_DATA_BYTES = 64 * 1024 * 1024
MAX_LINE_CHARS = 200_000


@dataclass
class ImitationTurn:
    """One reply to imitate: the agent, its prompt text and the completion it should write.

    info:            the environment's info dict the agent was shown (its response head and
                     note come from it, as in the rollout); None for a transcript file's turn.
    response_prefix: the run's ``sampling.response_prefix`` (heads on).
    """

    agent: str
    system: str
    observation: str
    completion: str
    info: Mapping[str, Any] | None = None
    response_prefix: bool = False

    @property
    def head(self) -> str:
        """The response head the rollout puts before the completion (``""`` when none)."""
        return turn_head(self.info, self.response_prefix)

    @property
    def note(self) -> str:
        """The scenario's note for the turn (:func:`marl.agents.heads.response_note`), which the
        prompt puts before the head when there is one."""
        return response_note(self.info)


def bot_turns(config: Config, episodes: int, step: int) -> list[ImitationTurn]:
    """Play ``episodes`` episodes of the configured scenario with ``warmup.bot`` for every
    agent and return every turn that would have been generated (idle turns are skipped)."""
    from marl.scenarios.bots import get_bot
    from marl.scenarios.registry import make

    env = make(config.scenario.name, **config.scenario.overrides)
    w = config.warmup
    bots = {a: get_bot(env.spec.rules, w.bots.get(a, w.bot)) for a in env.possible_agents}
    imitated = set(w.agents or env.possible_agents)
    out: list[ImitationTurn] = []
    for k in range(episodes):
        seed = random.Random(f"{config.seed}:warmup:{step}:{k}").randrange(HELD_OUT_SEEDS)
        rng = random.Random(f"{seed}:warmup-bot")
        observations, infos = env.reset(seed=seed)
        while env.agents:
            actions = {}
            for agent in env.agents:
                completion = bots[agent](agent, observations[agent], infos[agent], rng)
                actions[agent] = completion
                if env.is_idle(agent) or agent not in imitated:
                    continue
                info = infos[agent]
                out.append(
                    ImitationTurn(
                        agent=agent,
                        system=env.system_prompt(agent),
                        observation=observations[agent],
                        completion=_tidy(completion, bool(info.get("needs_action"))),
                        info=dict(info),
                        response_prefix=config.sampling.response_prefix,
                    )
                )
            observations, _, _, _, infos = env.step(actions)
    return out


def _tidy(completion: str, needs_action: bool) -> str:
    """The bot's reply as an LLM should write it: no ``ACTION: wait`` filler when no action is
    due (the environment ignores it; imitating it would teach the model to pad)."""
    if needs_action:
        return completion.strip()
    lines = [ln for ln in completion.splitlines() if not ln.strip().upper().startswith("ACTION")]
    return "\n".join(lines).strip()


def read_transcripts(path: str | Path) -> list[ImitationTurn]:
    """Turns from a JSONL transcript file; a bad line raises ConfigError naming it."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"warmup.data: cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"warmup.data: {path} is not a regular file")
    if info.st_size > MAX_DATA_BYTES:
        raise ConfigError(f"warmup.data: {path} is over {MAX_DATA_BYTES // 2**20} MB")
    turns = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"warmup.data: {path}:{number}"
            if len(line) > MAX_LINE_CHARS:
                raise ConfigError(f"{where}: line is over {MAX_LINE_CHARS} characters")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: expected a JSON object")
            for key in ("agent", "observation", "completion"):
                if not isinstance(row.get(key), str):
                    raise ConfigError(f"{where}: {key!r} must be a string")
            system = row.get("system", "")
            if not isinstance(system, str):
                raise ConfigError(f"{where}: 'system' must be a string")
            turns.append(ImitationTurn(row["agent"], system, row["observation"], row["completion"]))
    if not turns:
        raise ConfigError(f"warmup.data: {path} holds no turns")
    return turns


def encode_turn(tokenizer: Any, turn: ImitationTurn) -> tuple[list[int], list[int]]:
    """``(prompt ids, response ids)``: the prompt the rollout samples from
    (:func:`marl.agents.prompts.turn_prompt`, note and head included), the response the
    completion after the head, ended by the end-of-turn token."""
    ids = turn_prompt(
        tokenizer,
        turn.system,
        turn.observation,
        turn.info,
        response_prefix=turn.response_prefix,
    ).ids
    pieces = _pieces(turn)
    if all(keep for _, keep in pieces):
        text = "".join(piece for piece, _ in pieces)
        response = list(tokenizer.encode(text, add_special_tokens=False))
    else:  # tool output: tokenized apart, as the generation loop inserts it
        response = [i for piece, keep in pieces for i in _piece_ids(tokenizer, piece, keep)]
    if tokenizer.eos_token_id is not None:
        response.append(int(tokenizer.eos_token_id))
    return ids, response


def _pieces(turn: ImitationTurn) -> list[tuple[str, int]]:
    """The completion after its head, cut into runs of lines the agent wrote (1) and tool
    output (0): a ``RESULT`` line right after a ``CALL`` line is what a tool inserted
    (docs/tools.md), never what the agent wrote."""
    text = turn.completion
    if turn.head and text.startswith(turn.head):
        text = text[len(turn.head) :]
    lines = text.splitlines(keepends=True)
    pieces: list[tuple[str, int]] = []
    for i, line in enumerate(lines):
        tool = i > 0 and line.startswith(RESULT_HEAD + " ") and find_call(lines[i - 1]) is not None
        if pieces and pieces[-1][1] == int(not tool):
            pieces[-1] = (pieces[-1][0] + line, pieces[-1][1])
        else:
            pieces.append((line, int(not tool)))
    return pieces


def response_mask(tokenizer: Any, turn: ImitationTurn, response: Sequence[int]) -> list[int]:
    """1 for each token of :func:`encode_turn`'s response the model should imitate, 0 for tool
    output (tokenized as the generation loop inserts it)."""
    pieces = _pieces(turn)
    if all(keep for _, keep in pieces):
        return [1] * len(response)
    mask: list[int] = []
    for piece, keep in pieces:
        mask += [keep] * len(_piece_ids(tokenizer, piece, keep))
    return mask + [1] * (len(response) - len(mask))


def _piece_ids(tokenizer: Any, piece: str, keep: int) -> list[int]:
    if keep:
        return list(tokenizer.encode(piece, add_special_tokens=False))
    return untrusted_ids(tokenizer, piece)


def imitation_loss(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    share_prompts: bool = False,
    masks: Sequence[Sequence[int]] | None = None,
    packed: bool = True,
) -> tuple[torch.Tensor, int]:
    """Mean negative log-likelihood per response token, and the number of tokens.
    ``share_prompts``: identical prompts and common prefixes run once (``algo.share_prompts``;
    the same loss and gradient, :mod:`marl.agents.logprobs`). ``masks``: per response token, 0
    for tokens not to imitate (tool output), which also leave the count. ``packed``: the turns
    in one packed row where the model runs the platform's attention, as the RL update runs them
    (:mod:`marl.agents.packing`; the same loss and gradient), else padded forwards."""
    out = response_logprobs(
        model,
        list(prompts),
        list(responses),
        temperature=1.0,
        top_p=1.0,
        pad_token_id=pad_token_id,
        share_prompts=share_prompts,
        packed=packed,
    )
    logp, mask = out.sampling, out.mask  # (B, T), (B, T)
    mask = mask.to(logp.dtype)
    if masks is not None:
        width = logp.shape[1]
        rows = [list(m[:width]) + [0] * (width - len(m[:width])) for m in masks]
        mask = mask * torch.tensor(rows, dtype=logp.dtype, device=logp.device)  # (B, T)
    tokens = mask.sum()
    return -(logp * mask).sum() / tokens.clamp(min=1.0), int(tokens.item())


class Imitator:
    """The warm-up of one trainable policy: its own AdamW (the RL optimizer is left alone).

    A bf16 model trains through fp32 master weights, exactly as in RL: pass the RL learner's
    ``masters`` so that RL starts from the warmed-up masters (a fresh set otherwise)."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        lr: float,
        batch_size: int,
        autocast: bool,
        masters: MasterWeights | None = None,
        share_prompts: bool = False,
    ) -> None:
        self.model = model
        self.share_prompts = share_prompts
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.autocast = autocast
        self.masters = masters or MasterWeights([p for p in model.parameters() if p.requires_grad])
        self.optimizer = torch.optim.AdamW(self.masters.params, lr=lr, weight_decay=0.0)
        self.pad = tokenizer.pad_token_id or 0

    def step(self, turns: Sequence[ImitationTurn]) -> dict[str, float]:
        """One optimizer step on ``turns`` (gradients accumulated over minibatches)."""
        encoded = [encode_turn(self.tokenizer, t) for t in turns]
        masks = [response_mask(self.tokenizer, t, r) for t, (_, r) in zip(turns, encoded)]
        total_tokens = sum(sum(m) for m in masks)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for start in range(0, len(encoded), self.batch_size):
            batch = encoded[start : start + self.batch_size]
            with _autocast(self.autocast, self.model):
                loss, tokens = imitation_loss(
                    self.model,
                    [p for p, _ in batch],
                    [r for _, r in batch],
                    self.pad,
                    self.share_prompts,
                    masks[start : start + self.batch_size],
                )
            (loss * tokens / max(total_tokens, 1)).backward()
            loss_sum += float(loss.detach()) * tokens
        self.masters.grads_in()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.masters.params, 1.0))
        if math.isfinite(grad_norm):  # a non-finite step is skipped, never applied
            self.optimizer.step()
            self.masters.weights_out()
        self.model.eval()
        return {
            "loss": loss_sum / max(total_tokens, 1),
            "tokens": float(total_tokens),
            "turns": float(len(turns)),
            "grad_norm": grad_norm,
        }

    @torch.no_grad()
    def evaluate(self, turns: Sequence[ImitationTurn]) -> float:
        """The imitation loss on ``turns`` without training (mean NLL per response token)."""
        encoded = [encode_turn(self.tokenizer, t) for t in turns]
        self.model.eval()
        loss, _ = imitation_loss(
            self.model,
            [p for p, _ in encoded],
            [r for _, r in encoded],
            self.pad,
            self.share_prompts,
            [response_mask(self.tokenizer, t, r) for t, (_, r) in zip(turns, encoded)],
        )
        return float(loss)


def _autocast(enabled: bool, model: nn.Module) -> Any:
    """bf16 autocast (``enabled``) on the device of ``model``'s weights, or none."""
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16, enabled=enabled)


def run_warmup(
    config: Config,
    learners: dict[str, Any],
    policy_of: Callable[[str], str],
    log: Callable[[dict[str, float], int], None] | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Warm up every trainable policy (``learners``: policy id -> PolicyLearner) for
    ``warmup.steps`` steps; returns the last step's metrics (``warmup/<policy>/*``)."""
    w = config.warmup
    if w.steps <= 0:
        return {}
    autocast = config.model.dtype == "bfloat16"  # bf16 weights: bf16 compute, fp32 masters
    imitators = {
        pid: Imitator(
            pl.model,
            pl.tokenizer,
            w.lr,
            w.batch_size,
            autocast,
            masters=getattr(getattr(pl, "learner", None), "masters", None),
            share_prompts=config.algo.share_prompts,
        )
        for pid, pl in learners.items()
    }
    data = read_transcripts(w.data) if w.data else None
    metrics: dict[str, float] = {}
    for step in _steps(w.steps, progress):
        if data is not None:
            rng = random.Random(f"{config.seed}:warmup-data:{step}")
            turns = rng.sample(data, min(len(data), w.episodes * 2))
        else:
            turns = bot_turns(config, w.episodes, step)
        metrics = {}
        for pid, imitator in imitators.items():
            mine = [t for t in turns if policy_of(t.agent) == pid]
            if not mine:
                continue
            activate = getattr(learners[pid], "activate", None)  # its adapter, on a shared base
            if activate is not None:
                activate()
            for key, value in imitator.step(mine).items():
                metrics[f"warmup/{pid}/{key}"] = value
        if log is not None:
            log(metrics, step + 1)
    for pl in learners.values():  # the KL (algo.beta) anchors RL to the warmed-up policy
        reset = getattr(getattr(pl, "learner", None), "reset_reference", None)
        if reset is not None:
            reset()
    return metrics


def _steps(total: int, progress: bool) -> Iterator[int]:
    from tqdm.auto import tqdm

    yield from tqdm(range(total), desc="warm-up", unit="step", disable=not progress)
