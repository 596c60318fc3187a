"""Adapters that turn per-prompt callables into the engine's batched ``generate``.

The re-simulation engine asks for completions through one batched callable,
``generate(requests) -> [[text] * request.n for request in requests]`` (see
:data:`marl.credit.counterfactual.Generate`). An LLM backend implements that directly (one
``backend.generate`` call per round); scripted agents are per-prompt functions, wrapped here:

- :func:`bot_generate`: scripted bots with the scenario bot signature
  ``bot(agent, observation, info, rng) -> completion``, one bot for everybody or one per agent,
  optionally a different bot for resamples (for example a stochastic policy whose samples the
  COMA-style baseline averages over).
- :func:`callables_generate`: ``resample(agent, observation, system_prompt, k) -> list[str]``
  for replacement messages and ``respond(agent, observation, system_prompt, info) -> str`` for
  regenerated turns.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marl.credit.counterfactual import Generate, GenerationRequest

__all__ = ["Bot", "bot_generate", "callables_generate"]

Bot = Callable[[str, str, Mapping[str, Any], random.Random], str]
"""A scripted agent: ``(agent, observation, info, rng) -> completion``."""

Resample = Callable[[str, str, str, int], list[str]]
Respond = Callable[[str, str, str, Mapping[str, Any]], str]


def _pick(bots: Bot | Mapping[str, Bot], agent: str, what: str) -> Bot:
    if callable(bots):
        return bots
    if agent not in bots:
        raise KeyError(f"{what}: no bot for agent {agent!r}; bots are given for {sorted(bots)}")
    return bots[agent]


def bot_generate(
    bots: Bot | Mapping[str, Bot],
    seed: int = 0,
    resample_bots: Bot | Mapping[str, Bot] | None = None,
) -> Generate:
    """A batched ``generate`` backed by scripted bots; one ``random.Random(seed)`` serves all
    calls in order, so a run is reproducible. ``resample_bots`` (default: ``bots``) write the
    ``"resample"`` requests, ``bots`` the ``"respond"`` ones."""
    rng = random.Random(seed)

    def generate(requests: Sequence[GenerationRequest]) -> list[list[str]]:
        out = []
        for request in requests:
            source = resample_bots if request.kind == "resample" and resample_bots else bots
            bot = _pick(source, request.agent, f"{request.kind} request")
            info = dict(request.info)
            out.append(
                [bot(request.agent, request.observation, info, rng) for _ in range(request.n)]
            )
        return out

    return generate


def callables_generate(
    resample: Resample | None = None, respond: Respond | None = None
) -> Generate:
    """A batched ``generate`` from per-prompt callables (either may be omitted when the credit
    method never asks for that kind)."""

    def generate(requests: Sequence[GenerationRequest]) -> list[list[str]]:
        out = []
        for request in requests:
            if request.kind == "resample":
                if resample is None:
                    raise ValueError("a resample was requested but no resample callable given")
                texts = list(
                    resample(request.agent, request.observation, request.system_prompt, request.n)
                )
            else:
                if respond is None:
                    raise ValueError("a regenerated turn was requested but no respond callable")
                texts = [
                    respond(request.agent, request.observation, request.system_prompt, request.info)
                    for _ in range(request.n)
                ]
            out.append(texts)
        return out

    return generate
