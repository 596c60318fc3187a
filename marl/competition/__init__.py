"""Play against others: leagues, ratings and ``marl eval``.

The league of frozen snapshots (``league``), Elo and Bradley-Terry ratings (``ratings``),
zero-sum outcome bonuses (``outcomes``), ``marl eval``'s players and cross-play tables
(``players``, ``crossplay``, ``role_eval``) and the exploitability tracker of a training run
(``exploitability_log``). It reads the records, the runtime and the measures below it; only the
loop and the command line read it (tests/test_layering.py).
"""
