"""TensorBoard HParams for a run: the config values it was launched with and its final metrics,
so a sweep can be filtered and sorted in TensorBoard's HParams tab.

What a run logs, in its own event files (``<run>/tensorboard/``, beside the training curves, so
TensorBoard lists one run, not the run and a ``hparams`` child):

- at the start, a *session start* (``_hparams_/session_start_info``) holding the run's
  hparams: every Hydra override of the run (``marl train algo=dr_grpo seed=1`` gives
  ``algo: dr_grpo`` and ``seed: 1``; in a multirun job the swept values of that job), flattened
  to dotted keys, plus ``seed`` and ``scenario.name`` when no override sets them;
- at the end, the final metrics as scalars ``final/<tag>``
  (:meth:`marl.analysis.summary.RunSummary.finals`: the mean of the last steps, as ``marl report``
  computes them; an ``eval/*`` metric: the last evaluation) and a *session end* with the status
  (success, or failure when the run raised or was interrupted).

It is written with the protobufs of TensorBoard's hparams plugin (``summary_v2.hparams_pb``
and ``plugin_data_pb2``), which need no TensorFlow. No experiment summary is written: the
plugin then builds the table from every session it finds, so runs of different sweeps under
one ``--logdir`` each keep their own columns. Its metric columns are every scalar tag of the
session's run: the ``final/*`` tags and the training curves' last values (choose the columns in
the tab's settings). Runs made before this logged the session in a ``hparams`` subdirectory;
:func:`read_session` reads both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HParamValue = bool | int | float | str
SUBDIR = "hparams"
FINAL_PREFIX = "final/"
STATUSES = ("success", "failure")


def run_overrides() -> list[str]:
    """The Hydra task overrides of the running job (``[]`` outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def _flatten(key: str, value: Any) -> dict[str, HParamValue]:
    """One override's value as hparams: scalars as they are, ``None`` as ``"null"``, a mapping
    as one key per leaf (``key.sub``), a list as its JSON text."""
    if isinstance(value, Mapping):
        out: dict[str, HParamValue] = {}
        for sub, item in value.items():
            out.update(_flatten(f"{key}.{sub}", item))
        return out
    if value is None:
        return {key: "null"}
    if isinstance(value, bool | int | float | str):
        return {key: value}
    return {key: json.dumps(value, default=str)}


def flatten_overrides(overrides: Sequence[str]) -> dict[str, HParamValue]:
    """Hydra override strings as hparams: ``algo=dr_grpo`` -> ``{"algo": "dr_grpo"}``,
    ``+scenario.overrides.reward.cooperation=0.5`` -> ``{"scenario.overrides.reward.cooperation":
    0.5}`` (the value typed as Hydra parses it). Deletions (``~key``) are left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hparams: dict[str, HParamValue] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete():
            continue
        key = override.key_or_group
        if override.package:
            key = f"{key}@{override.package}"
        hparams.update(_flatten(key, override.value()))
    return hparams


def run_hparams(config: Any, overrides: Sequence[str]) -> dict[str, HParamValue]:
    """The hparams a run logs: its overrides (:func:`flatten_overrides`), plus ``seed`` and
    ``scenario.name`` from the resolved ``config`` when no override names them."""
    hparams = flatten_overrides(overrides)
    hparams.setdefault("seed", int(config.seed))
    hparams.setdefault("scenario.name", str(config.scenario.name))
    return hparams


def trial_id(run_dir: str | Path) -> str:
    """The name of a run's row in the HParams tab: its directory, then the one above it
    (``3_c0.5_s1 (public_goods_cooperation)``), readable where a hash of the hparams would not
    be, and the run's own part first because the tab cuts long names."""
    path = Path(run_dir).resolve()
    return f"{path.name} ({path.parent.name})" if path.parent.name else path.name


def session_start(
    hparams: Mapping[str, HParamValue], trial: str | None = None, start_time: float | None = None
) -> Any:
    """A ``Summary`` protobuf with the hparams plugin's session start for ``hparams``; ``trial``
    names the row (default: a hash of the hparams, as TensorBoard's own ``hparams_pb``)."""
    from tensorboard.plugins.hparams import summary_v2

    return summary_v2.hparams_pb(
        dict(hparams), trial_id=trial, start_time_secs=start_time or time.time()
    )


def session_end(status: str, end_time: float | None = None) -> Any:
    """A ``Summary`` protobuf with the hparams plugin's session end (``success``/``failure``)."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    if status not in STATUSES:
        raise ValueError(f"hparams session status must be one of {STATUSES}, got {status!r}")
    info = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.STATUS_SUCCESS if status == "success" else api_pb2.STATUS_FAILURE,
        end_time_secs=end_time or time.time(),
    )
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=metadata.SESSION_END_INFO_TAG,
        metadata=metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(session_end_info=info)
        ),
        tensor=metadata.NULL_TENSOR,
    )
    return summary


def read_session(log_dir: str | Path) -> tuple[dict[str, HParamValue], dict[str, float], str]:
    """Read a run's hparams session back with TensorBoard's ``EventAccumulator``: the hparams,
    the final metrics (``final/<tag>`` -> last value) and the status (``running`` while no
    session end is written). ``log_dir`` is the run's ``tensorboard`` directory (or the
    ``hparams`` subdirectory where older runs logged their session). Empty results and status
    ``missing`` when the run logged no hparams session."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        return {}, {}, "missing"
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    try:
        content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    except KeyError:  # no summary of the hparams plugin in these event files
        content = {}
    if not content and log_dir.name != SUBDIR and (log_dir / SUBDIR).is_dir():
        return read_session(log_dir / SUBDIR)  # a run logged before the session moved in
    if not content:
        return {}, {}, "missing"
    hparams: dict[str, HParamValue] = {}
    status = "running"
    if metadata.SESSION_START_INFO_TAG in content:
        start = metadata.parse_session_start_info_plugin_data(
            content[metadata.SESSION_START_INFO_TAG]
        )
        for name, value in start.hparams.items():
            kind = value.WhichOneof("kind")
            hparams[name] = {
                "bool_value": value.bool_value,
                "number_value": value.number_value,
                "string_value": value.string_value,
            }.get(kind, "null")
    if metadata.SESSION_END_INFO_TAG in content:
        end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
        status = "success" if end.status == api_pb2.STATUS_SUCCESS else "failure"
    finals = {
        tag: points[-1].value
        for tag in events.Tags()["scalars"]
        if tag.startswith(FINAL_PREFIX) and (points := events.Scalars(tag))
    }  # a tag whose points a resumed run's purge dropped (marl.loop.resume) has none
    return hparams, finals, status
