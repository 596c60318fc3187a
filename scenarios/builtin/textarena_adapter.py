"""Rules of ``textarena``: a TextArena game hosted as this project's parallel environment.

``params.env_id`` names the game (``TicTacToe-v0``; :data:`~marl.scenarios.textarena_games.
SUPPORTED` lists the tested ones). The game is made with ``textarena.make`` and its default
wrappers, so its observations and its handling of a move are TextArena's own:

- **Turns.** Each round is one move of the player TextArena says is to move; that agent has
  ``needs_action`` and every other agent is idle (nothing is generated for it). After an
  invalid move TextArena lets the same player try again (one retry by default) or ends the game
  against it; the adapter follows, and counts the invalid move (``malformed``) with TextArena's
  reason shown to the agent.
- **Observations.** The agent's private information is the text TextArena's observation wrapper
  gives that player (its prompt and the game's messages so far). With ``strip_examples`` (the
  default) lines of it that show an example move lose the example (``For example, '[4]' ...``,
  ``e.g. '[0 3]'``) and ``<placeholder>`` brackets are dropped: small models copy examples
  instead of playing (docs/communication.md). The move format itself stays.
- **Actions.** The whole reply is the move (``free_text_action``), as TextArena expects; an
  ``ACTION:`` line, when there is one, is the move instead. TextArena shows the move to the
  opponent as ``[Player N] <move>``, so a move is made one line of plain text first
  (:func:`one_line_move`): line breaks and control characters become spaces, and a tag the game
  writes (``[GAME]``, ``[Player 1]``) becomes ``(GAME)``, so no move can pass for a line of the
  game's.
- **Transcripts.** After each move the game's own lines (the board, the cards dealt, the result
  of a hand) and, at the end, why the game ended are the mover's turn's notes
  (:attr:`~marl.scenarios.rules.RoundResult.notes`), labelled with who was shown them.
- **Rewards.** TextArena's final rewards are the payoffs (+1 win, -1 loss, 0 draw in every
  supported game); the YAML's cooperation 0 makes the returns +2/-2 or 0/0, summing to zero. A
  game still running at the round bound ends as a draw.
- **Determinism.** TextArena draws from Python's global ``random`` (seeded at reset). The
  adapter gives the game a generator state of its own, seeded from the episode seed, swaps it
  in around every call into TextArena and keeps it in the rules object, so seeds replay and
  snapshots restore exactly without touching anybody else's global state.

``textarena`` is an optional extra: this module imports it only inside methods. The scenario
``textarena-v0`` is registered only when it is installed; otherwise asking for it names the
extra to install (:func:`marl.scenarios.registry.register_unavailable`).

Version history:
- v0: first version (2026-11-25). 2026-12: a move is one line of plain text (what TextArena
  shows the opponent), and the game's lines after a move are transcript notes.
"""

from __future__ import annotations

import contextlib
import copy
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marl.protocols.markup import IDLE_REPLY
from marl.scenarios.bots import register_bot
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules
from marl.scenarios.textarena_games import (
    SUPPORTED,
    probe_offline,
    quiet,
    textarena_missing,
)

SCENARIO_FILE = Path(__file__).parent / "optional" / "textarena.yaml"
UNLISTED_ROUNDS = 100  # the round bound of a game not in SUPPORTED, unless params.rounds says
MAX_MOVE_CHARS = 4000  # a move longer than this is cut before TextArena sees it

_EXAMPLE = re.compile(r"\be\.g\.|\bfor example\b|\bfor instance\b|\bsuch as\b", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"<([^<>\n]{1,40})>")
_ADMIN_REASON = re.compile(r"attempted an invalid move\. Reason: (.*?)(?: Please resubmit|$)", re.S)
# line and paragraph breaks, other control characters, and the invisible format characters
# (zero-width, bidirectional overrides) that could make text read as a line of its own
_BREAKS = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]+")
_GAME_TAG = re.compile(r"\[\s*(game|player\s*\d+)\s*\]", re.IGNORECASE)
GAME_ID = -1  # TextArena's sender id of the game's own messages (textarena.GAME_ID)


