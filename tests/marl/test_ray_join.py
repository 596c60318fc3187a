"""Joining a Ray cluster as a new user would: token authentication and resource refusals.

Ray 2.60's ``ray start --head`` turns token authentication on whenever the head has a token
(``~/.ray/auth_token``, which any earlier local ``ray.init()`` on the machine writes, a
``marl train ray=local`` run included). The head node here is started that way: a ``HOME`` of
its own, a token made there with ``ray get-auth-token --generate``, ``RAY_AUTH_MODE`` unset; in
its own process group, which the teardown kills (never ``ray stop``). Against it:

- ``marl train ray=cluster ray.address=<head>`` without a token fails at once with one line that
  says what to set (it used to retry ``InvalidAuthToken`` for 20 s and end in a traceback);
- with the documented setting (``RAY_AUTH_MODE=token`` and the token's file in
  ``RAY_AUTH_TOKEN_PATH``) it joins; the preset's requests are refused with values that fit, for
  four independent learners too, and those values train a step.

The rest needs no cluster: which overrides the refusal suggests for every sharing mode, and the
one-line messages for each way joining fails.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from hydra import compose, initialize_config_module  # noqa: E402
from ray.exceptions import AuthenticationError  # noqa: E402

from marl.cli import register_scenario_options  # noqa: E402
from marl.config import RayConfig, load_config  # noqa: E402
from marl.runtime.policy_map import plan_for  # noqa: E402
from marl.runtime.ray_join import (  # noqa: E402
    MAX_TOKEN_BYTES,
    host_port,
    join_failure,
    probe,
    speaks_grpc,
    token_source_problem,
)
from marl.runtime.ray_runtime import can_place, suggest_fit  # noqa: E402

RAY = str(Path(sys.executable).with_name("ray"))
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- no cluster: the messages and the suggestions -------------------------------------------


def test_an_explicit_address_is_told_from_one_ray_resolves() -> None:
    assert host_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert host_port("[::1]:6379") == ("::1", 6379)
    assert host_port("auto") is None and host_port("ray://h:10001") is None
    assert host_port("local") is None


def test_a_token_refusal_says_what_to_set() -> None:
    refused = AuthenticationError("RPC error: InvalidAuthToken: token is missing or incorrect")
    message = join_failure("10.0.0.5:6379", refused)
    assert message.startswith("ray.address=10.0.0.5:6379: the cluster asks for a token")
    for needed in ("RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "scaling.md"):
        assert needed in message
    assert "\n" not in message
    # what ray.init raises after its retries: the token refusal is in the chained cause
    try:
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: InvalidAuthToken")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from cause
    except ConnectionError as exc:
        assert "RAY_AUTH_MODE=token" in join_failure("10.0.0.5:6379", exc)
    other = join_failure("h:1", ConnectionError("Failed to connect to Ray cluster at h:1\nmore"))
    assert "could not join the Ray cluster there (ConnectionError: Failed to connect" in other
    assert "\n" not in other and "RAY_AUTH" not in other


def test_nothing_at_the_address_is_one_line_at_once() -> None:
    port = _free_port()  # bound and released: nothing listens there now
    start = time.monotonic()
    message = probe(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 5
    assert message == (
        f"ray.address=127.0.0.1:{port}: nothing answers there (Connection refused); start the "
        "head node with `ray start --head` and use the address it prints"
    )
    assert probe("auto") is None


def test_ray_s_own_words_come_with_the_hint() -> None:
    said = AuthenticationError("RAY_AUTH_TOKEN_PATH is set but file cannot be opened: /x. Ensure")
    message = join_failure("h:1", said)
    assert "RAY_AUTH_MODE=token" in message and "(Ray: RAY_AUTH_TOKEN_PATH is set but" in message
    assert "\n" not in message


def test_a_token_source_that_cannot_be_a_token_is_refused_before_ray_reads_it(
    tmp_path: Path,
) -> None:
    """A FIFO would block Ray's reader forever, /dev/zero would be read until memory ran out,
    a folder, a missing, an empty or a huge file is no token: each one line naming the key."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    good = tmp_path / "token"
    good.write_text("ab" * 32)
    empty, huge = tmp_path / "empty", tmp_path / "huge"
    empty.write_text("")
    huge.write_bytes(b"a" * (MAX_TOKEN_BYTES + 1))
    token = {"RAY_AUTH_MODE": "token"}
    for path, why in [
        (fifo, "not a regular file"),
        ("/dev/zero", "not a regular file"),
        (tmp_path, "not a regular file"),
        (tmp_path / "missing", "cannot be read (No such file"),
        (empty, "0 bytes, not a token"),
        (huge, f"{MAX_TOKEN_BYTES + 1} bytes, not a token"),
    ]:
        message = token_source_problem({**token, "RAY_AUTH_TOKEN_PATH": str(path)})
        assert message and message.startswith(f"RAY_AUTH_TOKEN_PATH={path}: {why}"), message
        assert "\n" not in message
    assert token_source_problem({**token, "RAY_AUTH_TOKEN_PATH": str(good)}) is None
    assert token_source_problem({"RAY_AUTH_TOKEN_PATH": str(fifo)}) is None  # auth not on
    long_token = {**token, "RAY_AUTH_TOKEN": "a" * (MAX_TOKEN_BYTES + 1)}
    assert token_source_problem(long_token).startswith("RAY_AUTH_TOKEN: 4097 bytes")


