"""The runtime: what runs policies and environments, in this process or on Ray.

The policies and their learners (``policies``, ``policy_map``, ``learner``), the rollout worker
and the episodes it plays (``workers``, ``rollout``), the re-simulation it runs where its
environments are (``resimulation``: counterfactual credit and listener influence), the exact
exploitability scorer it runs where a policy's weights are (``exploitability``), the check
that every first prompt fits its model before a run starts (``context_check``), the two
runtimes that place the workers (``local``, ``ray_runtime``, with ``ray_join`` and
``machine``), checkpoints, threads and seeds. It reads the records and the config below it
(:mod:`marl.episodes`, :mod:`marl.config`) and nothing of the loop, the measures or the
competition above it (tests/test_layering.py).
"""
