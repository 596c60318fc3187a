"""The ``python`` tool: run a snippet in a separate, limited interpreter process.

The boundary is the kernel's; a Python audit hook adds clear error messages on top of it
(docs/tools.md lists what each part stops and the test that checks it). Every call starts a
fresh interpreter (``python -s -P`` with an environment built from nothing, so no inherited
``PYTHON*`` variable, user site or current directory reaches it; ``-I`` is not used because it
would also drop ``PYTHONHASHSEED=0``, and a fixed hash seed plus ``random.seed(0)`` is what makes
a call replay exactly) in a fresh working directory (mode 0700, also its ``HOME`` and
``TMPDIR``). Before ``exec`` the child:

- starts a new session, so the whole process group can be killed;
- enters new mount and network namespaces (as root, or through a user namespace where the
  kernel allows one): the network namespace is empty; in the mount namespace ``/tmp``,
  ``/var/tmp``, ``/dev/shm``, ``/run/lock`` and the working directory's parent are empty,
  read-only-for-it tmpfs mounts that vanish with the process, with only its own working
  directory bound back in, so it neither sees other sandboxes' directories nor leaves a file
  behind outside its working directory;
- as root, drops to a user id of its own (a fresh, unused uid per call; ``nobody`` where no
  such id is mapped), when an interpreter exists that any user may run: root-only files are
  then unreadable, nothing outside world-writable places is writable, and ``RLIMIT_NPROC``
  holds (the kernel never enforces it for root);
- gets kernel resource limits: ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_AS`` (``memory_mb``),
  ``RLIMIT_FSIZE`` (largest file it may write), ``RLIMIT_NPROC`` 0 (no new process or thread),
  ``RLIMIT_NOFILE`` and ``RLIMIT_CORE`` 0.

The parent never opens a path the sandbox could replace: it writes the snippet into the
directory before the child starts, reads stdout and stderr through a pipe it created, at most
``OUTPUT_BYTES`` bytes and never past the time limit, kills the process group, and removes the
working directory on every path without following a link (:func:`remove_tree`).

The audit hook refuses, with a readable message, opening files outside the working directory
and the interpreter's library, sockets, subprocesses, ``fork``/``exec``, ``ctypes``, signals,
``gc`` and frame introspection; its state lives in a closure over private copies of what it
calls, so no module global or patched function of the snippet's switches it off. It is not a
boundary: where the kernel guards above are missing, what they would stop is stopped only by
the hook. Do not run snippets from agents you would not run on this machine yourself.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import secrets
import select
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

OUTPUT_BYTES = 256_000  # stdout + stderr read from the pipe; past this the process is killed
OUTPUT_FILE_BYTES = 256_000  # RLIMIT_FSIZE: the largest file the snippet may write
PRIVATE_MOUNTS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # hidden by empty tmpfs mounts
FRESH_UIDS = (1_900_000_000, 100_000_000)  # first uid and how many: a fresh one per call, as root
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH = 2

# Runs in the child before the snippet: fixed seed, the audit hook, the snippet, a short error.
# Everything the hook calls is bound in `_install`'s closure from C functions (`posix`), so
# the snippet cannot reach or patch it: not through a module global (there is none), not
# through `gc` (refused; a frame does not hold its function), not by replacing its code
# (refused) or `os.path.realpath` (it is not used).
PRELUDE = r"""
import sys, os, random
random.seed(0)
def _install(posix=__import__("posix"), isinstance=isinstance, any=any, str=str, bytes=bytes,
             int=int, len=len, type=type, PermissionError=PermissionError, OSError=OSError,
             Exception=Exception, repr=repr, bool=bool):
    lstat, readlink, getcwd, fspath = posix.lstat, posix.readlink, posix.getcwd, posix.fspath

    def fsdecode(path):
        path = fspath(path)
        return path.decode("utf-8", "surrogateescape") if isinstance(path, bytes) else path
    writes = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_APPEND | posix.O_TRUNC

    def real(path):  # os.path.realpath from C calls only; None when it cannot be resolved
        try:
            path = fsdecode(path)
        except Exception:
            return None
        if not isinstance(path, str) or "\0" in path:
            return None
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        todo, done, links = path.split("/")[::-1], [], 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join(done + [part])
            try:
                mode = lstat(here).st_mode
            except OSError:
                done.append(part)
                continue
            if mode & 0o170000 == 0o120000:
                links += 1
                if links > 40:
                    return None
                target = readlink(here)
                if target.startswith("/"):
                    done = []
                todo.extend(target.split("/")[::-1])
            else:
                done.append(part)
        return "/" + "/".join(done)

    root = real(getcwd())
    lib = tuple(r for r in (real(p) for p in sys.path if p) if r and r != "/") + tuple(
        real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    blocked = ("socket.", "subprocess.", "os.system", "os.exec", "os.fork", "os.posix_spawn",
               "os.spawn", "os.kill", "os.killpg", "signal.", "ctypes.", "pty.", "os.startfile",
               "sys.addaudithook", "os.chdir", "os.chroot", "shutil.rmtree", "os.symlink",
               "os.link", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
               "sys.settrace", "sys.setprofile", "os.mkfifo", "os.mknod", "os.listdir",
               "os.scandir", "glob.glob", "os.chmod", "os.chown")
    changes = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.utime")

    def inside(path, roots):
        resolved = real(path)
        return resolved is not None and any(
            resolved == r or resolved.startswith(r + "/") for r in roots)

    def guard(event, args):
        if event.startswith(blocked) and not (
                event in ("os.listdir", "os.scandir", "glob.glob", "os.chmod")
                and args and inside(args[0] if args[0] is not None else ".",
                                    (root,) if event == "os.chmod" else (root,) + lib)):
            raise PermissionError("refused in the sandbox: " + event)
        if event == "import" and args and args[0] in ("ctypes", "_ctypes", "gc"):
            raise PermissionError("refused in the sandbox: import " + args[0])
        if event in ("object.__setattr__", "object.__delattr__") and len(args) > 1 and (
                args[1] == "__code__"):
            raise PermissionError("refused in the sandbox: replacing a function's code")
        if event == "open" and args and not isinstance(args[0], int):
            mode = args[1] if len(args) > 1 else "r"
            if isinstance(mode, int):
                writing = bool(mode & writes)
            else:
                writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            if not inside(args[0], (root,)) and (writing or not inside(args[0], lib)):
                shown = args[0] if isinstance(args[0], (str, bytes)) else "?"
                raise PermissionError(
                    "refused in the sandbox: opening " + repr(fsdecode(shown)[:200])
                    + " outside its directory")
        if event in changes and args and not inside(args[0], (root,)):
            raise PermissionError("refused in the sandbox: " + event + " outside its directory")
        if event == "os.rename" and len(args) > 1 and not inside(args[1], (root,)):
            raise PermissionError("refused in the sandbox: " + event + " outside its directory")

    sys.addaudithook(guard)

def _run(code, sys=sys, print=print, type=type, str=str, exec=exec, compile=compile,
         SystemExit=SystemExit, BaseException=BaseException):
    # its names are locals: a snippet that clears __main__'s globals still gets its error line
    try:
        exec(compile(code, "<snippet>", "exec"), {"__name__": "__main__"})
    except SystemExit:
        raise
    except BaseException as exc:
        sys.stdout.flush()
        print((type(exc).__name__ + ": " + str(exc))[:500], file=sys.stderr)
        sys.exit(1)
_code = open("snippet.py", encoding="utf-8").read()
_install()
del _install
_run(_code)
"""


@dataclass(frozen=True)
class PythonParams:
    """memory_mb: address-space limit of the process in MB (RLIMIT_AS)."""

    memory_mb: int = 256


@dataclass
class SandboxResult:
    """What a snippet printed (stdout and stderr together, cut to ``OUTPUT_BYTES``), how it
    ended, and which kernel guards were in force."""

    output: str
    error: str | None  # None when it exited with status 0
    seconds: float
    network_namespace: bool  # an empty network namespace
    dropped_to: str | None  # the user it ran as, when root dropped privileges ("uid 19...")
    private_tmp: bool = False  # the mount namespace: /tmp, /dev/shm, ... private and empty


def _world_runnable(path: str) -> bool:
    """Whether any user could execute ``path`` (every directory on the way searchable)."""
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


def _mapped(kind: str, ident: int) -> bool:
    """Whether ``ident`` is a valid uid/gid here (inside this process's user namespace)."""
    try:
        with open(f"/proc/self/{kind}_map", encoding="ascii") as handle:
            rows = [tuple(int(x) for x in line.split()) for line in handle if line.strip()]
    except (OSError, ValueError):
        return False
    return any(first <= ident < first + count for first, _, count in rows)


def fresh_uid() -> int | None:
    """An unused uid (and gid) for one call, or None where none is mapped here."""
    first, count = FRESH_UIDS
    for _ in range(8):
        uid = first + secrets.randbelow(count)
        if _mapped("uid", uid) and _mapped("gid", uid):
            try:
                pwd.getpwuid(uid)
            except KeyError:
                return uid
    return None


def sandbox_interpreter() -> tuple[str, int | None]:
    """The interpreter to run and, as root, the uid to drop to (None: stay as we are)."""
    if os.geteuid() != 0:
        return sys.executable, None
    uid = fresh_uid()
    if uid is None:
        try:
            uid = pwd.getpwnam("nobody").pw_uid
        except KeyError:
            return sys.executable, None
    for candidate in (sys.executable, "/usr/bin/python3"):
        if candidate and _world_runnable(candidate):
            return candidate, uid
    return sys.executable, None


try:  # resolved in the parent: the child, between fork and exec, only calls them
    _LIBC: Any = ctypes.CDLL(None, use_errno=True)
    _UNSHARE: Any = _LIBC.unshare
    _MOUNT: Any = _LIBC.mount
    _UMOUNT2: Any = _LIBC.umount2
except (OSError, AttributeError):  # no libc symbol table (not Linux)
    _UNSHARE = _MOUNT = _UMOUNT2 = None


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> bool:
    return bool(
        _MOUNT(
            source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            flags,
            None if data is None else data.encode(),
        )
        == 0
    )


def _private_mounts(workdir: str) -> bool:
    """In a new mount namespace (child only): every private mount point gets an empty tmpfs
    the sandbox cannot write, and its working directory is bound back at its own path. Undoes
    what it mounted and returns False when any step fails."""
    if not _mount("none", "/", None, MS_REC | MS_PRIVATE, None):
        return False  # never mount while mounts could propagate back to the host
    parent = os.path.dirname(workdir)
    if parent == "/":
        return False
    points = [p for p in dict.fromkeys((parent, *PRIVATE_MOUNTS)) if os.path.isdir(p)]
    done: list[str] = []
    try:
        for point in points:
            if not _mount(
                "tmpfs",
                point,
                "tmpfs",
                MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "mode=0755,size=64k,nr_inodes=64",
            ):
                raise OSError(ctypes.get_errno(), f"tmpfs on {point}")
            done.append(point)
        os.mkdir(workdir, 0o700)
        # the process's working directory is still the real one, under the new tmpfs
        if not _mount("/proc/self/cwd", workdir, None, MS_BIND, None):
            raise OSError(ctypes.get_errno(), "bind")
        done.append(workdir)
        os.chdir(workdir)
        return True
    except OSError:
        for point in reversed(done):
            _UMOUNT2(point.encode(), MNT_DETACH)
        return False


def _namespaces(workdir: str) -> tuple[bool, bool]:
    """Enter new network and mount namespaces (child only): (network, private mounts)."""
    if _UNSHARE is None:
        return False, False
    user = 0 if os.geteuid() == 0 else CLONE_NEWUSER
    if _UNSHARE(user | CLONE_NEWNS | CLONE_NEWNET) == 0:
        return True, _private_mounts(workdir)
    return _UNSHARE(user | CLONE_NEWNET) == 0, False


def _preexec(
    cpu_seconds: int, memory_bytes: int, uid: int | None, workdir: str, status_fd: int
) -> None:
    """In the child, between fork and exec: session, namespaces, user, limits."""
    os.setsid()
    network, mounts = _namespaces(workdir)
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
    os.write(status_fd, bytes([48 + network, 48 + mounts]))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def remove_tree(path: str) -> bool:
    """Delete ``path`` and everything under it without following a symbolic link, first
    giving back search and write permission to any directory the snippet took them from;
    True when it is gone. A FIFO, socket or device node is unlinked, never opened."""
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError:
        try:  # not a directory (or a link): unlink the name itself
            os.unlink(path)
        except OSError:
            pass
        return not os.path.lexists(path)
    try:
        _empty_dir(top)
    finally:
        os.close(top)
    try:
        os.rmdir(path)
    except OSError:
        pass
    return not os.path.lexists(path)


def _empty_dir(fd: int, depth: int = 0) -> None:
    """Remove everything in the directory open at ``fd`` (at most 256 levels deep)."""
    try:
        os.fchmod(fd, 0o700)
    except OSError:
        pass
    for name in os.listdir(fd):
        try:
            os.unlink(name, dir_fd=fd)
            continue
        except IsADirectoryError:
            pass
        except OSError:
            continue
        if depth >= 256:
            continue
        try:
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            continue
        try:
            _empty_dir(sub, depth + 1)
        finally:
            os.close(sub)
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            pass


def _read_bounded(fd: int, deadline: float) -> tuple[bytes, str]:
    """Read the child's output from the pipe at ``fd`` until it closes, ``OUTPUT_BYTES``
    have come, or the deadline passes: (bytes, "eof" | "limit" | "deadline")."""
    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), "deadline"
        if not poller.poll(max(1, int(left * 1000))):
            continue
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            return b"".join(chunks), "eof"
        chunks.append(chunk)
        size += len(chunk)
        if size > OUTPUT_BYTES:
            return b"".join(chunks)[:OUTPUT_BYTES], "limit"


def run_sandboxed(
    code: str, timeout: float, memory_mb: int = 256, audit_hook: bool = True
) -> SandboxResult:
    """Run ``code`` in a fresh limited interpreter (module docstring); never raises for what
    the snippet does: a failure, limit or kill is the result's ``error``. Returns within
    ``timeout`` seconds plus the interpreter's start-up and the kill. ``audit_hook=False``
    leaves only the kernel's guards: the tests use it to show what holds without the hook."""
    prelude = PRELUDE if audit_hook else PRELUDE.replace("\n_install()\n", "\n")
    interpreter, uid = sandbox_interpreter()
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="marl-python-")  # mode 0700
    fds: list[int] = []
    try:
        with open(os.path.join(workdir, "snippet.py"), "w", encoding="utf-8") as handle:
            handle.write(code)
        if uid is not None:
            os.chown(os.path.join(workdir, "snippet.py"), uid, uid)
            os.chown(workdir, uid, uid)
        status_read, status_write = os.pipe()
        out_read, out_write = os.pipe()
        fds += [status_read, status_write, out_read, out_write]
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
                [interpreter, "-s", "-P", "-c", prelude],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_write,
                stderr=subprocess.STDOUT,
                # runs before close_fds, so status_write is still open in it (closed at exec)
                preexec_fn=lambda: _preexec(cpu, memory_mb * 2**20, uid, workdir, status_write),  # noqa: PLW1509
                close_fds=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxResult(
                "", f"the sandbox could not start: {exc}", time.monotonic() - start, False, None
            )
        for fd in (status_write, out_write):
            os.close(fd)
            fds.remove(fd)
        deadline = time.monotonic() + timeout
        raw, ended = _read_bounded(out_read, deadline)
        timed_out = ended == "deadline"
        if ended == "eof":  # output closed; the process may still run (it closed fd 1 and 2)
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        _kill_group(proc.pid)  # whatever it left behind in its group goes too
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        status = os.read(status_read, 2)
        output = raw.decode("utf-8", errors="replace")
        if ended == "limit":
            error: str | None = (
                f"output limit of {OUTPUT_BYTES} bytes exceeded; the rest was dropped"
            )
        else:
            error = _describe_end(proc.returncode, timed_out, timeout, memory_mb, output)
        return SandboxResult(
            output,
            error,
            time.monotonic() - start,
            status[:1] == b"1",
            None if uid is None else _user_name(uid),
            status[1:2] == b"1",
        )
    finally:
        for fd in fds:
            os.close(fd)
        remove_tree(workdir)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _describe_end(
    code: int | None, timed_out: bool, timeout: float, memory_mb: int, output: str
) -> str | None:
    """How the process ended, in words, or None for a clean exit."""
    if timed_out or code is None:
        return f"time limit of {timeout:g} s exceeded; the process was killed"
    if code == -signal.SIGXFSZ:
        return f"file size limit of {OUTPUT_FILE_BYTES} bytes exceeded; the process was killed"
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
