"""Bad configuration gets one clear message naming the key, before anything is built.

The overrides are the command-line strings a user types, composed through Hydra as ``marl train``
composes them: non-finite numbers anywhere, impossible tiny-model sizes, an unknown backend and a
negative transcript period.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

from marl.agents.backends.base import SamplingConfig, backend_names, make_backend
from marl.cli import register_scenario_options
from marl.config import AlgoConfig, Config, ConfigError, load_config


def load(*overrides: str) -> Config:
    """The validated config of ``marl train <overrides>``."""
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return load_config(compose(config_name="train", overrides=list(overrides)))


NON_FINITE = [
    ("algo.lr=nan", "algo.lr"),
    ("algo.lr=inf", "algo.lr"),
    ("sampling.temperature=nan", "sampling.temperature"),
    ("sampling.top_p=nan", "sampling.top_p"),
    ("algo.clip_eps=nan", "algo.clip_eps"),
    ("algo.weight_decay=nan", "algo.weight_decay"),
    ("algo.weight_decay=-inf", "algo.weight_decay"),
    ("algo.clip_eps_high=nan", "algo.clip_eps_high"),
    ("algo.beta=nan", "algo.beta"),
    ("algo.max_grad_norm=nan", "algo.max_grad_norm"),
    ("ray.placement_timeout_s=inf", "ray.placement_timeout_s"),
    ("+policies.p={lr:nan}", "policies.p.lr"),
    ("+scenario.overrides.reward.cooperation=nan", "scenario.overrides.reward.cooperation"),
]


@pytest.mark.parametrize(("override", "key"), NON_FINITE)
def test_every_non_finite_number_is_refused_naming_its_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(override)
    message = str(err.value)
    assert message.startswith(f"{key}: ") and "\n" not in message, message


def test_the_schema_refuses_nan_without_hydra_too() -> None:
    for field in ("lr", "clip_eps", "beta", "weight_decay", "clip_eps_high", "max_grad_norm"):
        with pytest.raises(ConfigError, match=f"^algo.{field}: must be a finite number"):
            AlgoConfig(**{field: math.nan})
    with pytest.raises(ValueError, match="sampling.temperature"):
        SamplingConfig(temperature=math.nan)


def test_the_sampling_group_is_the_backends_sampling_config() -> None:
    """Declared once: the config's ``sampling`` is what a backend's generate and the learner
    take, with ``response_prefix`` inside it, checked by one validation with one wording."""
    config = load("sampling.max_new_tokens=7", "sampling.response_prefix=true")
    assert type(config.sampling) is SamplingConfig
    assert config.sampling == SamplingConfig(max_new_tokens=7, response_prefix=True)
    for override, direct in [
        ("sampling.max_new_tokens=0", {"max_new_tokens": 0}),
        ("sampling.top_p=1.5", {"top_p": 1.5}),
        ("sampling.temperature=-1", {"temperature": -1.0}),
    ]:
        with pytest.raises(ValueError) as made:
            SamplingConfig(**direct)
        with pytest.raises(ConfigError) as loaded:
            load(override)
        assert str(loaded.value) == str(made.value), override
    with pytest.raises(ConfigError, match="^sampling.n: a run samples one reply per prompt"):
        load("sampling.n=4")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.hidden_size=65", "model.hidden_size"),
        ("model.hidden_size=0", "model.hidden_size"),
        ("model.hidden_size=60", "model.hidden_size"),  # head size 15: RoPE needs an even one
        ("model.num_layers=-1", "model.num_layers"),
        ("model.num_layers=0", "model.num_layers"),
        ("model.num_heads=0", "model.num_heads"),
        ("model.intermediate_size=0", "model.intermediate_size"),
        ("backend=bogus", "backend"),
        ("logging.transcripts_every=-1", "logging.transcripts_every"),
        ("+policies.p={model:{num_layers:-1}}", "policies.p.model.num_layers"),
    ],
)
def test_impossible_values_are_refused_naming_their_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(override)
    assert str(err.value).startswith(f"{key}: "), str(err.value)


def test_possible_values_still_load() -> None:
    config = load("model.hidden_size=32", "model.num_heads=2", "backend=vllm", "algo.beta=0")
    assert (config.model.hidden_size, config.backend) == (32, "vllm")
    assert load("logging.transcripts_every=0").logging.transcripts_every == 0


@pytest.mark.subprocess
def test_an_unknown_backend_lists_the_built_in_ones_without_importing_them() -> None:
    assert {"hf", "vllm"} <= set(backend_names())
    with pytest.raises(KeyError, match="backend: unknown backend .bogus.; known: hf, vllm"):
        make_backend("bogus")
    code = (
        "import sys\n"
        "from marl.config import ConfigError, load_config\n"
        "try:\n"
        "    load_config({'backend': 'bogus'})\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('vllm', 'marl.agents.backends.'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == ["backend: 'bogus' is not one of hf, vllm", "['marl.agents.backends.base']"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_command_line_prints_one_line_and_no_traceback(tmp_path) -> None:
    marl = [sys.executable, "-m", "marl.cli"]
    done = subprocess.run(
        [*marl, "train", "model.hidden_size=65", "train.steps=1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip().splitlines() == [
        "error: model.hidden_size: must be num_heads (4) times an even head size (rotary "
        "embeddings), got 65"
    ]


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**500])
def test_a_seed_torch_cannot_take_is_refused_in_one_line(seed: int) -> None:
    from marl.config import ConfigError, load_config

    with pytest.raises(ConfigError) as refused:
        load_config({"seed": seed})
    line = str(refused.value)
    assert line.startswith("seed: must be in [-2**63, 2**64)") and len(line) < 120


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"group_size": 100_000_000}, "train.seeds_per_step x train.group_size"),
        ({"seeds_per_step": 100_000_000}, "train.seeds_per_step x train.group_size"),
        ({"eval_episodes": 10**9}, "train.eval_episodes"),
    ],
)
def test_sizes_that_scale_memory_are_bounded_up_front(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config({"train": overrides})
    assert str(refused.value).startswith(key) and "over the limit of 65536" in str(refused.value)
    load_config({"train": {"seeds_per_step": 256, "group_size": 256}})  # 65,536: still allowed


def test_the_learning_rate_default_is_declared_once() -> None:
    """``algo.lr``'s default lives in UpdateSettings alone: an algorithm file that restated it
    would keep its old value when the default moved. Jobs (demo, kuhn) may still set it."""
    from pathlib import Path

    import yaml

    from marl.config import UpdateSettings

    root = Path(__file__).resolve().parents[2] / "configs" / "algo"
    files = sorted(root.glob("*.yaml"))
    restating = [p.name for p in files if "lr" in yaml.safe_load(p.read_text())]
    assert restating == [], f"configs/algo files restating algo.lr: {restating}"
    assert UpdateSettings().lr == 1e-5
