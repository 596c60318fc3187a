"""Joining a running Ray cluster (``ray.address``), with one-line refusals a user can act on.

Ray 2.60's ``ray start --head`` turns token authentication on whenever the head has a token
(``~/.ray/auth_token``, which any earlier local ``ray.init()`` writes). A driver that joins
such a cluster by an explicit address (``ray.address=10.0.0.5:6379``) sends a token only when
``RAY_AUTH_MODE=token`` is set, and reads it from ``RAY_AUTH_TOKEN``, or from the file that
``RAY_AUTH_TOKEN_PATH`` names (default ``~/.ray/auth_token``). Without it, ``ray.init`` retries
for about 20 seconds (``InvalidAuthToken`` once a second) and ends in a long traceback.

:func:`probe` asks the cluster once before ``ray.init``, so that case fails in a second with
:data:`AUTH_HINT`; :func:`join_failure` turns whatever ``ray.init`` raises while joining into one
line (it says the same when the probe could not tell). ``ray.address=auto`` is left to Ray: on
the head node Ray finds the address and the token file by itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Iterator

AUTH_HINT = (
    "the cluster asks for a token (Ray's token authentication, which `ray start --head` "
    "turns on by default in Ray 2.60): run with RAY_AUTH_MODE=token and the cluster's token in "
    "RAY_AUTH_TOKEN, or in the file RAY_AUTH_TOKEN_PATH names (default ~/.ray/auth_token; "
    "`ray get-auth-token` on the head node prints it); see docs/scaling.md"
)
_AUTH_MARKS = ("InvalidAuthToken", "uthentication token", "Unauthenticated")


def host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of an explicit GCS address (``10.0.0.5:6379``, ``[::1]:6379``); ``None``
    for what Ray resolves itself (``auto``, ``ray://...``, ``local``)."""
    if "://" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_auth_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is Ray refusing this process's token."""
    for item in _chain(exc):
        if type(item).__name__ == "AuthenticationError":
            return True
        if any(mark in str(item) for mark in _AUTH_MARKS):
            return True
    return False


def join_failure(address: str, exc: BaseException) -> str:
    """One line for a failure to join the cluster at ``address``: what to set, when it is the
    token; otherwise the first line of Ray's own reason."""
    if is_auth_failure(exc):
        return f"ray.address={address}: {AUTH_HINT}"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return (
        f"ray.address={address}: could not join the Ray cluster there "
        f"({type(exc).__name__}: {first[:200]}); is `ray start --head` running, and is the "
        f"address the one it printed?"
    )


@contextlib.contextmanager
def _stderr_to_nowhere() -> Iterator[None]:
    """Silence file descriptor 2 (Ray's C++ client logs there) for the block."""
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def probe(address: str, timeout_s: float = 5.0) -> str | None:
    """Why this process cannot join the cluster at ``address``, asked once and quickly; ``None``
    when it can, or when the probe cannot tell (``ray.init`` then decides).

    Nothing listening at the address, or a cluster that refuses this process's token, is said
    in one line instead of after ``ray.init``'s 20 retries."""
    target = host_port(address)
    if target is None:
        return None
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return (
            f"ray.address={address}: nothing answers there ({reason}); start the head node "
            f"with `ray start --head` and use the address it prints"
        )
    try:
        from ray._raylet import GcsClient  # Ray's own client: one request, about a second
    except ImportError:
        return None
    try:
        with _stderr_to_nowhere():
            GcsClient(address=f"{target[0]}:{target[1]}")
    except Exception as exc:  # noqa: BLE001 - only a token refusal is decided here
        if is_auth_failure(exc):
            return join_failure(address, exc)
    return None
