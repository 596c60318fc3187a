"""The markup an agent writes to talk and act, and its parser.

An agent's completion is free text. Two kinds of line carry meaning::

    SAY: the target is the red circle          -> to every out-neighbour
    SAY @bob @carol: meet at the bridge        -> only to bob and carol
    ACTION: 3                                  -> the environment action

Keywords are case-insensitive and may be decorated the way chat models like to (``**SAY:**``,
``- ACTION:``). Everything else is the agent's private reasoning and is ignored. When there are
several ACTION lines the last one counts. The parser never raises: whatever an LLM writes, the
result is a :class:`ParsedCompletion`, and problems are listed in ``errors``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

MAX_COMPLETION_CHARS = 20_000  # longer completions are cut before parsing (hostile input)
IDLE_REPLY = "ACTION: wait"
"""What an idle agent (one that can neither talk nor act this round) replies. It is never
prompted: the rollout and the counterfactual re-simulation both write this for it."""

_DECOR = r"[\s\-\*\#>`_]*"
_SAY_HEAD = re.compile(rf"{_DECOR}SAY", re.IGNORECASE)
_LEAD = re.compile(_DECOR)
_ADDRESS_FILLER = frozenset(",-*#>`_")  # besides whitespace, what may sit between SAY and ':'
_ACTION = re.compile(rf"^{_DECOR}ACTION{_DECOR}:{_DECOR}(?P<text>.*)$", re.IGNORECASE)
_NAME = re.compile(r"@([^\s:@,]+)")


class _BadAddress(ValueError):
    """A SAY line whose address tries to name someone (an ``@`` in it) but is not ``@name``
    tokens: ``@@dave``, a full-width ``＠ｄａｖｅ``, ``@dave!``."""


def short_text(text: str, limit: int = 40) -> str:
    """``text`` quoted, cut to ``limit`` characters (an agent's text can be anything)."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


@dataclass(frozen=True)
class OutgoingMessage:
    """A message as the agent wrote it; ``to`` is None for "all my out-neighbours"."""

    to: tuple[str, ...] | None
    text: str


@dataclass
class ParsedCompletion:
    """What a completion says: the messages to send, the action, and any problems."""

    messages: list[OutgoingMessage] = field(default_factory=list)
    action: str | None = None
    errors: list[str] = field(default_factory=list)
    free_text: str = ""  # the lines that were neither SAY nor ACTION

    @property
    def ok(self) -> bool:
        """True when the completion parsed without problems."""
        return not self.errors


def sanitize(text: str) -> str:
    """Drop control and format characters (keeping newlines and tabs) and strip the ends."""
    if text.isprintable():  # no character of category C at all: nothing to drop (fast path)
        return text.strip()
    kept = []
    for ch in text:
        if ch in "\n\t":
            kept.append(ch)
        elif unicodedata.category(ch)[0] != "C":
            kept.append(ch)
    return "".join(kept).strip()


def _clean_value(text: str) -> str:
    return text.strip().strip("*`_").strip()


def _match_say(line: str) -> tuple[tuple[str, ...], str] | None:
    """``(names, text)`` when ``line`` is a SAY line, else None.

    Between ``SAY`` and the first ``:`` there may be only ``@name`` tokens, whitespace, commas
    and decoration. Done by hand rather than with one regex: nested quantifiers over
    overlapping character classes backtrack quadratically (a 20,000-character hostile line
    took 22 s), and this runs on every line of every completion.
    """
    head = _SAY_HEAD.match(line)
    if not head:
        return None
    colon = line.find(":", head.end())
    if colon < 0:
        return None
    address = line[head.end() : colon]
    rest = _NAME.sub("", address)
    if any(not (c.isspace() or c in _ADDRESS_FILLER) for c in rest):
        if "@" in unicodedata.normalize("NFKC", address):  # an address the agent got wrong
            raise _BadAddress(address.strip())
        return None  # prose that starts with "say" ("Saying: ..."), not a message
    names = tuple(dict.fromkeys(_NAME.findall(address)))
    text = line[colon + 1 :]
    return names, text[_LEAD.match(text).end() :]


def parse_completion(completion: object, *, require_action: bool = True) -> ParsedCompletion:
    """Parse an agent's completion. Never raises, whatever ``completion`` is."""
    result = ParsedCompletion()
    if not isinstance(completion, str):
        result.errors.append(f"completion is not text (got {type(completion).__name__})")
        return result
    if len(completion) > MAX_COMPLETION_CHARS:
        result.errors.append(f"completion longer than {MAX_COMPLETION_CHARS} characters was cut")
        completion = completion[:MAX_COMPLETION_CHARS]
    free_lines = []
    for raw_line in completion.splitlines():
        line = sanitize(raw_line)
        if not line:
            continue
        action = _ACTION.match(line)
        if action:
            result.action = sanitize(_clean_value(action.group("text")))
            continue
        try:
            say = _match_say(line)
        except _BadAddress as bad:
            result.errors.append(
                f"the address {short_text(str(bad))} of a SAY line is not @name tokens (a plain @ "
                "and an agent's exact name, as `You can message:` lists them); that message was "
                "not sent"
            )
            continue
        if say:
            names, raw_text = say
            text = sanitize(_clean_value(raw_text))
            if not text:
                result.errors.append("empty SAY line ignored")
                continue
            result.messages.append(OutgoingMessage(to=names or None, text=text))
            continue
        free_lines.append(line)
    result.free_text = "\n".join(free_lines)
    if require_action and not result.action:
        result.errors.append("no ACTION line")
    return result


# How prompts describe a message line: in words, never with a placeholder such as `<message>`,
# which small models copy verbatim (docs/communication.md). The system prompt and the last line
# of every observation both use it.
SAY_FORM = "`SAY:` and then your message"


def markup_instructions(can_message: bool, needs_action: bool = True) -> str:
    """The paragraph of the system prompt that teaches an agent the markup.

    It names nobody: who an agent can message is the observation's ``You can message:`` line.
    So every agent that can talk gets the same system prompt, and the agents of a round share
    its prefill (a system prompt that named each agent's contacts differed from its first
    name on, which cost a 16-agent round 16 prefills of it)."""
    if can_message:
        talk = (
            "Each observation says whom you can message. "
            f"To message all of them, write a line that starts with {SAY_FORM}; "
            "to message only some, start the line with `SAY @name @name:` instead."
        )
    else:
        talk = "Nobody can receive messages from you."
    act = (
        "When the observation asks for an action, also write one line that starts with `ACTION:` "
        "and then your action."
        if needs_action
        else ""
    )
    return (talk + "\n" + act).strip()
