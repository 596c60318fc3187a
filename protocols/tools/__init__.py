"""Tools agents call within a turn (``CALL <tool>: <query>``): registry, built-ins, the toolbox.

Importing this package registers the built-in tools: ``calculator``, ``lookup`` and ``python``.
A tool of your own registers with :func:`register_tool` (docs/tools.md).
"""

from marl.protocols.tools import calculator, lookup, python  # noqa: F401 - register built-ins
from marl.protocols.tools.base import (
    TOOLS,
    ToolEntry,
    ToolError,
    ToolLimits,
    normalise_tools,
    register_tool,
    tool_problems,
)
from marl.protocols.tools.calls import (
    CALL_HEAD,
    RESULT_HEAD,
    ToolBox,
    ToolCall,
    ToolOutcome,
    find_call,
    format_result,
    scripted_call,
    tool_instructions,
)

__all__ = [
    "CALL_HEAD",
    "RESULT_HEAD",
    "TOOLS",
    "ToolBox",
    "ToolCall",
    "ToolEntry",
    "ToolError",
    "ToolLimits",
    "ToolOutcome",
    "find_call",
    "format_result",
    "normalise_tools",
    "register_tool",
    "scripted_call",
    "tool_instructions",
    "tool_problems",
]
