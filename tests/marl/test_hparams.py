"""TensorBoard HParams: a run logs its Hydra overrides and final metrics as an hparams session,
and TensorBoard's own readers (``EventAccumulator`` and the hparams plugin's handlers over
the data provider the ``tensorboard`` server uses) read back exactly those values and filter
a sweep by them."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict, read_write

from marl.analysis.hparams import flatten_overrides, read_session, session_end
from marl.analysis.report import find_runs, load_runs
from marl.cli import register_scenario_options
from marl.loop.train import train

STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
OVERRIDES = [
    "agents=scripted",
    "bot=random",
    "scenario=public-goods",
    "+scenario.overrides.reward.cooperation=0.25",
    "train.steps=3",
    "logging.progress=false",
]


def plugin_view(logdir: Path, request: dict | None = None) -> tuple[object, object]:
    """The HParams tab's two queries (``/experiment`` and ``/session_groups``), answered by the
    hparams plugin's handlers over the data provider ``tensorboard --logdir`` serves."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import (
        api_pb2,
        backend_context,
        get_experiment,
        list_session_groups,
    )

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    backend = backend_context.Context(
        base_plugin.TBContext(logdir=str(logdir), data_provider=provider, multiplexer=multiplexer)
    )
    ctx = context.RequestContext()
    experiment = get_experiment.Handler(
        ctx, backend, "", api_pb2.GetExperimentRequest(include_metrics=True)
    ).run()
    from google.protobuf import json_format

    # the tab asks for every status and the first 100 rows, plus the user's column filters
    query = json_format.ParseDict(
        {"startIndex": 0, "sliceSize": 100, "allowedStatuses": STATUSES, **(request or {})},
        api_pb2.ListSessionGroupsRequest(),
    )
    groups = list_session_groups.Handler(ctx, backend, "", query).run()
    return experiment, groups


def hparam_values(group: object) -> dict[str, object]:
    from google.protobuf import json_format

    return {k: json_format.MessageToDict(v) for k, v in group.hparams.items()}


@pytest.fixture
def hydra_job() -> Iterator[callable]:
    """Compose ``marl train`` with overrides and make it the running Hydra job (as ``marl train``
    does), so the run sees its overrides; the job is cleared afterwards."""

    def start(overrides: list[str]) -> DictConfig:
        register_scenario_options()
        with initialize_config_module(config_module="marl.configs", version_base=None):
            cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        task_cfg = copy.deepcopy(cfg)  # what hydra's run_job hands the task: no hydra node
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        return task_cfg

    yield start
    HydraConfig.instance().cfg = None


def test_overrides_flatten_to_typed_dotted_keys() -> None:
    hparams = flatten_overrides(
        [
            "algo=dr_grpo",
            "+scenario.overrides.reward.cooperation=0.5",
            "seed=2",
            "logging.progress=false",
            "~warmup",
            "+scenario.overrides.graph={topology: ring}",
            "x=[1,2]",
            "resume=null",
        ]
    )
    assert hparams == {
        "algo": "dr_grpo",
        "scenario.overrides.reward.cooperation": 0.5,
        "seed": 2,
        "logging.progress": False,
        "scenario.overrides.graph.topology": "ring",
        "x": "[1, 2]",
        "resume": "null",
    }


@pytest.mark.slow
def test_a_run_logs_its_overrides_and_final_metrics_as_an_hparams_session(
    tmp_path: Path, hydra_job
) -> None:
    cfg = hydra_job(OVERRIDES)
    last = train(cfg, run_dir=tmp_path / "run")
    hparams, finals, status = read_session(tmp_path / "run" / "tensorboard")
    assert status == "success"
    assert hparams == {
        "agents": "scripted",
        "bot": "random",
        "scenario": "public-goods",
        "scenario.overrides.reward.cooperation": 0.25,
        "train.steps": 3.0,
        "logging.progress": False,
        "seed": 0.0,  # not overridden: from the config
        "scenario.name": "public-goods-v0",
    }
    # final/team/reward is the mean of the last 3 steps of the curve the run logged
    runs = load_runs(find_runs([tmp_path]))
    curve = [v for _, v in runs[0].curves["team/reward"]]
    assert len(curve) == 3
    assert math.isclose(finals["final/team/reward"], sum(curve) / 3, rel_tol=1e-6)
    assert math.isclose(curve[-1], last["team/reward"], rel_tol=1e-6)
    assert {
        "final/emergence/ann/speaker_mi_content",
        "final/emergence/ann/message_rate",
        "final/emergence/ann/influence_action",
    } <= set(finals)
    assert not [t for t in finals if "/edges/" in t]  # per agent, not per edge
    # the session lives in the run's own event files: TensorBoard lists one run, not two
    assert not (tmp_path / "run" / "tensorboard" / "hparams").exists()
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    listed = EventMultiplexer().AddRunsFromDirectory(str(tmp_path)).Reload().Runs()
    assert list(listed) == ["run/tensorboard"], list(listed)  # as `tensorboard --logdir` lists
    assert "final/team/reward" not in runs[0].curves  # a summary, not a curve, for marl report


