"""Who plays in ``marl eval``: player specs parsed, and checkpoints, league snapshots and model
presets loaded into backends (:mod:`marl.competition.crossplay` plays them against each other,
:mod:`marl.competition.role_eval` by role).

A checkpoint is data (docs/security.md): its saved config is read through
:func:`checkpoint_config`, which never imports a ``rules_module`` the checkpoint names, and its
weights must fit the model its config names (:func:`check_weight_shapes`), one line otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from marl.errors import RunError

__all__ = [
    "BOT_PREFIX",
    "MODEL_PREFIX",
    "Player",
    "build_backends",
    "check_weight_shapes",
    "checkpoint_config",
    "model_preset",
    "parse_players",
]

BOT_PREFIX = "bot:"
MODEL_PREFIX = "model:"


@dataclass
class Player:
    """One entrant: a checkpoint's policy, an untrained model preset, or a scripted bot."""

    name: str
    kind: str  # "checkpoint", "snapshot", "model" or "bot"
    path: str | None = None
    policy: str | None = None
    bot: str | None = None
    model: dict[str, Any] = field(default_factory=dict)  # the ModelSpec fields


def parse_players(specs: Sequence[str], rules: str | None = None) -> list[Player]:
    """Players from their command-line spellings (see the module docstring). A path that does
    not exist and is not a bot of ``rules`` is refused, naming it; so is an unknown bot or
    model preset. Names must be unique."""
    from marl.scenarios.bots import bot_names
    from marl.scenarios.registry import list_scenarios

    list_scenarios()  # loads the built-in rules and their bots
    bots = set(bot_names(rules)) if rules is not None else {"random"}
    players: list[Player] = []
    labelled: list[bool] = []
    for spec in specs:
        label, _, body = spec.rpartition("=") if "=" in spec else ("", "", spec)
        labelled.append(bool(label))
        if body.startswith(BOT_PREFIX) or (body in bots and not Path(body).exists()):
            name = body[len(BOT_PREFIX) :] if body.startswith(BOT_PREFIX) else body
            if name not in bots:
                where = f"for rules {rules!r}" if rules else "(no scenario to look bots up in)"
                raise RunError(
                    f"eval: unknown bot {name!r} {where}; known: {', '.join(sorted(bots))}"
                )
            players.append(Player(label or name, "bot", bot=name))
        elif body.startswith(MODEL_PREFIX):
            preset = body[len(MODEL_PREFIX) :]
            players.append(Player(label or preset, "model", model=model_preset(preset)))
        else:
            path, _, policy = body.partition("#")
            if not Path(path).exists():
                hint = f"; bots for rules {rules!r}: {', '.join(sorted(bots))}" if rules else ""
                if "/" in path or "#" in body:
                    raise RunError(f"eval: checkpoint not found: {path}{hint}")
                raise RunError(
                    f"eval: {body!r} is neither a checkpoint directory here nor a bot{hint} "
                    f"(bot:<name>) nor a model preset (model:<preset>)"
                )
            if Path(path).is_file() and Path(path).suffix == ".pt":
                players.append(Player(label or _snapshot_name(Path(path)), "snapshot", path))
                continue
            players.append(
                Player(label or _default_name(Path(path)), "checkpoint", path, policy or None)
            )
    players = _number_repeats(players, labelled)
    names = [p.name for p in players]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RunError(
            f"eval: two players are called {duplicates[0]!r}; give them labels of their own, "
            f"label=player (a=runs/x, b=runs/y#policy, c=bot:rule, d=model:tiny)"
        )
    if len(players) < 2:
        raise RunError(f"eval: name at least two players, got {len(players)}")
    return players


def _default_name(path: Path) -> str:
    """``run/checkpoints/step_000010`` -> ``run@10``; ``run/checkpoints`` or ``run`` -> ``run``."""
    parts = path.resolve().parts
    if parts[-1].startswith("step_"):
        run = parts[-3] if len(parts) >= 3 and parts[-2] == "checkpoints" else parts[-2]
        return f"{run}@{int(parts[-1][5:])}"
    return parts[-2] if parts[-1] == "checkpoints" else parts[-1]


def _snapshot_name(path: Path) -> str:
    """``run/league/snapshot_0.pt`` -> ``run@0``."""
    parts = path.resolve().parts
    step = path.stem.removeprefix("snapshot_")
    return f"{parts[-3]}@{step}" if len(parts) >= 3 else path.stem


