"""The python tool's sandbox against hostile snippets: each gives a clear error in the reply,
crashes nothing and ends within its time limit; and a snippet replays exactly.

What is guaranteed depends on the machine (docs/tools.md): these tests assert the guarantees
this module makes everywhere (time, memory, output size, process group killed, no file written
outside the temp dir where the kernel or the audit hook stops it, errors as text), and print
which kernel-level guards were in force.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from marl.protocols.tools import ToolBox
from marl.protocols.tools.python import OUTPUT_FILE_BYTES, run_sandboxed

pytestmark = pytest.mark.subprocess

TIMEOUT = 1.0
SLACK = 2.0  # interpreter start-up and the kill, on a loaded 2-core machine


def _call(code: str, timeout: float = TIMEOUT, max_chars: int = 300):
    box = ToolBox(
        {"python": {"calls": 1, "max_chars": max_chars, "timeout": timeout, "memory_mb": 256}}
    )
    start = time.monotonic()
    outcome = box.call("python", code)
    elapsed = time.monotonic() - start
    assert elapsed < timeout + SLACK, f"{code!r} took {elapsed:.1f} s"
    assert outcome.text.startswith("RESULT python: ") and outcome.text.count("\n") == 1
    return outcome


def test_a_snippet_prints_and_replays_exactly() -> None:
    code = (
        "import random; print(random.randint(0, 10**9)); print(sorted({'b', 'a'}), {'x', 'y', 'z'})"
    )
    first, second = _call(code), _call(code)
    assert not first.error and first.text == second.text


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    outcome = _call("while True: pass")
    assert outcome.error and "time limit of 1 s exceeded" in outcome.text


def test_sleeping_past_the_limit_is_killed_too() -> None:
    outcome = _call("import time; time.sleep(60)")
    assert outcome.error and "time limit" in outcome.text


def _processes() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def test_a_fork_bomb_forks_nothing_and_leaves_nothing_behind() -> None:
    before = _processes()
    outcome = _call("import os\nwhile True: os.fork()")
    assert outcome.error and "refused in the sandbox: os.fork" in outcome.text
    # below the audit hook, the kernel's RLIMIT_NPROC of 0 refuses every new task (a thread is
    # one; threads are not audited) wherever it is enforced: not for root, so only when the
    # sandbox dropped to nobody or runs as an ordinary user
    if run_sandboxed("pass", TIMEOUT).dropped_to or os.geteuid() != 0:
        code = "import threading; t = threading.Thread(target=print); t.start(); t.join()"
        thread = _call(code)
        assert thread.error and "can't start new thread" in thread.text
    time.sleep(0.2)
    leftovers = [
        p
        for p in _processes() - before
        if Path(f"/proc/{p}/cmdline").exists()
        and b"marl-python" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    assert leftovers == []


def test_subprocesses_and_os_system_are_refused() -> None:
    for code in ("import subprocess; subprocess.run(['id'])", "import os; os.system('id')"):
        outcome = _call(code)
        assert outcome.error and "refused in the sandbox" in outcome.text


def test_reading_etc_passwd_is_refused_by_the_python_guard() -> None:
    """/etc/passwd is world-readable: the kernel would let the sandbox user read it. The audit
    hook refuses it (a Python-level guard, not a security boundary: docs/tools.md)."""
    outcome = _call("print(open('/etc/passwd').read())")
    assert outcome.error and "refused in the sandbox: opening '/etc/passwd'" in outcome.text
    assert "root:" not in outcome.text


def test_writing_outside_the_temp_dir_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os; fd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT); os.write(fd, b'x')",
        f"import pathlib; pathlib.Path({str(target)!r}).write_text('x')",
    ):
        outcome = _call(code)
        assert outcome.error and "refused in the sandbox" in outcome.text
        assert not target.exists()


def test_writing_inside_the_temp_dir_works_and_is_gone_afterwards() -> None:
    outcome = _call("open('note.txt', 'w').write('hi'); print(open('note.txt').read())")
    assert outcome.text == "RESULT python: hi\n"


def test_a_one_gigabyte_allocation_hits_the_memory_limit() -> None:
    outcome = _call("x = bytearray(1024 ** 3); print(len(x))")
    assert outcome.error and "memory limit of 256 MB exceeded" in outcome.text


def test_a_huge_output_is_cut_and_stays_bounded() -> None:
    for code in ("print('y' * 10 ** 7)", "while True: print('x' * 10000)"):
        outcome = _call(code, max_chars=200)
        assert len(outcome.text) < 400
        assert outcome.error and "output limit" in outcome.text
    result = run_sandboxed("print('z' * 10 ** 7)", TIMEOUT)
    assert len(result.output) <= OUTPUT_FILE_BYTES


def test_the_network_is_refused() -> None:
    outcome = _call("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert outcome.error and "refused in the sandbox: socket" in outcome.text


def test_kernel_guards_in_force_are_reported() -> None:
    result = run_sandboxed("import os; print(os.getuid())", TIMEOUT)
    print(
        f"network namespace: {result.network_namespace}; private /tmp: {result.private_tmp}; "
        f"dropped to: {result.dropped_to}"
    )
    if result.dropped_to is not None:  # as root, the snippet runs as another, unprivileged uid
        assert result.output.strip() not in ("", "0")
    if os.geteuid() != 0:
        assert result.dropped_to is None and result.output.strip() == str(os.geteuid())


def test_a_syntax_error_is_a_clear_error() -> None:
    outcome = _call("print(")
    assert outcome.error and "SyntaxError" in outcome.text