def one_line_move(move: str, roles: Sequence[str] = ()) -> str:
    """``move`` as one line of plain text that cannot pass for a line of the game's.

    Runs of whitespace, control and invisible format characters become one space, and a tag the
    game writes before its own lines (``[GAME]``, ``[Player 1]``, and any name in ``roles``, in
    any case and spacing) gets round brackets instead: ``(GAME)``. Moves themselves
    (``[4]``, ``[col 3]``, ``[Offer: ...]``) are left as they are."""
    text = _BREAKS.sub(" ", move).strip()
    text = _GAME_TAG.sub(lambda m: f"({m.group(1).strip()})", text)
    for role in roles:
        if role and role.strip():
            tag = re.compile(r"\[\s*" + re.escape(role.strip()) + r"\s*\]", re.IGNORECASE)
            text = tag.sub(f"({role.strip()})", text)
    return text


def strip_examples(text: str) -> str:
    """``text`` without example moves and ``<placeholder>`` brackets.

    A line is cut where an example starts (``e.g.``, ``for example``, ``for instance``, ``such
    as``); a line left with no words is dropped. ``<your move>`` becomes ``your move``.
    """
    lines = []
    for line in text.split("\n"):
        match = _EXAMPLE.search(line)
        if match:
            line = line[: match.start()].rstrip(" \t,;:(-")
            if not re.search(r"[A-Za-z]{2}", line):
                continue
            if line[-1] not in ".!?":
                line += "."
        lines.append(_PLACEHOLDER.sub(r"\1", line))
    return "\n".join(lines)


def agent_player_ids(agents: Sequence[str]) -> dict[str, int]:
    """TextArena's player id of each agent: its position in the YAML's ``agents``."""
    return {a: i for i, a in enumerate(agents)}


