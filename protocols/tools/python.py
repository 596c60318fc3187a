"""The ``python`` tool: run a snippet in a separate, limited interpreter process.

Every call starts a fresh interpreter (``python -s -P`` with an environment built from nothing,
so no inherited ``PYTHON*`` variable, user site or current directory reaches it; ``-I`` is not
used because it would also drop ``PYTHONHASHSEED=0``, and a fixed hash seed plus
``random.seed(0)`` is what makes a call replay exactly). Before ``exec`` the child:

- starts a new session, so the whole process group can be killed;
- gets kernel resource limits: ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_AS`` (``memory_mb``),
  ``RLIMIT_FSIZE`` (largest file it may write, which also caps its output), ``RLIMIT_NPROC`` 0
  (no new process or thread: a fork bomb fails at its first fork), ``RLIMIT_NOFILE`` and
  ``RLIMIT_CORE`` 0;
- leaves the network: a new, empty network namespace (``unshare(CLONE_NEWNET)``, as root or
  through a user namespace); where the kernel refuses, the Python-level guard below remains;
- as root, drops to the ``nobody`` user (when an interpreter exists that ``nobody`` may run), so
  the kernel refuses writes outside world-writable places, and ``RLIMIT_NPROC`` holds (the
  kernel never enforces it for root).

The snippet runs in a fresh temporary directory (its working directory and ``HOME``), deleted
afterwards, under a Python audit hook that refuses opening files outside that directory and the
interpreter's own library, sockets, subprocesses, ``fork``/``exec``, ``ctypes`` and signals.
The parent enforces the wall clock: past ``timeout`` seconds it kills the process group.

What this does NOT guard against (docs/tools.md): the audit hook is not a security boundary (a
determined snippet can find ways around a Python-level hook), so reading world-readable files
and writing to world-writable directories (``/tmp``, ``/dev/shm``) are refused only by it; when
the kernel refuses a network namespace, network access is refused only by it; CPU and memory
spent by other means (disk I/O, many small files within the size limit) are bounded only by the
time limit. Do not run snippets from agents you would not run on this machine yourself.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marl.protocols.tools.base import ToolError, register_tool

OUTPUT_FILE_BYTES = 256_000  # RLIMIT_FSIZE: the output file (and any file) stops here
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

# Runs in the child before the snippet: fixed seed, the audit hook, the snippet, a short error.
PRELUDE = r"""
import sys, os, random
random.seed(0)
_ROOT = os.path.realpath(os.getcwd())
_LIB = tuple(os.path.realpath(p) for p in sys.path if p) + (os.path.realpath(sys.prefix),
        os.path.realpath(sys.base_prefix), os.path.realpath(sys.exec_prefix))
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.fork", "os.posix_spawn",
            "os.spawn", "os.kill", "os.killpg", "signal.", "ctypes.", "pty.", "os.startfile",
            "sys.addaudithook", "os.chdir", "os.chroot", "shutil.rmtree", "os.symlink", "os.link")
def _inside(path, roots):
    try:
        real = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "")
    except Exception:
        return False
    return any(real == r or real.startswith(r + os.sep) for r in roots)
def _guard(event, args):
    if event.startswith(_BLOCKED) or (
            event == "import" and args and args[0] in ("ctypes", "_ctypes")):
        raise PermissionError(f"refused in the sandbox: {event}")
    if event == "open" and args and not isinstance(args[0], int):
        path, mode = args[0], args[1] if len(args) > 1 else "r"
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        if isinstance(mode, int):
            writing = bool(mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
        if not _inside(path, (_ROOT,)) and (writing or not _inside(path, _LIB)):
            raise PermissionError(
                f"refused in the sandbox: opening {os.fsdecode(path)!r} outside its directory")
    if event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                 "os.truncate", "os.utime") and args and not _inside(args[0], (_ROOT,)):
        raise PermissionError(f"refused in the sandbox: {event} outside its directory")
_code = open("snippet.py", encoding="utf-8").read()
sys.addaudithook(_guard)
del _guard
try:
    exec(compile(_code, "<snippet>", "exec"), {"__name__": "__main__"})
except SystemExit as exc:
    raise
except BaseException as exc:
    sys.stdout.flush()
    print(f"{type(exc).__name__}: {exc}"[:500], file=sys.stderr)
    sys.exit(1)
