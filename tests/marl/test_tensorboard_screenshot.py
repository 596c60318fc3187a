"""The optional look at TensorBoard (bench/tensorboard_screenshot.py): a real ``tensorboard``
server on localhost serves a scripted sweep's HParams sessions, and headless Chromium renders
the HParams and scalars pages. Skipped where Chromium is not installed (it is never a
dependency: ``apt-get install chromium``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from tensorboard_screenshot import WINDOW, find_chromium  # noqa: E402

CHROMIUM = find_chromium()
AXIS = "scenario.overrides.reward.cooperation"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian/Ubuntu: apt-get install chromium); the optional "
    "TensorBoard screenshot check needs it",
)
def test_tensorboard_serves_and_chromium_renders_the_hparams_of_a_sweep(tmp_path: Path) -> None:
    from PIL import Image

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    script = Path(sys.executable).with_name("marl")
    marl = [str(script)] if script.exists() else [sys.executable, "-m", "marl.cli"]
    sweep = tmp_path / "sweep"
    subprocess.run(
        [
            *marl,
            "train",
            "-m",
            "+sweep=public_goods_cooperation",
            "agents=scripted",
            "bot=random",
            "train.steps=2",
            "logging.progress=false",
            "emergence.influence_every=0",
            f"{AXIS}=0.0,1.0",
            "seed=0",
            f"hydra.sweep.dir={sweep}",
        ],
        check=True,
        capture_output=True,
        env=env,
        timeout=600,
    )
    out = tmp_path / "shots"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tensorboard_screenshot.py")]
        + ["--logdir", str(sweep), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "tensorboard_check.json").read_text())
    assert "hparams" in result["plugins"] and "scalars" in result["plugins"]
    assert result["sessions"] == 2
    assert AXIS in result["hparams"] and "seed" in result["hparams"]
    assert "final/team/reward" in result["metrics"]
    rewards = {row["hparams"][AXIS]: row["metrics"]["final/team/reward"] for row in result["rows"]}
    assert set(rewards) == {0.0, 1.0}
    assert abs(rewards[0.0]) < 1e-6 < rewards[1.0]  # zero-sum at 0; the team's mean payoff at 1
    for page in ("hparams", "scalars"):
        image = Image.open(out / f"{page}.png").convert("RGB")
        assert image.size == WINDOW
        red, green, blue = image.getpixel((5, 5))  # TensorBoard's orange header, not an error page
        assert red > 200 and 90 < green < 160 and blue < 60, (page, (red, green, blue))
        assert len(set(image.getdata())) > 50  # text and plots, not a blank page