@register_rules("textarena")
class TextArenaRules(Rules):
    """A TextArena game; one move per round, by the player TextArena says is to move."""

    info = ScenarioInfo(
        min_agents=1,
        max_agents=16,
        default_topology="empty",
        default_rounds=UNLISTED_ROUNDS,
        free_text_action=True,
        zero_sum=True,  # every SUPPORTED game; an unlisted game may not be (its own rewards)
    )

    @dataclass(frozen=True)
    class Params:
        """env_id: the TextArena game, by its registry id (SUPPORTED lists the tested ones).
        allow_unlisted: try a game not in SUPPORTED; it is probed offline first and refused,
            with the reason, when it needs the network or NLTK data.
        rounds: the bound on moves; 0 = the supported game's own bound (unlisted: 100).
        strip_examples: drop example moves and <placeholder> brackets from TextArena's text."""

        env_id: str = "TicTacToe-v0"
        allow_unlisted: bool = False
        rounds: int = 0
        strip_examples: bool = True

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """TextArena installed; a known, offline game; as many agents as it has players."""
        p = cls.Params(**params)
        missing = textarena_missing()
        if missing:
            return [Problem("env_id", missing)]
        problems = []
        if (
            isinstance(p.rounds, bool)
            or not isinstance(p.rounds, int)
            or not 0 <= p.rounds <= 10_000
        ):
            problems.append(
                Problem("rounds", f"must be a whole number from 0 to 10000, got {short(p.rounds)}")
            )
        for key in ("allow_unlisted", "strip_examples"):
            if not isinstance(getattr(p, key), bool):
                problems.append(Problem(key, "must be true or false"))
        if not isinstance(p.env_id, str) or not p.env_id:
            return [
                *problems,
                Problem("env_id", f"must be a TextArena game id, got {short(p.env_id)}"),
            ]
        game = SUPPORTED.get(p.env_id)
        if game is not None:
            if len(agents) != game.players:
                problems.append(
                    Problem(
                        "env_id",
                        f"TextArena game {p.env_id!r} is played by {game.players} players, "
                        f"but the scenario has {len(agents)} agents",
                    )
                )
            return problems
        from textarena.envs.registration import ENV_REGISTRY

        supported = ", ".join(SUPPORTED)
        if p.env_id not in ENV_REGISTRY:
            problems.append(
                Problem(
                    "env_id",
                    f"TextArena has no game {p.env_id!r}; the adapter supports: {supported}",
                )
            )
        elif not p.allow_unlisted:
            problems.append(
                Problem(
                    "env_id",
                    f"TextArena game {p.env_id!r} is not in the adapter's tested list "
                    f"({supported}); set params.allow_unlisted: true to try it",
                )
            )
        else:
            reason = probe_offline(p.env_id, len(agents))
            if reason:
                problems.append(Problem("env_id", reason))
        return problems

    @classmethod
    def episode_rounds(cls, params: dict[str, Any]) -> int | None:
        """``params.rounds``, else the supported game's bound, else 100."""
        p = cls.Params(**params)
        if p.rounds:
            return p.rounds
        game = SUPPORTED.get(p.env_id)
        return game.rounds if game else UNLISTED_ROUNDS

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.player_of = agent_player_ids(self.agents)
        self.env: Any = None
        self.current: int | None = None
        self.texts: dict[str, str] = {}
        self.over = False
        self.ending = ""
        self._random_state: tuple = random.Random(0).getstate()

    def __deepcopy__(self, memo: dict[int, Any]) -> TextArenaRules:
        """A deep copy that shares what never changes in place: the generator state (an
        immutable tuple of 625 numbers, which ``deepcopy`` would walk one by one: half the cost
        of a step) and the frozen params."""
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        shared = {"_random_state", "params"}
        for key, value in self.__dict__.items():
            setattr(clone, key, value if key in shared else copy.deepcopy(value, memo))
        return clone

    # --- TextArena's global random, kept per episode -----------------------------------------
    @contextlib.contextmanager
    def _game_random(self) -> Iterator[None]:
        """Run TextArena code with this episode's generator state as the global ``random``."""
        outer = random.getstate()
        random.setstate(self._random_state)
        try:
            with quiet():
                yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)

    # --- the game ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Make the game and reset it with a seed drawn from the episode's generator."""
        import textarena as ta

        seed = self.rng.randrange(2**31)
        self._random_state = random.Random(seed).getstate()
        with self._game_random():
            self.env = ta.make(self.params.env_id)
            self.env.reset(num_players=len(self.agents), seed=seed)
        self.texts = dict.fromkeys(self.agents, "")
        self.over = False
        self.ending = ""
        self._observe()

    def _observe(self) -> None:
        """Fetch the observation of the player to move (TextArena hands out only that one)."""
        with self._game_random():
            player, observation = self.env.get_observation()
        self.current = int(player)
        text = observation if isinstance(observation, str) else _render(observation)
        agent = self.agents[self.current]
        self.texts[agent] = strip_examples(text) if self.params.strip_examples else text

    def to_move(self) -> str | None:
        """The agent TextArena says is to move, or ``None`` once the game is over."""
        if self.over or self.current is None:
            return None
        return self.agents[self.current]

    def needs_action(self, agent: str, round: int) -> bool:
        """Only the player to move acts."""
        return agent == self.to_move()

    def can_talk(self, agent: str, round: int) -> bool:
        """No side channel: a TextArena game's only channel is the game."""
        return False

    def private_info(self, agent: str) -> str:
        """What TextArena has shown this player so far."""
        text = self.texts.get(agent, "").strip()
        return "\n" + text if text else "The game has begun; wait for your turn."

    def public_state(self) -> str:
        """The game's id, and at the end how it ended."""
        text = f"TextArena game {self.params.env_id}."
        return f"{text} {self.ending}" if self.ending else text

    def action_help(self, agent: str) -> str:
        """The move goes in the form the game's messages ask for."""
        return "your move, written the way the game's messages above ask for."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """For bots: the game, the player id, and (when to move) the legal moves."""
        info: dict[str, Any] = {"env_id": self.params.env_id, "player_id": self.player_of[agent]}
        if agent == self.to_move():
            view = _bot_view(self.params.env_id, self.env, self.player_of[agent])
            info.update(view)
        else:
            info["valid_actions"] = []
        return info

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Hand the mover's reply to TextArena; at the end, TextArena's rewards are the payoffs."""
        result = RoundResult()
        mover = self.to_move()
        if mover is None:  # cannot happen: the environment stops when the game is over
            result.done = True
            return result
        player = self.player_of[mover]
        move = actions.get(mover)
        state = self.env.state
        roles = [str(r) for r in (getattr(state, "role_mapping", None) or {}).values()]
        move = one_line_move(move[:MAX_MOVE_CHARS], roles) if isinstance(move, str) else ""
        turn_before = getattr(state, "turn", None)
        seen = _pending(state)
        try:
            with self._game_random():
                done, _ = self.env.step(action=move)
        except Exception as exc:  # noqa: BLE001 - a reply must never crash the environment
            # TextArena's own parsers never raised in fuzzing (tests/scenarios/test_textarena.py);
            # should one raise, the move is the mover's invalid move and loses it the game
            line = (str(exc).splitlines() or [""])[0][:120]
            result.invalid[mover] = (
                f"TextArena could not play the move ({type(exc).__name__}: {line})"
            )
            self._forfeit(result, mover)
            result.notes[mover] = [self.ending]
            return result
        notes = self._game_lines(state, seen)
        reason = _invalid_reason(state, player)
        game_info = getattr(state, "game_info", {}) or {}
        flagged = bool(game_info.get(player, {}).get("invalid_move"))
        if (not done and turn_before is not None and state.turn == turn_before) or flagged:
            result.invalid[mover] = f"TextArena refused the move: {reason or 'invalid move'}"
        if done:
            self._finish(result, "")
        elif last_round:
            self._finish(result, "The round limit was reached before the game ended: a draw.")
        else:
            self._observe()
        result.notes[mover] = [*notes, self.ending] if self.over else notes
        return result

    def _game_lines(self, state: Any, seen: tuple[int, dict[int, int]]) -> list[str]:
        """The game's own messages since ``seen`` (:func:`_pending`), in the game's order, each
        ``[GAME] <message>`` when every player was shown it, else ``[GAME -> <agents>] ...``.
        The players' moves, which TextArena echoes too, are left out (the transcript has them).
        """
        logged, pending = seen
        logs = list(getattr(state, "logs", None) or [])[logged:]
        new = {
            pid: [item[1] for item in items[pending.get(pid, 0) :] if item[0] == GAME_ID]
            for pid, items in (getattr(state, "observations", None) or {}).items()
        }
        lines = []
        for sender, message in logs:
            if sender != GAME_ID:
                continue
            shown = [pid for pid, messages in new.items() if message in messages]
            for pid in shown:
                new[pid].remove(message)
            if not shown or len(shown) == len(self.agents):
                label = "GAME"
            else:
                names = ", ".join(self.agents[p] for p in shown if 0 <= p < len(self.agents))
                label = f"GAME -> {names}"
            lines.append(f"[{label}] {str(message).strip()}")
        return lines

    def _forfeit(self, result: RoundResult, loser: str) -> None:
        """End the game against ``loser``: -1 for it, the +1 shared by the others."""
        self.over = True
        result.done = True
        others = [a for a in self.agents if a != loser]
        result.individual = {a: 1.0 / len(others) for a in others}
        result.individual[loser] = -1.0 if others else 0.0
        self.ending = f"Game over. {loser} forfeits: TextArena could not play its move."
        result.public_events.append(self.ending)

    def _finish(self, result: RoundResult, cut_short: str) -> None:
        """End the episode: TextArena's rewards, or a draw when the round bound cut it short."""
        self.over = True
        result.done = True
        if cut_short:
            result.individual = dict.fromkeys(self.agents, 0.0)
            self.ending = cut_short
        else:
            with self._game_random():
                closed = self.env.close()
            rewards, game_info = closed if isinstance(closed, tuple) else (closed, {})
            rewards = rewards or {}
            result.individual = {a: float(rewards.get(i, 0.0)) for a, i in self.player_of.items()}
            reasons = {
                str(v.get("reason")) for v in (game_info or {}).values() if isinstance(v, dict)
            }
            reasons.discard("None")
            self.ending = "Game over. " + " ".join(sorted(reasons)) if reasons else "Game over."
        result.public_events.append(self.ending)


