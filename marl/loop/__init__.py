"""The training loop: ``marl train``'s iteration, read top to bottom.

``train`` runs rollout -> credit -> update -> weight sync each step, with tool-use warm-up
before it (``warmup``), the credit phase that turns returns into advantages
(``credit_phase``) and the timer of each phase (``timing``). What is measured or kept beside the
policies hangs off the loop as trackers (``tracking``: the interface; ``trackers``: the list),
and a resumed run continues its own folder (``resume``, ``run_folder``). It sits above every
other room of the driver and below the command line (tests/test_layering.py).
"""