def test_an_address_where_something_else_listens_is_told_at_once() -> None:
    """A web server (or SSH) at the address: Ray's client would retry for 40 s and print its
    C++ warnings; the HTTP/2 handshake a GCS answers tells it in a moment."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        start = time.monotonic()
        assert speaks_grpc("127.0.0.1", port) is False
        message = probe(f"127.0.0.1:{port}")
        assert time.monotonic() - start < 5
        assert message.startswith(
            f"ray.address=127.0.0.1:{port}: something answers there, but not a Ray cluster"
        )
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_fifo_token_path_fails_the_cli_in_one_line_not_a_hang(marl_cli, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(fifo), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    # `marl train` in a process of its own, forked from the session's CLI server (the RAY_AUTH_*
    # variables are read when Ray is imported, which the server has not done)
    done = marl_cli(
        "train", "ray=local", "model=tiny", "train.steps=1", f"hydra.run.dir={run}",
        timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: RAY_AUTH_TOKEN_PATH={fifo}: not a regular file (a FIFO, device or folder would "
        "block or never end when read); name the file that holds the cluster's token"
    ], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (run / "checkpoints").exists()


def _plan(sharing: str, scenario: str = "relay"):
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        cfg = compose(
            config_name="train",
            overrides=["ray=cluster", "model=tiny", f"scenario={scenario}", f"sharing={sharing}"],
        )
    return load_config(cfg), plan_for(load_config(cfg))


@pytest.mark.parametrize("sharing", ["shared", "independent", "lora"])
@pytest.mark.parametrize("cpus", [[2.0], [1.0], [3.0, 2.0]])
def test_the_refusal_finds_values_that_fit_for_every_sharing_mode(
    sharing: str, cpus: list[float]
) -> None:
    config, plan = _plan(sharing)
    settings = config.ray
    assert (settings.learner_num_cpus, settings.num_rollout_workers) == (4.0, 4)  # the preset
    learners = [{"CPU": settings.learner_num_cpus} for _ in plan.trainable]
    assert len(learners) == (1 if sharing == "shared" else 4)  # relay: four agents
    nodes = [{"CPU": c, "GPU": 0.0} for c in cpus]
    workers = min(settings.num_rollout_workers, config.train.seeds_per_step)
    worker = {"CPU": settings.worker_num_cpus, "GPU": 0.0}
    assert not can_place(learners, settings.placement_strategy, [worker] * workers, nodes)
    fix = suggest_fit(learners, settings, workers, nodes)
    assert fix, f"{sharing} on {cpus}: no values suggested"
    lcpu = fix.get("ray.learner_num_cpus", settings.learner_num_cpus)
    wcpu = fix.get("ray.worker_num_cpus", settings.worker_num_cpus)
    count = int(fix.get("ray.num_rollout_workers", workers))
    fitted = [{"CPU": lcpu} for _ in learners]
    assert can_place(
        fitted, settings.placement_strategy, [{"CPU": wcpu, "GPU": 0.0}] * count, nodes
    )
    assert count >= 1 and RayConfig(learner_num_cpus=lcpu, worker_num_cpus=wcpu)


# --- a real head node with token authentication on (Ray's default) ----------------------------


@pytest.fixture(scope="module")
def auth_head(
    tmp_path_factory: pytest.TempPathFactory, start_ray_head
) -> Iterator[tuple[str, Path]]:
    """(address, token file) of a 2-CPU head node started as ``ray start --head`` starts. A head
    of its own, not the shared session: token authentication on, with a HOME and token that are
    not the user's, joined by separate ``marl train`` processes as a new user's would."""
    home = tmp_path_factory.mktemp("ray-home")
    env = {**{k: v for k, v in os.environ.items() if k not in AUTH_VARS}, "HOME": str(home)}
    # a machine where Ray has run before has a token; ray start --head then turns auth on
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True)
    log = home / "ray-start.log"
    # its own HOME and token file, not the user's
    with start_ray_head(log, env) as (address, _):
        assert "Token authentication is enabled" in log.read_text()
        yield address, home / ".ray" / "auth_token"


OVERRIDES = [
    "ray=cluster",
    "model=tiny",
    "scenario=relay",
    "sharing=independent",
    "sampling.max_new_tokens=4",
    "train.steps=1",
    "train.seeds_per_step=2",
    "train.group_size=2",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.transcripts_every=0",
]


def _train(marl_cli, address: str, env: dict[str, str], *extra: str, timeout: int = 600):
    """``marl train`` joining ``address`` as a user's driver does: a process of its own (forked
    from the CLI server, which has not imported Ray), with ``env`` and none of the caller's
    ``RAY_AUTH_*``."""
    base = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    return marl_cli(
        "train", *OVERRIDES, f"ray.address={address}", *extra,
        timeout=timeout, env={**base, "OMP_NUM_THREADS": "1", **env},
    )  # fmt: skip


@pytest.mark.ray
@pytest.mark.subprocess
def test_joining_without_the_token_is_one_line_that_says_what_to_set(
    marl_cli, auth_head: tuple[str, Path], tmp_path: Path
) -> None:
    address, _ = auth_head
    start = time.monotonic()
    done = _train(marl_cli, address, {}, f"hydra.run.dir={tmp_path}", timeout=300)
    elapsed = time.monotonic() - start
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith(f"error: ray.address={address}: the cluster asks for a token")
    assert "RAY_AUTH_MODE=token" in errors[0]
    assert "Traceback" not in done.stderr
    # Ray's own words, if any, ride on the one line, after the hint
    assert all("InvalidAuthToken" not in line for line in done.stderr.splitlines()[:-1])
    assert elapsed < 60, f"took {elapsed:.0f}s: it waited for Ray's retries"


@pytest.mark.ray
@pytest.mark.subprocess
def test_with_the_documented_setting_the_suggested_values_train_a_step(
    marl_cli, auth_head: tuple[str, Path], tmp_path: Path
) -> None:
    address, token = auth_head
    assert token.is_file()
    documented = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    refused = _train(
        marl_cli, address, documented, f"hydra.run.dir={tmp_path / 'preset'}", timeout=300
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    message = refused.stderr.strip().splitlines()[-1]
    assert "4 learner(s) x 4 CPU" in message and "sharing=independent" in message, message
    assert "2 rollout worker(s) (ray.num_rollout_workers=4;" in message, message
    suggested = re.search(r"this would fit: (.*)$", message).group(1).split()
    assert suggested == ["ray.learner_num_cpus=0.25", "ray.worker_num_cpus=0.5"], message
    run_dir = tmp_path / "fits"
    done = _train(marl_cli, address, documented, *suggested, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert "Traceback" not in done.stderr