def _render(observation: Any) -> str:
    """A raw TextArena observation (a list of (sender, message, type)) as text."""
    lines = []
    for item in observation or []:
        sender, message = item[0], item[1]
        name = "GAME" if sender == -1 else f"Player {sender}"
        lines.append(f"[{name}] {message}")
    return "\n".join(lines)


def _pending(state: Any) -> tuple[int, dict[int, int]]:
    """How far TextArena's log and each player's pending messages have got (what
    :meth:`TextArenaRules._game_lines` reads on from)."""
    logs = getattr(state, "logs", None) or []
    observations = getattr(state, "observations", None) or {}
    return len(logs), {pid: len(items) for pid, items in observations.items()}


def _invalid_reason(state: Any, player: int) -> str | None:
    """TextArena's reason for the player's last invalid move, read from its pending messages."""
    pending = getattr(state, "observations", {}).get(player, [])
    for item in reversed(pending):
        match = _ADMIN_REASON.search(str(item[1]))
        if match:
            return match.group(1).strip()[:200]
    return None


# --- what scripted bots see: legal moves and the facts a rule needs, per game ----------------


def _bot_view(env_id: str, env: Any, player: int) -> dict[str, Any]:
    """Legal moves (and, where the rule bot needs it, the player's own view) of the mover.

    Only what the player itself may know: never the opponent's cards or values."""
    state = env.state
    game = state.game_state
    base = env_id.split("-v")[0]
    if base == "TicTacToe":
        board = game["board"]
        free = [r * 3 + c for r in range(3) for c in range(3) if board[r][c] == ""]
        mark = "X" if player == 1 else "O"
        return {
            "valid_actions": [f"[{i}]" for i in free],
            "board": [list(row) for row in board],
            "mark": mark,
        }
    if base == "ConnectFour":
        board = game["board"]
        free = [c for c in range(len(board[0])) if board[0][c] == "."]
        return {
            "valid_actions": [f"[col {c}]" for c in free],
            "board": [list(row) for row in board],
            "mark": "X" if player == 0 else "O",
        }
    if base == "Nim":
        piles = list(game["piles"])
        moves = [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]
        return {"valid_actions": moves, "piles": piles}
    if base == "KuhnPoker":
        tree = game.get("current_legal_action_tree")
        legal = list(tree.keys()) if isinstance(tree, dict) else []
        history = _kuhn_history(legal, game, player)
        card = ["J", "Q", "K"][game["player_cards"][player]]
        return {
            "valid_actions": [f"[{m}]" for m in legal],
            "card": card,
            "history": history,
            "first": player == game.get("starting_player"),
        }
    if base == "SimpleNegotiation":
        actions = ["[Deny]"]
        if game.get("current_offer"):
            actions.append("[Accept]")
        return {"valid_actions": actions, "offer_pending": bool(game.get("current_offer"))}
    return {"valid_actions": []}


