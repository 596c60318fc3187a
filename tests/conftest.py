"""Suite-wide rules: markers (registered in pyproject.toml) and parallel workers.

``make test`` runs the suite on one pytest-xdist worker per core (``--dist loadscope``): a
module's tests run on one worker, so its module-scoped fixtures (a loaded model, a Ray runtime)
are built once, and the modules spread over the workers, the Ray ones included. Each worker's
Ray tests share one Ray session where they can (``shared_ray`` in tests/marl/conftest.py), and
each worker's torch (and the CLI subprocesses and Ray actors it starts, through
``OMP_NUM_THREADS``) takes its share of the cores instead of all of them: two processes of two
threads on two cores run 4 to 6 times slower than one (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker: this worker's share of the cores, for torch and its subprocesses."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers <= 1:
        return
    import torch

    from marl.runtime.threads import available_cores

    threads = max(1, available_cores() // workers)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``ray`` is also ``slow``: starting Ray costs seconds here, so the fast loop
    (``-m "not slow"``) leaves out every Ray test, including ones that only say ``ray``.

    The modules with the most ``slow`` tests come first (the order within a module is kept):
    xdist hands out modules in collection order, so the long ones start while the other worker
    takes the many short ones, instead of one long module finishing alone at the end."""
    for item in items:
        if item.get_closest_marker("ray") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        weight[module] = weight.get(module, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -weight[item.nodeid.split("::", 1)[0]])  # stable


def _hide_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test whose expectation holds only on a machine without a GPU: torch reports no
    CUDA device for its duration, so the platform places everything on the CPU, as on CI."""
    _hide_gpus(monkeypatch)


@pytest.fixture(scope="module")
def no_gpu_module() -> Iterator[None]:
    """:func:`no_gpu` for a module-scoped fixture (a runtime compared with CPU references)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _hide_gpus(monkeypatch)
        yield


# --- the marl CLI in a process of its own, without paying its imports each time -----------------

# Third-party libraries a `marl train` of the tiny model imports (about 4 of its 6 CPU-seconds
# here). marl's own modules are not preloaded: each command imports them as a fresh process does.
CLI_PRELOAD = (
    "torch", "numpy", "yaml", "networkx", "pettingzoo", "gymnasium", "omegaconf", "hydra",
    "hydra.core.config_store", "hydra._internal.utils", "transformers",
    "transformers.modeling_utils", "transformers.models.llama.modeling_llama",
    "transformers.models.llama.configuration_llama", "transformers.tokenization_utils_base",
    "tokenizers", "peft", "accelerate", "matplotlib", "matplotlib.pyplot",
    "torch.utils.tensorboard", "tensorboard",
)  # fmt: skip
# Environment variables that the preloaded libraries or Python itself read at start-up or import
# (Python's own, the loader's, torch's and its kernels', Hugging Face's, matplotlib's, numpy's,
# the caches' and the locale's): a command whose value differs from the server's runs in a fresh
# interpreter. Everything else (threads, Hydra's, Ray's, marl's, PATH, ...) is read when it is
# used, and the forked command gets the value it asked for.
CLI_IMPORT_ENV_PREFIXES = (
    "PYTHON", "LD_", "TORCH_", "PYTORCH_", "CUDA", "ATEN_", "ONEDNN_", "DNNL_", "MKL_ENABLE_",
    "MKL_DEBUG_", "KMP_", "HF_", "HUGGINGFACE", "TRANSFORMERS_", "TOKENIZERS_", "MPL", "NPY_",
    "OPENBLAS_", "XDG_", "LC_",
)  # fmt: skip
CLI_IMPORT_ENV = ("HOME", "LANG", "LANGUAGE", "TMPDIR")
# ...except these, read when used: the breakpoint hook (Ray's driver sets it) and the warnings
# filters, which the child applies itself with the stdlib's own parser where the server has none.
CLI_RUNTIME_ENV = ("PYTHONBREAKPOINT", "PYTHONWARNINGS")


def read_at_import(key: str) -> bool:
    """Whether a start-up or import reads the environment variable ``key``."""
    if key in CLI_RUNTIME_ENV:
        return False
    return key in CLI_IMPORT_ENV or key.startswith(CLI_IMPORT_ENV_PREFIXES)