"""


@dataclass(frozen=True)
class PythonParams:
    """memory_mb: address-space limit of the process in MB (RLIMIT_AS)."""

    memory_mb: int = 256


@dataclass
class SandboxResult:
    """What a snippet printed (stdout and stderr together, cut to a size), how it ended, and
    which guards were in force."""

    output: str
    error: str | None  # None when it exited with status 0
    seconds: float
    network_namespace: bool
    dropped_to: str | None  # the user it ran as, when root dropped privileges


def _world_runnable(path: str) -> bool:
    """Whether user ``nobody`` could execute ``path`` (every directory on the way searchable)."""
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(real)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == os.path.dirname(parent):
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def sandbox_interpreter() -> tuple[str, int | None]:
    """The interpreter to run and, as root, the uid to drop to (None: stay as we are)."""
    if os.geteuid() != 0:
        return sys.executable, None
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return sys.executable, None
    for candidate in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3"):
        if candidate and _world_runnable(candidate):
            return candidate, nobody
    return sys.executable, None


try:  # resolved in the parent: the child, between fork and exec, only calls it
    _UNSHARE: Any = ctypes.CDLL(None, use_errno=True).unshare
except (OSError, AttributeError):  # no libc symbol table (not Linux)
    _UNSHARE = None


def _unshare_network() -> bool:
    """Move the calling process into a new network namespace; False when the kernel refuses."""
    if _UNSHARE is None:
        return False
    if _UNSHARE(CLONE_NEWNET) == 0:
        return True
    return bool(_UNSHARE(CLONE_NEWUSER | CLONE_NEWNET) == 0)


def _preexec(cpu_seconds: int, memory_bytes: int, uid: int | None, status_fd: int) -> None:
    """In the child, between fork and exec: session, limits, network, user."""
    os.setsid()
    isolated = _unshare_network()
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_FILE_BYTES, OUTPUT_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.write(status_fd, b"1" if isolated else b"0")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(code: str, timeout: float, memory_mb: int = 256) -> SandboxResult:
    """Run ``code`` in a fresh limited interpreter (module docstring); never raises for what
    the snippet does: a failure, limit or kill is the result's ``error``."""
    interpreter, uid = sandbox_interpreter()
    workdir = tempfile.mkdtemp(prefix="marl-python-")
    start = time.monotonic()
    read_fd, write_fd = os.pipe()
    try:
        with open(os.path.join(workdir, "snippet.py"), "w", encoding="utf-8") as handle:
            handle.write(code)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
        output_path = os.path.join(workdir, ".output")
        with open(output_path, "wb") as out:
            env = {
                "PYTHONHASHSEED": "0",
                "PYTHONIOENCODING": "utf-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PATH": "/usr/bin:/bin",
                "HOME": workdir,
                "TMPDIR": workdir,
                "LANG": "C.UTF-8",
            }
            cpu = max(1, int(timeout + 0.999))
            try:
                proc = subprocess.Popen(  # noqa: S603 - a fixed argv; the snippet is a file
                    [interpreter, "-s", "-P", "-c", PRELUDE],
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    # runs before close_fds, so write_fd is still open in it (closed at exec)
                    preexec_fn=lambda: _preexec(cpu, memory_mb * 2**20, uid, write_fd),  # noqa: PLW1509
                    close_fds=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return SandboxResult(
                    "", f"the sandbox could not start: {exc}", time.monotonic() - start, False, None
                )
            os.close(write_fd)
            write_fd = -1
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc.pid)  # whatever it left behind in its group goes too
            if timed_out:
                proc.wait()
        status = os.read(read_fd, 1)
        seconds = time.monotonic() - start
        with open(output_path, "rb") as handle:
            raw = handle.read(OUTPUT_FILE_BYTES)
        output = raw.decode("utf-8", errors="replace")
        error = _describe_end(proc.returncode, timed_out, timeout, memory_mb, output)
        return SandboxResult(output, error, seconds, status == b"1", "nobody" if uid else None)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _describe_end(
    code: int, timed_out: bool, timeout: float, memory_mb: int, output: str
) -> str | None:
    """How the process ended, in words, or None for a clean exit."""
    if timed_out:
        return f"time limit of {timeout:g} s exceeded; the process was killed"
    too_long = len(output.encode("utf-8", errors="replace")) >= OUTPUT_FILE_BYTES
    if too_long or code == -signal.SIGXFSZ:
        return f"output limit of {OUTPUT_FILE_BYTES} bytes exceeded; the rest was dropped"
    if code == 0:
        return None
    if code == -signal.SIGXCPU or code == -signal.SIGKILL:
        cpu = max(1, int(timeout + 0.999))
        return f"CPU time limit of {cpu} s exceeded; the process was killed"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    if "MemoryError" in output:
        return f"memory limit of {memory_mb} MB exceeded"
    last = output.strip().splitlines()[-1] if output.strip() else f"exit status {code}"
    return last


@register_tool(
    "python",
    "Python in a sandbox: write `CALL python:` and then one line of code (`;` between "
    "statements); you see what it prints",
    params=PythonParams,
    check=lambda options, agents: (
        []
        if isinstance(options.get("memory_mb", 256), int)
        and not isinstance(options.get("memory_mb", 256), bool)
        and 64 <= options.get("memory_mb", 256) <= 4096
        else [("memory_mb", "must be an integer between 64 and 4096")]
    ),
)
def python_tool(query: str, settings: Mapping[str, Any], data: Any) -> str:
    """Run ``query`` (one line; ``;`` separates statements) and return what it printed."""
    code = query.strip()
    if not code:
        raise ToolError("empty snippet")
    result = run_sandboxed(code, float(settings["timeout"]), int(settings.get("memory_mb", 256)))
    if result.error is not None:
        printed = result.output.strip()
        tail = printed.splitlines()[-1] if printed else ""
        if tail and tail != result.error:
            raise ToolError(f"{result.error} (last output: {tail[:200]})")
        raise ToolError(result.error)
    return result.output.rstrip("\n") or "(no output)"