def _load_snapshot_player(player: Player) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model spec fields, weights) of a league snapshot: the model of ``<run>/config.yaml``."""
    import torch

    path = Path(player.path)  # type: ignore[arg-type]
    config_file = path.parent.parent / "config.yaml"
    if path.parent.name == "league" and not config_file.is_file():
        raise RunError(
            f"eval: {path} sits in a run's league folder, but there is no {config_file} to "
            "read its model from"
        )
    if path.parent.name != "league":
        hint = (
            f"; for this checkpoint, name its step folder ({path.parent})"
            if path.name == "state.pt"
            else ""
        )
        raise RunError(
            f"eval: {path} is a file, not a checkpoint: name a run, its checkpoints folder or a "
            "step_N folder (which holds state.pt and manifest.json), or a league snapshot "
            f"<run>/league/snapshot_N.pt{hint}"
        )
    from marl.runtime.checkpoint import load_tensor_file
    from marl.scenarios.problems import ScenarioError
    from marl.scenarios.reader import read_yaml

    try:
        config = read_yaml(config_file)  # bounded, safe: the run directory is data
    except ScenarioError as exc:
        raise RunError(f"eval: cannot read {config_file}: {exc.problems[0]}") from None
    weights = load_tensor_file(path, "eval")
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise RunError(f"eval: {path} is not a league snapshot (a mapping of tensors)")
    model = config.get("model") if isinstance(config, dict) else None
    return ({} if model is None else model), weights


def model_preset(preset: str) -> dict[str, Any]:
    """The ``configs/model`` preset ``preset`` as a mapping (``model:tiny``, ``model:smollm2``);
    an unknown one is one line listing the known presets."""
    from importlib.resources import files

    import yaml

    from marl.scenarios.problems import short

    folder = files("marl.configs") / "model"
    known = sorted(e.name[:-5] for e in folder.iterdir() if e.name.endswith(".yaml"))
    if preset not in known:  # a name, never a path: model:../../x names no preset
        raise RunError(f"eval: unknown model preset {short(preset)}; known: {', '.join(known)}")
    return dict(yaml.safe_load((folder / f"{preset}.yaml").read_text()) or {})


# --------------------------------------------------------------------------- loading


def _load_checkpoint_player(player: Player) -> tuple[Any, dict[str, Any], str]:
    """(model spec fields as saved, weights, the config key they were read from) of a
    checkpoint player."""
    from marl.runtime.checkpoint import load_checkpoint

    state = load_checkpoint(player.path, command="eval")  # type: ignore[arg-type]
    policies = state.get("policies", {})
    if player.policy is None:
        if len(policies) != 1:
            raise RunError(
                f"eval: {player.path} holds policies {sorted(policies)}; pick one with "
                f"{player.path}#<policy>"
            )
        player.policy = next(iter(policies))
    if player.policy not in policies:
        raise RunError(
            f"eval: {player.path} has no policy {player.policy!r} (it has {sorted(policies)})"
        )
    policy = policies[player.policy]
    if policy.get("kind", "full") != "full":
        raise RunError(
            f"eval: {player.path}#{player.policy} is a LoRA adapter; marl eval plays full-model "
            "policies only"
        )
    config = state.get("config") or {}
    if not isinstance(config, dict):
        raise RunError(f"eval: {player.path}: its saved config is not a mapping")
    model, key = config.get("model") or {}, "config.model"
    declared = config.get("policies") or {}
    declared = declared.get(player.policy) if isinstance(declared, dict) else None
    if isinstance(declared, dict) and declared.get("model"):
        model, key = declared["model"], f"config.policies.{player.policy}.model"
    return model, policy["weights"], key


def build_backends(players: Sequence[Player], backend: str = "hf") -> dict[str, Any]:
    """One generation backend per model player (checkpoints loaded with their weights)."""
    from marl.agents.backends import make_backend
    from marl.agents.models import ModelSpec, load_model
    from marl.runtime.checkpoint import saved_model_spec

    backends = {}
    for player in players:
        if player.kind == "bot":
            continue
        if player.kind == "checkpoint":  # a checkpoint's config is data: checked before use
            fields, weights, key = _load_checkpoint_player(player)
            spec = saved_model_spec(fields, player.path, key, weights)  # type: ignore[arg-type]
        elif player.kind == "snapshot":
            fields, weights = _load_snapshot_player(player)
            config_file = Path(player.path).parent.parent / "config.yaml"  # type: ignore[arg-type]
            spec = saved_model_spec(fields, config_file, "model", weights)
        else:  # a preset of configs/model, shipped with marl
            spec, weights = ModelSpec(**player.model), None
        model, tokenizer = load_model(spec)
        if weights is not None:
            _load_weights(model, weights, player)
        backends[player.name] = make_backend(backend, model=model, tokenizer=tokenizer)
    return backends


def _load_weights(model: Any, weights: dict[str, Any], player: Player) -> None:
    """Load a player's weights; a tied output layer may be missing (snapshots send it once).
    Weights of another shape than the model's are one line naming the first tensor."""
    check_weight_shapes(model, weights, f"eval: the weights of {player.name} ({player.path})")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        shown = (missing or unexpected)[:3]
        raise RunError(
            f"eval: the weights of {player.name} ({player.path}) do not fit its model: "
            f"{len(missing)} missing and {len(unexpected)} unexpected tensors, e.g. {shown}"
        )
    if tied:
        model.tie_weights()