_CLI_CHILD = """
import atexit, io, os, sys, traceback
os.chdir({cwd!r})
os.environ.clear()
os.environ.update({env!r})
sys.path[:] = {path!r}
sys.argv[:] = {argv!r}
if {warnings!r}:
    import warnings
    sys.warnoptions[:] = {warnings!r}
    warnings._processoptions(sys.warnoptions)
for fd, name in enumerate(({stdin!r}, {stdout!r}, {stderr!r})):
    opened = os.open(name, os.O_WRONLY if fd else os.O_RDONLY)
    os.dup2(opened, fd)
    os.close(opened)
sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
sys.stderr = io.TextIOWrapper(
    io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
    line_buffering=True,
)
try:
    from marl.cli import main
    code = main()
except SystemExit as exc:
    code = exc.code
except BaseException:
    traceback.print_exc()
    code = 1
if not isinstance(code, int) and code is not None:
    print(code, file=sys.stderr)
    code = 1
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code or 0)
"""


class MarlCli:
    """Runs ``marl <args>`` as its own process and returns what ``subprocess.run(...,
    capture_output=True, text=True, cwd=cwd)`` would: the exit status, stdout and stderr.

    The process is forked from a server that has already imported :data:`CLI_PRELOAD`
    (``multiprocessing``'s forkserver), so a command costs its own work, not the ~4 CPU-seconds
    of importing torch and transformers again; everything else is as the console script has it:
    a process of its own, the script's ``sys.argv`` and ``sys.path``, the caller's working
    directory and environment, fds 0-2 of its own, exit handlers run. Where the environment
    differs from the server's in a variable read at start-up or import (:func:`read_at_import`),
    the command runs in a fresh interpreter instead. Tests of what a fresh interpreter imports,
    of signals or of streaming output start the script themselves.
    """

    def __init__(self, scratch: Path) -> None:
        import multiprocessing

        self.script = str(Path(sys.executable).with_name("marl"))
        self.scratch = scratch
        self.calls = 0
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(CLI_PRELOAD))
        self.server_env: dict[str, str] | None = None  # the environment the server started in
        probe = subprocess.run(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        self.path = [str(Path(self.script).parent), *json.loads(probe.stdout)]

    def forks(self, env: dict[str, str]) -> bool:
        """Whether a command with ``env`` can run forked from the server."""
        server = dict(os.environ) if self.server_env is None else self.server_env
        if "PYTHONWARNINGS" in server and env.get("PYTHONWARNINGS") != server["PYTHONWARNINGS"]:
            return False  # the child adds filters; it cannot take the server's away
        keys = set(env) | set(server)
        return all(env.get(key) == server.get(key) for key in keys if read_at_import(key))

    def __call__(
        self,
        *args: str,
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 600,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        argv = [self.script, *map(str, args)]
        cwd = os.getcwd() if cwd is None else cwd
        env = dict(os.environ if env is None else env)
        if not self.forks(env):
            return subprocess.run(
                argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout,
                input=input,
            )  # fmt: skip
        self.calls += 1
        if self.server_env is None:  # the first command starts the server, from os.environ
            self.server_env = dict(os.environ)
        files = self.scratch / f"call{self.calls}"
        files.mkdir(parents=True)
        stdin, stdout, stderr = (files / name for name in ("stdin", "stdout", "stderr"))
        stdin.write_text(input or "")
        stdout.touch()
        stderr.touch()
        code = _CLI_CHILD.format(
            cwd=str(cwd), env=env, path=self.path, argv=argv, stdin=str(stdin),
            warnings=[w for w in env.get("PYTHONWARNINGS", "").split(",") if w],
            stdout=str(stdout), stderr=str(stderr),
        )  # fmt: skip
        process = self.context.Process(target=exec, args=(code, {"__name__": "__main__"}))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout, stdout.read_text(), stderr.read_text())
        return subprocess.CompletedProcess(
            argv, process.exitcode, stdout.read_text(), stderr.read_text()
        )


@pytest.fixture(scope="session")
def marl_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MarlCli]:
    """:class:`MarlCli`, one server per xdist worker; stopped (and reaped, so `time` counts its
    children's CPU) when the worker's tests are done."""
    runner = MarlCli(tmp_path_factory.mktemp("marl-cli"))
    yield runner
    from multiprocessing import forkserver

    forkserver._forkserver._stop()
