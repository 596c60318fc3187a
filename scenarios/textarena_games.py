"""Which TextArena games the adapter hosts, and how it tells a game that cannot run offline.

:data:`SUPPORTED` lists the games the adapter is tested on: PettingZoo's ``parallel_api_test``
and ``parallel_seed_test``, the snapshot replay and a play-through run on each of them
(``tests/scenarios/test_textarena.py``), offline. A game not in the list may still be tried
(``params.allow_unlisted: true``): :func:`probe_offline` first builds and resets it with the
network and NLTK downloads cut off, and refuses it with a message naming the game when it needs
either (some TextArena games download NLTK word lists or call a hosted model).

Nothing here imports ``textarena`` at module level: it is an optional extra
(``pip install 'marl-llm[textarena]'``), and :func:`textarena_missing` says so when it is absent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

INSTALL_HINT = "pip install 'marl-llm[textarena]'"


@dataclass(frozen=True)
class TextArenaGame:
    """A TextArena game the adapter supports.

    env_id:  TextArena's registry id.
    players: how many players it is played with (the scenario's agents).
    rounds:  the adapter's bound on steps (one move, valid or not, per round): above the
             longest game TextArena allows, invalid retries included; a game still running
             at the bound ends as a draw.
    note:    what kind of game it is (docs and ``marl list``).
    """

    env_id: str
    players: int
    rounds: int
    note: str


SUPPORTED: dict[str, TextArenaGame] = {
    g.env_id: g
    for g in (
        TextArenaGame("TicTacToe-v0", 2, 20, "three in a row on a 3x3 board"),
        TextArenaGame("ConnectFour-v0", 2, 90, "four in a row on a 6x7 board"),
        TextArenaGame("KuhnPoker-v0", 2, 40, "Kuhn Poker over three hands (chips decide)"),
        TextArenaGame("Nim-v0", 2, 40, "take from piles 3, 4, 5; taking the last object wins"),
        TextArenaGame(
            "SimpleNegotiation-v0", 2, 24, "trade resources; the larger gain in value wins"
        ),
    )
}


def textarena_missing() -> str | None:
    """Why the adapter cannot run here (the extra is not installed), or ``None``."""
    try:
        spec = importlib.util.find_spec("textarena")
    except (ImportError, ValueError):  # a blocked or half-imported module
        spec = None
    if spec is None:
        return f"TextArena is not installed; it is an optional extra: {INSTALL_HINT}"
    return None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Swallow what a TextArena game prints (some print on reset or at the end)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class OfflineViolation(RuntimeError):
    """A game tried to reach the network or to download NLTK data during the offline probe."""


@contextlib.contextmanager
def offline_guard() -> Iterator[None]:
    """Within the block, opening a network connection or calling ``nltk.download`` raises
    :class:`OfflineViolation` (everything is put back afterwards)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OfflineViolation("it tried to reach the network")

    def refuse_nltk(*args: Any, **kwargs: Any) -> Any:
        raise OfflineViolation(f"it tried to download NLTK data {args[:1]!r}")

    patches: list[tuple[Any, str, Any]] = [
        (socket.socket, "connect", refuse),
        (socket.socket, "connect_ex", refuse),
        (socket, "create_connection", refuse),
        (socket, "getaddrinfo", refuse),
    ]
    if importlib.util.find_spec("nltk") is not None:
        import nltk

        patches.append((nltk, "download", refuse_nltk))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, new in patches:
            setattr(obj, name, new)
        yield
    finally:
        for obj, name, old in saved:
            setattr(obj, name, old)


_PROBED: dict[tuple[str, int], str | None] = {}


def probe_offline(env_id: str, players: int) -> str | None:
    """Build and reset the TextArena game ``env_id`` offline; the reason it cannot run here,
    or ``None`` when it can. Cached per process. The global ``random`` state is put back."""
    key = (env_id, players)
    if key in _PROBED:
        return _PROBED[key]
    missing = textarena_missing()
    if missing:
        return missing
    import textarena as ta

    reason: str | None = None
    outer = random.getstate()
    try:
        with offline_guard(), quiet():
            env = ta.make(env_id)
            env.reset(num_players=players, seed=0)
            env.get_observation()
    except OfflineViolation as exc:
        reason = f"TextArena game {env_id!r} cannot run offline: {exc}"
    except LookupError as exc:  # nltk raises LookupError for data that is not installed
        first = str(exc).strip().splitlines()
        detail = next((line.strip() for line in first if "Resource" in line), "missing data")
        reason = f"TextArena game {env_id!r} cannot run offline: it needs NLTK data ({detail})"
    except ImportError as exc:
        reason = f"TextArena game {env_id!r} needs a package that is not installed: {exc}"
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party game is reported
        line = (str(exc).splitlines() or [""])[0][:200]
        if "api key" in line.lower() or "api_key" in line.lower():
            reason = (
                f"TextArena game {env_id!r} cannot run offline: it calls a hosted model ({line})"
            )
        else:
            reason = (
                f"TextArena game {env_id!r} did not start with {players} players: "
                f"{type(exc).__name__}: {line}"
            )
    finally:
        random.setstate(outer)
    _PROBED[key] = reason
    return reason
