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

Before Ray reads anything, :func:`token_source_problem` checks where the token would come from:
a ``RAY_AUTH_TOKEN_PATH`` that names a FIFO would hang Ray's reader, ``/dev/zero`` would be read
until memory runs out, and a missing file ends in Ray's traceback. And before Ray's client
connects, :func:`speaks_grpc` asks the address for an HTTP/2 handshake (every Ray GCS speaks
gRPC), so an address where something else listens (a web server, SSH) is told in a second, not
after 40 s of Ray's C++ retries and warnings.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import tempfile
from collections.abc import Iterator, Mapping

AUTH_HINT = (
    "the cluster asks for a token (Ray's token authentication, which `ray start --head` "
    "turns on by default in Ray 2.60): run with RAY_AUTH_MODE=token and the cluster's token in "
    "RAY_AUTH_TOKEN, or in the file RAY_AUTH_TOKEN_PATH names (default ~/.ray/auth_token; "
    "`ray get-auth-token` on the head node prints it); see docs/scaling.md"
)
_AUTH_MARKS = ("InvalidAuthToken", "uthentication token", "Unauthenticated")
MAX_TOKEN_BYTES = 4096  # Ray's tokens are 64 hex characters; a file far larger is not one
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_SETTINGS = 0x04


def token_source_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why the token Ray would read under ``RAY_AUTH_MODE=token`` cannot be one, in one line;
    ``None`` when there is nothing to check or it looks like a token.

    ``RAY_AUTH_TOKEN`` must be at most :data:`MAX_TOKEN_BYTES`; the file ``RAY_AUTH_TOKEN_PATH``
    names must exist and be a regular, non-empty file of at most that size (a FIFO would block
    Ray's reader forever, a device such as ``/dev/zero`` would be read without end). Without
    ``RAY_AUTH_TOKEN_PATH`` the default ``~/.ray/auth_token`` is Ray's to find or create."""
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_MODE", "").strip().lower() != "token":
        return None
    token = env.get("RAY_AUTH_TOKEN")
    if token:
        if len(token.encode()) > MAX_TOKEN_BYTES:
            return (
                f"RAY_AUTH_TOKEN: {len(token.encode())} bytes, over the {MAX_TOKEN_BYTES} "
                "a token can be; set it to the cluster's token (`ray get-auth-token` on the head)"
            )
        return None
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if not path:
        return None
    try:
        info = os.stat(path)
    except OSError as exc:
        return (
            f"RAY_AUTH_TOKEN_PATH={path}: cannot be read ({exc.strerror}); name the file that "
            "holds the cluster's token, or set RAY_AUTH_TOKEN"
        )
    if not stat.S_ISREG(info.st_mode):
        return (
            f"RAY_AUTH_TOKEN_PATH={path}: not a regular file (a FIFO, device or folder would "
            "block or never end when read); name the file that holds the cluster's token"
        )
    if info.st_size == 0 or info.st_size > MAX_TOKEN_BYTES:
        return (
            f"RAY_AUTH_TOKEN_PATH={path}: {info.st_size} bytes, not a token (1 to "
            f"{MAX_TOKEN_BYTES} bytes); `ray get-auth-token` on the head node prints it"
        )
    return None


def speaks_grpc(host: str, port: int, timeout_s: float = 3.0) -> bool | None:
    """Whether what listens at ``host:port`` answers an HTTP/2 handshake, as the gRPC server of
    a Ray GCS does: it sends a SETTINGS frame first (RFC 9113, section 3.4). ``False`` for a
    server that answers otherwise or closes; ``None`` when it stays silent for ``timeout_s``
    (then Ray decides)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(_HTTP2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    return False
                head += chunk
    except TimeoutError:
        return None
    except OSError:
        return False
    return head[3] == _HTTP2_SETTINGS


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
        said = next((str(e) for e in _chain(exc) if type(e).__name__ == "AuthenticationError"), "")
        said = said.strip().splitlines()[0].split(". Ensure")[0][:200] if said.strip() else ""
        return f"ray.address={address}: {AUTH_HINT}" + (f" (Ray: {said})" if said else "")
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
    if speaks_grpc(*target, timeout_s=timeout_s) is False:
        return (
            f"ray.address={address}: something answers there, but not a Ray cluster (no gRPC "
            f"handshake); use the address `ray start --head` prints (port 6379 by default)"
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
