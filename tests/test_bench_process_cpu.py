"""bench/process_cpu.py splits a command's CPU by kind of process: real processes, read back from
/proc while they run."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from process_cpu import ProcessSampler, kind_of  # noqa: E402

# a Python process that burns CPU, then sleeps; the comment names it for the sampler
PROBE = (
    "import time  # process-cpu-probe\n"
    "end = time.process_time() + {burn}\n"
    "while time.process_time() < end: pass\n"
    "time.sleep({sleep})\n"
)
FORKED = "the tests' marl CLI (forked from the preloaded server)"
PROBE_KINDS = (("probe", re.compile("process-cpu-probe")),)


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        ("/x/ray/core/src/ray/gcs/gcs_server\0--port=1", "ray daemon: gcs_server"),
        ("/x/ray/core/src/ray/raylet/raylet\0--node", "ray daemon: raylet"),
        ("python\0-u\0/x/ray/dashboard/agent.py\0--node-ip", "ray daemon: agents and monitors"),
        ("ray::DashboardAgent", "ray daemon: agents and monitors"),
        ("ray::IDLE", "ray worker: idle or starting"),
        (
            "python\0/x/workers/default_worker.py\0--raylet-name=/t/raylet",
            "ray worker: idle or starting",
        ),
        ("ray::RolloutWorker.run", "ray worker: task or actor"),
        ("/v/bin/python\0-m\0pytest\0-n\0auto", "pytest, xdist worker"),
        ("python\0-c\0import sys;exec(eval(sys.stdin.readline()))", "pytest, xdist worker"),
        ("python\0-c\0from multiprocessing.forkserver import main; main(3)", FORKED),
        ("/v/bin/python\0/v/bin/marl\0train\0model=tiny", "marl CLI (a fresh interpreter)"),
        ("/v/bin/python\0-c\0print(1)", "python, other"),
        ("/usr/bin/make\0test", "other: make"),
        ("", "other: kernel or unnamed"),
    ],
)
def test_kind_of_names_each_kind(cmdline: str, kind: str) -> None:
    assert kind_of(cmdline) == kind


def test_a_process_started_while_sampling_counts_and_one_before_counts_only_its_growth() -> None:
    # burns 0.5 s before the sampler starts, then sleeps through it: nothing of it counts
    before = subprocess.Popen([sys.executable, "-c", PROBE.format(burn=0.5, sleep=3)])
    time.sleep(1.5)
    sampler = ProcessSampler(interval=0.1, kinds=PROBE_KINDS).start()
    # burns 0.6 s while sampled, and sleeps so that a reading sees its total
    subprocess.run([sys.executable, "-c", PROBE.format(burn=0.6, sleep=0.4)], check=True)
    by_kind = sampler.stop()
    before.wait()
    assert 0.55 <= by_kind["probe"] <= 0.9, by_kind  # 0.6 s and its interpreter's start-up
    assert sampler.processes["probe"] == 1
