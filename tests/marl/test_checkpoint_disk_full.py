"""A checkpoint that cannot be written (a full disk) stops the run with one clear message."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    import torch
    from marl.runtime.checkpoint import resolve_checkpoint, save_checkpoint
    from marl.errors import RunError

    run_dir = sys.argv[1]
    save_checkpoint(run_dir, 1, {"weights": torch.zeros(10)})  # fits: the step to resume from
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # files of at most 1 MiB
    try:
        save_checkpoint(run_dir, 2, {"weights": torch.zeros(1_000_000)})  # 4 MB
    except RunError as err:
        print("RunError:", err)
        print("latest:", resolve_checkpoint(run_dir).name)
    """
)


def test_a_failed_write_names_the_step_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RunError: cannot write the checkpoint of step 2 under" in out.stdout
    assert "GiB free on that disk" in out.stdout and "train.checkpoint_every=0" in out.stdout
    assert "latest: step_000001" in out.stdout  # the complete step 1 is still the one to resume
    leftovers = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers  # no half-written temporary directory is left behind