def _kuhn_history(legal: list[str], game: dict[str, Any], player: int) -> list[str]:
    """The betting of the current hand, as seen from the legal moves: nothing (check/bet open
    to the starter), a check (check/bet open to the other), or a bet (call/fold)."""
    starter = game.get("starting_player")
    if "call" in legal:
        return ["bet"] if player != starter else ["check", "bet"]
    return [] if player == starter else ["check"]


def _lines(board: list[list[str]]) -> list[list[tuple[int, int]]]:
    cells = [[(r, c) for c in range(3)] for r in range(3)]
    cells += [[(r, c) for r in range(3)] for c in range(3)]
    cells += [[(i, i) for i in range(3)], [(i, 2 - i) for i in range(3)]]
    return cells


def _tictactoe_move(info: dict[str, Any], rng: random.Random) -> str:
    board, mark = info["board"], info["mark"]
    other = "O" if mark == "X" else "X"
    free = [int(m.strip("[]")) for m in info["valid_actions"]]
    for who in (mark, other):  # win, else block
        for line in _lines(board):
            marks = [board[r][c] for r, c in line]
            if marks.count(who) == 2 and marks.count("") == 1:
                r, c = line[marks.index("")]
                return f"[{r * 3 + c}]"
    for cell in (4, 0, 2, 6, 8):
        if cell in free:
            return f"[{cell}]"
    return f"[{rng.choice(free)}]"


