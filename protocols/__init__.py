"""Messages, communication graphs, the message markup, routing rules, budgets and channel noise,
and the turn record (:class:`TurnRecord`) that the rollout writes and credit and learners read.

This package imports nothing from the rest of ``marl``: it is plain data and networkx. The one
registry class every extension point uses (:class:`Registry`) lives here for that reason.
"""

from marl.protocols.graphs import TOPOLOGIES, GraphSpec, build_graph, register_topology
from marl.protocols.markup import ParsedCompletion, markup_instructions, parse_completion
from marl.protocols.messages import Message, Violation
from marl.protocols.registry import Registry, UnknownNameError
from marl.protocols.router import ChannelNoise, MessageBudget, Router
from marl.protocols.turn import TurnRecord

__all__ = [
    "TOPOLOGIES",
    "ChannelNoise",
    "GraphSpec",
    "Message",
    "MessageBudget",
    "ParsedCompletion",
    "Registry",
    "Router",
    "TurnRecord",
    "UnknownNameError",
    "Violation",
    "build_graph",
    "markup_instructions",
    "parse_completion",
    "register_topology",
]
