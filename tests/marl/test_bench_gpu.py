"""bench/gpu.py (``make bench-gpu``) at tiny sizes on the CPU, so that it cannot rot unseen
between the runs on a GPU machine: every part runs on the tiny model, the synthetic reward
makes every update train, and the JSON and the table come out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402  (bench/gpu.py: bench/ is not a package)
import synthetic_reward  # noqa: E402

# the tiny model on this CPU at the smallest sizes, as every end-to-end test here runs it
TINY = [
    "--device", "cpu", "--model", "tiny", "--prompts", "2", "--prompt-tokens", "20",
    "--new-tokens", "3", "--rounds", "1", "--matmul-size", "64", "--name", "tiny",
]  # fmt: skip


def test_rows_are_prompts_times_samples():
    assert gpu.layout(16, 32) == (16, 1)
    assert gpu.layout(64, 32) == (32, 2)
    assert gpu.layout(256, 32) == (32, 8)
    with pytest.raises(SystemExit):
        gpu.layout(48, 32)


def test_prompts_are_distinct_and_reach_their_length():
    tokenizer = gpu.tokenizer_of({"kind": "tiny"})  # one token a character
    prompts = gpu.make_prompts(tokenizer, 6, 400)
    assert len({tuple(p) for p in prompts}) == 6
    assert all(380 <= len(p) <= 420 + 12 for p in prompts)  # the target, then one word more


def test_synthetic_reward_scores_texts_apart():
    from marl.scenarios.shaping import SHAPING_KINDS

    score = SHAPING_KINDS[synthetic_reward.SYNTHETIC_REWARD]

    class Turn:
        def __init__(self, completion: str) -> None:
            self.completion = completion

    values = [score(Turn(f"SAY: reply {i}")) for i in range(20)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert len(set(values)) > 15
    assert score(Turn("same")) == score(Turn("same"))


def test_synthetic_reward_reaches_other_processes_through_sitecustomize():
    """A sweep's jobs run in other processes: the folder site_dir() writes registers the kind
    in any interpreter that has it on PYTHONPATH, and the command-line override composes."""
    import os
    import subprocess

    probe = (
        "from marl.scenarios.shaping import SHAPING_KINDS; "
        f"print({synthetic_reward.SYNTHETIC_REWARD!r} in SHAPING_KINDS)"
    )
    with synthetic_reward.site_dir() as folder:
        path = f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        with_site = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": path}, check=True)  # fmt: skip
    assert not folder.exists()  # removed on leaving
    without = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True)  # fmt: skip
    assert (with_site.stdout.strip(), without.stdout.strip()) == ("True", "False")
    composed = gpu.compose(["model.kind=tiny", synthetic_reward.OVERRIDE])
    assert composed["scenario"]["overrides"] == synthetic_reward.synthetic_overrides()


def test_synthetic_reward_joins_the_scenario_reward():
    import marl

    cfg = gpu.with_reward(gpu.compose(["model.kind=tiny"]))
    overrides = cfg["scenario"]["overrides"]
    env = marl.make(cfg["scenario"]["name"], **overrides)
    assert [t.kind for t in env.spec.shaping] == [synthetic_reward.SYNTHETIC_REWARD]
    assert (env.spec.name, env.spec.rules) == ("signal-v1", "signal")  # the demo's scenario
    assert env.spec.cooperation == 1.0 and env.spec.malformed_penalty == -0.1


def test_gpu_share_is_zero_on_a_cpu_and_splits_one_gpu():
    cfg = gpu.compose(["model.kind=tiny"])
    assert gpu.gpu_share(cfg, "cpu") == ["policy_defaults.num_gpus=0"]
    assert gpu.gpu_share(cfg, "cuda") == ["policy_defaults.num_gpus=0.5"]  # speaker, listener


@pytest.mark.slow
def test_every_part_runs_on_the_tiny_model(tmp_path, monkeypatch):
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    data = gpu.run(
        [*TINY, "--rows", "2", "4", "--steps", "1", "--big", "1x4", "--out", str(tmp_path / "out"),
         "train.seeds_per_step=1", "train.group_size=2"]
    )  # fmt: skip
    written = json.loads((tmp_path / "tiny.json").read_text())
    assert written["complete"] and written == json.loads((tmp_path / "out/tiny.json").read_text())
    assert set(data["generation"]) == {"2", "4"}
    for size in data["generation"].values():
        assert size["median"]["ours"] > 0 and size["median"]["static"] > 0
    assert data["generation"]["4"]["samples"] == 2  # 2 prompts x 2 samples
    update = data["update"]
    assert update["turns"] == 4 and update["trained_turns"] == 4
    assert 0 < update["positions_with_grad"] <= update["tokens"]
    assert data["demo_step"]["episodes"] == 2 and data["big_step"]["episodes"] == 4
    for part in ("demo_step", "big_step"):
        last = data[part]["last"]
        assert {"rollout", "credit", "update", "sync", "emergence"} <= set(last)
        assert last["generated_tokens_per_s"] > 0
        # with random weights every reply is malformed alike: the synthetic score alone
        # makes a group's returns differ, so both policies train on every turn
        for pid in ("speaker", "listener"):
            assert last[f"policies/{pid}/trained_turns"] == last[f"policies/{pid}/turns"] > 0
    figures = {r["figure"] for r in written["summary"]}
    assert {
        "generate 4 rows: ours / static",
        "update tokens/s",
        "demo step: update",
        "big step: rollout generated tokens/s",
        "matmul peak bfloat16",
    } <= figures
    assert written["device"]["cpu"] and "avx512_bf16" in written["device"]["cpu_flags"]


def test_parts_past_the_budget_or_skipped_are_listed(tmp_path, monkeypatch):
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    args = gpu.defaults(gpu.parse(["--device", "cpu", "--skip", "demo", "--budget-s", "0"]), "cpu")
    bench = gpu.Run(args, "cpu", "bench/gpu.py")
    assert not bench.starts("demo") and bench.data["skipped"]["demo"] == "--skip"
    assert not bench.starts("big") and bench.data["skipped"]["big"].startswith("budget")
    bench.save()
    saved = json.loads((tmp_path / "gpu_cpu.json").read_text())
    assert saved["complete"] is False and set(saved["skipped"]) == {"demo", "big"}


def test_cpu_and_cuda_defaults():
    cpu = gpu.defaults(gpu.parse([]), "cpu")
    assert (cpu.rows, cpu.new_tokens, cpu.dtype, cpu.budget_s, cpu.name) == (
        [4, 8],
        16,
        "float32",
        None,
        "gpu_cpu",
    )
    cuda = gpu.defaults(gpu.parse([]), "cuda")
    assert (cuda.rows, cuda.new_tokens, cuda.dtype, cuda.big, cuda.steps, cuda.name) == (
        [16, 64, 256],
        64,
        "bfloat16",
        "32x8",
        2,
        "gpu",
    )


def test_profile_writes_where_the_time_and_the_tensors_go(tmp_path, monkeypatch):
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    gpu.run([*TINY, "--rows", "4", "--profile", "--skip", "demo", "big"])
    main = json.loads((tmp_path / "tiny.json").read_text())
    assert "profile" not in main["update"] and "profile" not in main["generation"]
    profile = json.loads((tmp_path / "tiny_profile.json").read_text())
    for part in ("update", "generation"):
        p = profile[part]
        assert p["by_operator"] and p["by_operator"][0]["host_self_ms"] > 0
        assert p["aten_ops"] >= p["aten_compute_ops"] > 0
        assert p["kernel_launches"] is None  # a CPU launches no kernels
        assert isinstance(p["synchronisations"], dict)
    placed = profile["update"]["placement"]
    assert placed["weight"] == {"cpu": placed["weight"]["cpu"]} and placed["weight"]["cpu"] > 0
    assert set(placed["fp32 masters"]) == {"cpu"} and set(placed["batch"]) == {"cpu"}
    assert profile["generation"]["rows"] == 4