def _connect_four_move(info: dict[str, Any], rng: random.Random) -> str:
    board, mark = info["board"], info["mark"]
    other = "O" if mark == "X" else "X"
    free = [int(m.strip("[]").split()[-1]) for m in info["valid_actions"]]
    rows, cols = len(board), len(board[0])

    def wins(col: int, who: str) -> bool:
        row = max(r for r in range(rows) if board[r][col] == ".")
        board[row][col] = who
        try:
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                count = 1
                for sign in (1, -1):
                    r, c = row + sign * dr, col + sign * dc
                    while 0 <= r < rows and 0 <= c < cols and board[r][c] == who:
                        count += 1
                        r, c = r + sign * dr, c + sign * dc
                if count >= 4:
                    return True
            return False
        finally:
            board[row][col] = "."

    for who in (mark, other):  # win, else block
        for col in free:
            if wins(col, who):
                return f"[col {col}]"
    centre = sorted(free, key=lambda c: (abs(c - (cols - 1) / 2), rng.random()))
    return f"[col {centre[0]}]"


def _nim_move(info: dict[str, Any], rng: random.Random) -> str:
    piles = info["piles"]
    total = 0
    for n in piles:
        total ^= n
    if total:  # move to a position with nim-sum 0 (the winning strategy)
        for i, n in enumerate(piles):
            if n ^ total < n:
                return f"[{i} {n - (n ^ total)}]"
    return rng.choice(info["valid_actions"])


@register_bot("textarena", "rule")
def textarena_rule_bot(
    agent: str, observation: str, info: dict[str, Any], rng: random.Random
) -> str:
    """A sensible strategy per supported game: tic-tac-toe and Connect Four win, else block,
    else take the centre; Nim moves to a
    zero nim-sum; Kuhn Poker bets and calls (TextArena's bets add nothing to the pot);
    Simple Negotiation denies every offer (so it never trades value away). Any other game: a
    random legal move when the adapter knows them, else the idle reply."""
    valid = info.get("valid_actions") or []
    if not valid:
        return IDLE_REPLY
    base = str(info.get("env_id", "")).split("-v")[0]
    if base == "TicTacToe":
        return _tictactoe_move(info, rng)
    if base == "ConnectFour":
        return _connect_four_move(info, rng)
    if base == "Nim":
        return _nim_move(info, rng)
    if base == "KuhnPoker":
        # TextArena 0.7.4's Kuhn Poker never adds a bet or a call to the pot (only the antes
        # are at stake), so folding only loses and a bet costs nothing: bet, and call any bet.
        # (The equilibrium of real Kuhn Poker loses chips there: it folds pots it would win.)
        return "[call]" if "[call]" in valid else "[bet]"
    if base == "SimpleNegotiation":
        return "[Deny]"
    return rng.choice(valid)


def _register_scenario() -> None:
    """Register ``textarena-v0`` when TextArena is installed; otherwise record why it is not,
    so asking for it names the extra to install instead of "unknown scenario"."""
    from marl.scenarios.registry import register_scenario, register_unavailable

    missing = textarena_missing()
    if missing:
        register_unavailable("textarena-v0", missing)
    else:
        register_scenario(SCENARIO_FILE)


_register_scenario()