@pytest.mark.slow
def test_the_hparams_plugin_shows_and_filters_a_sweep(tmp_path: Path, hydra_job) -> None:
    for cooperation in (0.0, 1.0):
        for seed in (0, 1):
            cfg = hydra_job(
                [
                    *OVERRIDES[:3],
                    f"+scenario.overrides.reward.cooperation={cooperation}",
                    "train.steps=2",
                    "logging.progress=false",
                    "emergence.influence_every=0",
                    f"seed={seed}",
                ]
            )
            train(cfg, run_dir=tmp_path / f"c{cooperation}_s{seed}")
            HydraConfig.instance().cfg = None
    experiment, groups = plugin_view(tmp_path)
    infos = {h.name: h for h in experiment.hparam_infos}
    axis = infos["scenario.overrides.reward.cooperation"]
    assert (axis.domain_interval.min_value, axis.domain_interval.max_value) == (0.0, 1.0)
    assert axis.differs and infos["seed"].differs and not infos["bot"].differs
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert "final/team/reward" in metrics and "team/reward" in metrics  # one run holds both
    assert len(groups.session_groups) == 4
    rewards = {}
    for group in groups.session_groups:
        values = hparam_values(group)
        (session,) = group.sessions
        assert session.status == 1  # STATUS_SUCCESS
        assert session.name.endswith("/tensorboard")  # the training run itself
        metric = {m.name.tag: m.value for m in group.metric_values}
        key = (values["scenario.overrides.reward.cooperation"], values["seed"])
        rewards[key] = metric["final/team/reward"]
        run = tmp_path / f"c{key[0]:.1f}_s{int(key[1])}"
        assert group.name == f"{run.name} ({tmp_path.name})"  # the row is named after the run
        assert rewards[key] == pytest.approx(
            read_session(run / "tensorboard")[1]["final/team/reward"]
        )
    assert set(rewards) == {(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)}
    # public goods at cooperation 0 is zero-sum: the team reward is 0 whatever is played
    assert rewards[(0.0, 0)] == pytest.approx(0.0, abs=1e-9)
    assert rewards[(0.0, 1)] == pytest.approx(0.0, abs=1e-9)
    assert rewards[(1.0, 0)] > 0.0
    # the HParams tab's filter: only cooperation in [0.5, 1.5]
    _, kept = plugin_view(
        tmp_path,
        {
            "colParams": [
                {
                    "hparam": "scenario.overrides.reward.cooperation",
                    "filterInterval": {"minValue": 0.5, "maxValue": 1.5},
                }
            ],
        },
    )
    assert sorted(hparam_values(g)["seed"] for g in kept.session_groups) == [0, 1]
    assert {
        hparam_values(g)["scenario.overrides.reward.cooperation"] for g in kept.session_groups
    } == {1.0}


def test_a_failed_run_closes_its_session_as_failed(tmp_path: Path, hydra_job) -> None:
    from marl.analysis.tensorboard import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path / "tensorboard")
    logger.start_session({"seed": 3, "algo": "grpo"})
    logger.end_session({"final/team/reward": 0.5}, step=7, status="failure")
    logger.close()
    hparams, finals, status = read_session(tmp_path / "tensorboard")
    assert (hparams, finals, status) == (
        {"seed": 3.0, "algo": "grpo"},
        {"final/team/reward": 0.5},
        "failure",
    )
    with pytest.raises(ValueError, match="success"):
        session_end("aborted")


def test_without_tensorboard_no_session_is_written(tmp_path: Path) -> None:
    from marl.analysis.tensorboard import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path / "tensorboard", enabled=False)
    logger.start_session({"seed": 0})
    logger.end_session({"final/team/reward": 1.0}, step=1, status="success")
    logger.close()
    assert not (tmp_path / "tensorboard").exists()
    assert read_session(tmp_path / "tensorboard") == ({}, {}, "missing")


def test_a_run_logged_before_the_session_moved_in_is_still_read(tmp_path: Path) -> None:
    """Older runs logged their session in ``tensorboard/hparams``: marl report still groups
    them by it."""
    from torch.utils.tensorboard import SummaryWriter

    from marl.analysis.hparams import session_start

    SummaryWriter(str(tmp_path / "tensorboard")).add_scalar("team/reward", 0.5, 1)
    old = SummaryWriter(str(tmp_path / "tensorboard" / "hparams"))
    old._get_file_writer().add_summary(session_start({"seed": 2}))
    old.close()
    assert read_session(tmp_path / "tensorboard")[0] == {"seed": 2.0}
