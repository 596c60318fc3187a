"""Sweeps on Ray: every job of a Hydra multirun (``marl train -m ... launcher=ray``) as a Ray task.

- :mod:`marl.sweep.settings`: the launcher's fields (``hydra.launcher.*``), documented there.
- :mod:`marl.sweep.demand`: what one job reserves, read from its own composed config, and the
  one-line refusal of a job that no node could ever hold.
- :mod:`marl.sweep.job_dirs`: what a job's directory already holds (finished, resumable, another
  run's), and the record each job leaves there.
- :mod:`marl.sweep.job`: the function a job runs in its Ray worker process.
- :mod:`marl.sweep.driver`: the launcher's loop: submit, watch, report, stop.
- :mod:`marl.runtime.job_layout` (in the runtime, which reads it): where a job's in-run actors go.

The Hydra side is ``hydra_plugins/marl_ray_launcher``, which only adapts Hydra's ``Launcher``
interface to :func:`marl.sweep.driver.launch`. docs/sweeps.md is the user's guide.
"""