def check_weight_shapes(model: Any, weights: dict[str, Any], what: str) -> None:
    """Raise one :class:`RunError` line (``what`` first) when a tensor of ``weights`` has
    another shape than the model's tensor of that name, before ``load_state_dict`` would."""
    from marl.runtime.state_check import tensor_problem

    for name, value in weights.items():
        problem = tensor_problem(value)
        if problem:
            raise RunError(f"{what} cannot be loaded: {name} {problem}")
    own = model.state_dict()
    wrong = [
        name
        for name, value in weights.items()
        if name in own and tuple(getattr(value, "shape", ())) != tuple(own[name].shape)
    ]
    if wrong:
        first = wrong[0]
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise RunError(
            f"{what} do not fit its model: {first} is {list(weights[first].shape)} in the "
            f"weights, {list(own[first].shape)} in the model its config names{more}"
        )


def _number_repeats(players: list[Player], labelled: Sequence[bool]) -> list[Player]:
    """The same bot or model preset named more than once without a label (``rule rule``)
    becomes ``rule-1``, ``rule-2``: the same player in two seats of the matrix. Checkpoints are
    never renamed (two runs that share a name need labels the user chooses)."""
    names = [p.name for p in players]
    out = list(players)
    for name in {n for n in names if names.count(n) > 1}:
        same = [i for i, p in enumerate(players) if p.name == name]
        if all(not labelled[i] and players[i].kind in ("bot", "model") for i in same):
            for number, i in enumerate(same, 1):
                out[i] = replace(players[i], name=f"{name}-{number}")
    return out


_NOTED: set[tuple[str, str, str]] = set()


def checkpoint_config(
    config: object, source: str | Path, rules_module: str | None = None
) -> dict[str, Any]:
    """A checkpoint's saved run config, safe to build a scenario from: it never chooses code.

    A checkpoint is data (docs/security.md), so a ``rules_module`` it names (in
    ``scenario.rules_module``, in ``scenario.overrides``, or in the scenario file its
    ``scenario.name`` points at) is not imported: it is removed (the file's is overridden with
    null), with one line on stderr for each, unless the command line names that same module
    (``rules_module``, which is imported in any case). The scenario section must be a mapping
    with a string name."""
    from marl.scenarios.problems import ScenarioError, short
    from marl.scenarios.registry import load_document

    if not isinstance(config, dict):
        raise RunError(f"eval: {source}: its saved config is {short(config)}, not a mapping")
    scenario = config.get("scenario")
    if scenario is None:
        return dict(config)
    name = scenario.get("name") if isinstance(scenario, dict) else None
    overrides = (scenario.get("overrides") or {}) if isinstance(scenario, dict) else None
    if not isinstance(name, str) or not isinstance(overrides, dict):
        raise RunError(
            f"eval: {source}: config.scenario is {short(scenario)}, not a scenario name with "
            "its overrides; pass --scenario"
        )
    overrides = dict(overrides)
    named = [
        ("config.scenario.rules_module", scenario.get("rules_module")),
        ("config.scenario.overrides.rules_module", overrides.pop("rules_module", None)),
    ]
    try:
        document, where = load_document(name)
    except ScenarioError:
        document, where = {}, name  # an unknown scenario is refused when it is built
    in_file = document.get("rules_module")
    if in_file is not None:  # the file a checkpoint points at is data too
        named.append((f"the scenario file {where}", in_file))
        overrides["rules_module"] = None
    for key, module in named:
        note = (str(source), key, repr(module))
        if module is not None and module != rules_module and note not in _NOTED:
            _NOTED.add(note)  # once per process: --listening reads the first checkpoint twice
            hint = f"--rules-module {module}" if isinstance(module, str) else "--rules-module"
            print(
                f"eval: not importing rules_module {short(module)}, named by {key} in "
                f"{source}: a checkpoint never chooses code to run; to import it, pass {hint}",
                file=sys.stderr,
                flush=True,
            )
    if rules_module is not None:
        overrides["rules_module"] = rules_module
    clean = {k: v for k, v in scenario.items() if k != "rules_module"}
    return {**config, "scenario": {**clean, "name": name, "overrides": overrides}}
