"""Reading a scenario file that nobody vouches for: :func:`read_bounded` reads only regular
files up to a size, :class:`ScenarioLoader` refuses anchors, aliases, duplicate keys, deep
nesting and huge numbers, and :func:`read_yaml` turns whatever goes wrong into one
:class:`~marl.scenarios.problems.ScenarioError` (docs/security.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from marl.scenarios.problems import Problem, ScenarioError, short

# Bounds on what a scenario file may make the loader do (docs/security.md).
MAX_YAML_BYTES = 1_000_000  # a scenario file larger than this is refused unread
MAX_YAML_DEPTH = 50  # nesting of mappings and sequences
MAX_NUMBER_CHARS = 100  # characters of one YAML number (Python refuses ints over 4300 digits)


class _Refused(yaml.YAMLError):
    """A YAML construct a scenario file may not use, at a place in the file."""

    def __init__(self, problem: str, mark: object | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class ScenarioLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with bounds for files nobody vouches for.

    Refused: anchors and aliases (``&x``, ``*x``: the alias bomb and self-containing values),
    duplicate keys, nesting deeper than MAX_YAML_DEPTH, and numbers longer than
    MAX_NUMBER_CHARS characters. Like SafeLoader, it builds plain data only: no tag runs code.
    """

    def __init__(self, stream: object) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: object, index: object) -> yaml.Node:  # noqa: D102
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                "YAML aliases (*name) are not allowed in a scenario file", event.start_mark
            )
        if getattr(event, "anchor", None) is not None:
            raise _Refused(
                "YAML anchors (&name) are not allowed in a scenario file", event.start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(
                    f"YAML nested too deeply (more than {MAX_YAML_DEPTH} levels)",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:  # noqa: D102
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: SafeLoader refuses it with its mark
                    continue
                if duplicate:
                    raise _Refused(f"duplicate key {short(key)}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def _bounded_number(self, node: yaml.Node, construct: Any) -> object:
        text = self.construct_scalar(node)
        if len(text) > MAX_NUMBER_CHARS:
            raise _Refused(
                f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})",
                node.start_mark,
            )
        return construct(self, node)

    def construct_yaml_int(self, node: yaml.Node) -> object:  # noqa: D102
        return self._bounded_number(node, yaml.SafeLoader.construct_yaml_int)

    def construct_yaml_float(self, node: yaml.Node) -> object:  # noqa: D102
        return self._bounded_number(node, yaml.SafeLoader.construct_yaml_float)


ScenarioLoader.add_constructor("tag:yaml.org,2002:int", ScenarioLoader.construct_yaml_int)
ScenarioLoader.add_constructor("tag:yaml.org,2002:float", ScenarioLoader.construct_yaml_float)

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFile(OSError):
    """A path that is not a regular file, or a file over the size limit of what it should be."""


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, refusing anything else without blocking.

    Raises FileNotFoundError, :class:`UnreadableFile` for a directory, FIFO, device or socket,
    or for a file over ``limit`` bytes (``/dev/zero`` and a FIFO are refused, not read), and
    OSError for the rest.
    """
    # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((k for test, k in _FILE_KINDS if test(info.st_mode)), "not a file")
            raise UnreadableFile(f"not a regular file ({kind})")
        if info.st_size > limit:
            raise UnreadableFile(f"{info.st_size} bytes, over the limit of {limit}")
        chunks, size = [], 0
        while size <= limit:  # st_size can understate (/proc): read at most limit + 1 bytes
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnreadableFile(f"over the limit of {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse_yaml(text: str) -> object:
    """Parse a scenario document with :class:`ScenarioLoader` (raises yaml.YAMLError)."""
    loader = ScenarioLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> object:
    """Read a scenario YAML file within the bounds of :class:`ScenarioLoader` and
    MAX_YAML_BYTES; an unreadable file or a YAML error becomes a ScenarioError."""
    path = Path(path)
    try:
        text = read_bounded(path, MAX_YAML_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError([Problem("", f"file not found: {path}")], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError([Problem("", f"cannot read {path}: {exc}")], str(path)) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ScenarioError([Problem("", f"cannot read {path}: {reason}")], str(path)) from None
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = str(getattr(exc, "problem", None) or exc)[:200]
        if isinstance(exc, _Refused):  # well-formed YAML that a scenario file may not use
            message = f"{where}{reason}"
        else:
            message = f"YAML syntax error at {where}{reason}"
        raise ScenarioError([Problem("", message)], str(path)) from None
    except RecursionError:
        raise ScenarioError([Problem("", "YAML nested too deeply")], str(path)) from None
    except Exception as exc:  # noqa: BLE001 - a tagged scalar SafeLoader fails to build
        # (`!!int` with no digits, `!!timestamp 2001-13-45`): a problem, not a traceback
        reason = f"{type(exc).__name__}: {exc}"[:200]
        raise ScenarioError(
            [Problem("", f"YAML value cannot be built: {reason}")], str(path)
        ) from None
