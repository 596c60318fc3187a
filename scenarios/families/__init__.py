"""Declarative rule families: games written in YAML alone, with ``rules: <family>``.

- ``matrix`` (:mod:`.matrix`): normal-form games with cheap talk (prisoner's dilemma, stag hunt,
  chicken, coordination, battle of the sexes), optionally repeated.
- ``question`` (:mod:`.question`): hidden-information questions over facts dealt from pools with
  per-agent visibility, answered by a team or a reporter (sum, max, lookup, concatenation).
- ``vote`` (:mod:`.vote`): propose and vote over ballots, paid by agreement and private
  preferences.

Each family is an ordinary registered rules class whose ``params`` hold the whole game; its
``check_params`` names the key of every mistake. Templates (:mod:`.templates`) fill named
placeholders with dealt values as data, never evaluating anything. Importing this package
registers the families and their rule bots (:mod:`.bots`).
"""

from marl.scenarios.families import bots, matrix, question, vote

__all__ = ["bots", "matrix", "question", "vote"]
