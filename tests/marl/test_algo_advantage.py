"""``algo.advantage`` is checked against the advantage registry, as ``credit.name`` is against
the credit registry: an unknown name is refused naming the key and listing the known names, and
an estimator registered by the user is accepted without editing a whitelist."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hydra import compose, initialize_config_module

from marl.cli import register_scenario_options
from marl.config import AlgoConfig, Config, ConfigError, load_config
from marl.credit.advantages import ADVANTAGES, list_advantages, register_advantage


def load(*overrides: str) -> Config:
    """The validated config of ``marl train <overrides>``."""
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return load_config(compose(config_name="train", overrides=list(overrides)))


@pytest.fixture
def centred() -> Iterator[str]:
    name = "test_centred"
    register_advantage(name)(lambda returns: returns - returns.mean(dim=0, keepdim=True))
    try:
        yield name
    finally:
        ADVANTAGES.pop(name, None)


def test_unknown_advantage_names_the_key_and_lists_the_registry() -> None:
    with pytest.raises(ConfigError) as err:
        load("algo.advantage=gae")
    message = str(err.value)
    assert message.startswith("algo.advantage: unknown advantage estimator 'gae'"), message
    assert message.endswith("known: " + ", ".join(list_advantages())), message
    assert {"grpo", "dr_grpo", "rloo"} <= set(list_advantages())


def test_every_builtin_advantage_is_accepted() -> None:
    for name in ("grpo", "dr_grpo", "rloo"):
        assert load(f"algo.advantage={name}").algo.advantage == name


def test_a_registered_advantage_is_accepted_without_a_whitelist(centred: str) -> None:
    assert AlgoConfig(advantage=centred).advantage == centred
    assert load(f"algo.advantage={centred}").algo.advantage == centred
    assert centred in str(pytest.raises(ConfigError, AlgoConfig, advantage="nope").value)
