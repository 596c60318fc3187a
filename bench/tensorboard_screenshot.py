"""Look at a sweep in TensorBoard: serve it on localhost, ask the HParams plugin what it serves,
and take headless-Chromium screenshots of the HParams and the scalars pages.

    python bench/tensorboard_screenshot.py                       # a small scripted sweep first
    python bench/tensorboard_screenshot.py --logdir runs/sweep/public_goods_cooperation

Without ``--logdir`` it first runs a small sweep with scripted agents (no model, about half a
minute): ``marl train -m +sweep=public_goods_cooperation agents=scripted bot=random`` at
cooperation 0, 0.5 and 1 with seeds 0 and 1. Then it starts ``tensorboard --logdir ... --port
...`` (the ``tensorboard`` of this Python, TensorFlow not needed), waits until the server
answers and the HParams plugin lists the runs' sessions, writes ``hparams.png`` and
``scalars.png`` with ``chromium --headless --screenshot``, stops the server and writes
``tensorboard_check.json`` (the sessions, hparams and metrics the plugin served; the PNGs).

Chromium is an optional, separate install, never a dependency of the project: on Debian or
Ubuntu ``sudo apt-get install chromium`` (or ``chromium-browser``; ``--chromium PATH`` for
another binary, Google Chrome works too). Without it the script says so and exits 2; the test
(tests/marl/test_tensorboard_screenshot.py) is skipped with that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, marl_command  # noqa: E402  (bench helpers)

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ALL_STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
PAGES = {"hparams": "#hparams", "scalars": "#scalars"}
WINDOW = (1920, 1080)  # the table's columns stretch to any width; wider shows no more of them


def find_chromium(explicit: str | None = None) -> str | None:
    """The Chromium (or Chrome) binary to use: ``explicit``, else the first on PATH."""
    if explicit:
        return explicit if shutil.which(explicit) else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def demo_sweep(root: Path) -> Path:
    """A small scripted sweep (6 runs, no model) under ``root``; returns its directory."""
    command = marl_command()
    sweep = root / "public_goods_cooperation"
    subprocess.run(
        [
            *command,
            "train",
            "-m",
            "+sweep=public_goods_cooperation",
            "agents=scripted",
            "bot=random",
            "train.steps=3",
            "logging.progress=false",
            "emergence.influence_every=0",
            "scenario.overrides.reward.cooperation=0.0,0.5,1.0",
            "seed=0,1",
            f"hydra.sweep.dir={sweep}",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
    )
    return sweep


def _get(url: str, data: dict | None = None, timeout: float = 5.0) -> Any:
    body = json.dumps(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode())


def wait_for_sessions(base: str, expected: int, timeout: float = 120.0) -> dict[str, Any]:
    """Poll the server until it answers and the HParams plugin serves ``expected`` sessions
    (it loads event files in the background); returns what the HParams tab asks for."""
    deadline = time.monotonic() + timeout
    last_error = "no answer"
    while time.monotonic() < deadline:
        try:
            plugins = _get(f"{base}/data/plugins_listing")
            groups = _get(
                f"{base}/data/plugin/hparams/session_groups",
                {"startIndex": 0, "sliceSize": 1000, "allowedStatuses": ALL_STATUSES},
            )
            if int(groups.get("totalSize", 0)) >= expected:
                experiment = _get(
                    f"{base}/data/plugin/hparams/experiment", {"includeMetrics": True}
                )
                return {"plugins": sorted(plugins), "groups": groups, "experiment": experiment}
            last_error = f"{groups.get('totalSize', 0)} of {expected} sessions so far"
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
            last_error = str(exc)
        time.sleep(1.0)
    raise TimeoutError(f"tensorboard at {base}: {last_error} after {timeout:.0f} s")


def screenshot(chromium: str, url: str, out: Path, budget_ms: int = 20000) -> Path:
    """``chromium --headless --screenshot`` of ``url``; ``budget_ms`` of virtual time lets the
    page's scripts fetch and render before the picture is taken."""
    with tempfile.TemporaryDirectory(prefix="marl-chromium-") as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",  # root in a container has no user namespace for the sandbox
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                f"--virtual-time-budget={budget_ms}",
                f"--screenshot={out}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
    return out


def count_runs(logdir: Path) -> int:
    """Runs under ``logdir`` that logged an HParams session (in ``<run>/tensorboard``)."""
    from marl.analysis.hparams import read_session

    return sum(
        1 for p in logdir.rglob("tensorboard") if p.is_dir() and read_session(p)[2] != "missing"
    )


def check(logdir: Path, out: Path, chromium: str, port: int | None = None) -> dict[str, Any]:
    """Serve ``logdir``, read what the HParams plugin serves, screenshot both pages."""
    out.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    expected = count_runs(logdir)
    if expected == 0:
        raise SystemExit(f"{logdir}: no run with an HParams session (<run>/tensorboard)")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(logdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--reload_interval",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        served = wait_for_sessions(base, expected)
        shots = {
            name: str(screenshot(chromium, base + "/" + frag, out / f"{name}.png"))
            for name, frag in PAGES.items()
        }
    finally:
        server.terminate()
        server.wait(timeout=30)
    groups = served["groups"]["sessionGroups"]
    result = {
        "logdir": str(logdir),
        "url": base,
        "plugins": served["plugins"],
        "sessions": len(groups),
        "hparams": sorted(h["name"] for h in served["experiment"].get("hparamInfos", [])),
        "metrics": sorted(m["name"]["tag"] for m in served["experiment"].get("metricInfos", [])),
        "rows": [
            {
                "hparams": g["hparams"],
                "metrics": {m["name"]["tag"]: m["value"] for m in g.get("metricValues", [])},
            }
            for g in groups
        ],
        "screenshots": shots,
        "machine": machine(),
    }
    (out / "tensorboard_check.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 2 when Chromium is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default=None, help="runs to serve (default: a demo sweep)")
    parser.add_argument("--out", default="bench/results/tensorboard", help="where PNGs go")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--chromium", default=None, help="Chromium/Chrome binary")
    ns = parser.parse_args(argv)
    chromium = find_chromium(ns.chromium)
    if chromium is None:
        print(
            "chromium not found: install it to run this check "
            "(Debian/Ubuntu: sudo apt-get install chromium), or pass --chromium PATH",
            file=sys.stderr,
        )
        return 2
    out = Path(ns.out)
    logdir = Path(ns.logdir) if ns.logdir else demo_sweep(out / "runs")
    result = check(logdir, out, chromium, ns.port)
    print(
        f"served {result['sessions']} HParams sessions from {logdir}: "
        f"hparams {', '.join(result['hparams'])}; metrics {', '.join(result['metrics'])}"
    )
    for name, path in result["screenshots"].items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
