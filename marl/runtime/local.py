"""Where the phases of an iteration run: in the trainer's own process, or on Ray.

Both runtimes offer the same coarse methods, which :func:`marl.loop.train.train` calls in order:
``rollout(step)``, ``credit(step, rollout)`` (counterfactual credit, where the environments
are), ``update(turns)``, ``sync()``, plus ``influence`` (the emergence metrics' re-simulation,
also where the environments are), ``state()`` / ``load_state()`` (checkpoints) and
``placement()``. What crosses between phases is plain data: a :class:`RolloutResult` holds turn
records and episode records, never an environment.

:class:`LocalRuntime` (``ray.enabled=false``, the default) keeps one rollout worker and every
learner in this process. Every learner trains the worker's own weights in place: a full-model
policy's model, or a LoRA policy's adapter on the one shared base (no copy of the base, and
its sync is a no-op). Only a backend without a torch model (vLLM) gets learners with their own
copy, which push their weights after each update. Learners update one after another.
:mod:`marl.runtime.ray_runtime` is the distributed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from marl.config import Config, ConfigError
from marl.credit import CreditResult
from marl.runtime.machine import local_gpu_count, one_process_device
from marl.runtime.policy_map import PolicyPlan, assign_gpus
from marl.runtime.rollout import RolloutResult
from marl.runtime.workers import RolloutWorker


class Runtime(Protocol):
    """The phases an iteration asks of its runtime."""

    def rollout(self, step: int, matchup: Any = None) -> RolloutResult:
        """Play the iteration's B seeds x G episodes with the current weights (a league
        ``matchup`` puts its opponent on the learner's other seats)."""
        ...

    def policy_weights(self, policy_id: str) -> Any:
        """A trainable policy's current weights (a
        :class:`~marl.runtime.policies.WeightPayload`)."""
        ...

    def load_frozen(self, payload: Any) -> None:
        """Give every rollout worker new weights for a frozen policy (a league opponent)."""
        ...

    def credit(self, step: int, rollout: RolloutResult) -> CreditResult:
        """Counterfactual credit of ``step``'s rollout, computed by the workers that played it
        (each re-simulates its own episodes); episodes in the rollout's order."""
        ...

    def update(self, turns: Sequence[Any]) -> dict[str, dict[str, float]]:
        """One update of every trainable policy on its own agents' turns; metrics per policy."""
        ...

    def evaluate(self, episodes: int, step: int) -> RolloutResult:
        """Play ``episodes`` held-out scenarios with the current weights (no update)."""
        ...

    def sync(self) -> None:
        """Make every rollout worker hold every policy's newest weights."""
        ...

    def influence(self, step: int, episodes: Sequence[Any]) -> list[Any]:
        """Listener influence of ``step``'s episodes (the rollout's emergence data, in order),
        measured by the workers that played them; one effects dict per episode."""
        ...

    def state(self) -> dict[str, dict[str, Any]]:
        """Every trainable policy's checkpoint state, by policy id."""
        ...

    def load_state(self, states: dict[str, dict[str, Any]]) -> None:
        """Restore :meth:`state`'s result, then sync."""
        ...

    def placement(self) -> dict[str, Any]:
        """Where each learner and worker runs."""
        ...

    def close(self) -> None:
        """Release what the runtime started."""
        ...


def make_runtime(config: Config, plan: PolicyPlan | None) -> Runtime:
    """The configured runtime: Ray actors when ``ray.enabled``, else this process."""
    if config.ray.enabled:
        from marl.runtime.ray_runtime import RayRuntime

        return RayRuntime(config, plan)
    return LocalRuntime(config, plan)


class LocalRuntime:
    """Everything in the trainer's process."""

    def __init__(self, config: Config, plan: PolicyPlan | None) -> None:
        from marl.runtime.policies import PolicyLearner, rollout_learner

        self.config = config
        self.plan = plan
        self.requests: dict[str, float] = {}
        if plan is not None:
            self.requests = assign_gpus(plan, local_gpu_count(), source="torch.cuda.device_count()")
        # one process, one device: CUDA when any policy asked for a GPU and torch has one
        device = one_process_device(self.requests, local_gpu_count())
        self.worker = RolloutWorker(config, plan, device=device)
        self.learners: dict[str, PolicyLearner] = {}
        if plan is None:
            return
        for pid in plan.trainable:  # each trains the rollout's own weights: nothing to push
            backend = self.worker.policies.backends[pid]  # type: ignore[union-attr]
            self.learners[pid] = rollout_learner(plan.policies[pid], config, backend, device)
        self.sync()

    def rollout(self, step: int, matchup: Any = None) -> RolloutResult:
        """Play every group of ``step`` in this process (one batched call per round)."""
        return self.worker.rollout(step, range(self.config.train.seeds_per_step), matchup)

    def policy_weights(self, policy_id: str) -> Any:
        """The learner's current weights, as detached CPU copies."""
        return self.learners[policy_id].weights()

    def load_frozen(self, payload: Any) -> None:
        """Load a frozen policy's weights into the one worker."""
        self.worker.load_weights(payload)

    def evaluate(self, episodes: int, step: int) -> RolloutResult:
        """The held-out evaluation, in this process."""
        return self.worker.evaluate(episodes, step)

    def credit(self, step: int, rollout: RolloutResult) -> CreditResult:
        """Counterfactual credit on the one worker, which played every episode."""
        return self.worker.credit(step, [record.recorded for record in rollout.episodes])

    def update(self, turns: Sequence[Any]) -> dict[str, dict[str, float]]:
        """Each trainable policy on its agents' turns, one after another."""
        assert self.plan is not None or not self.learners
        return {
            pid: learner.update(self.plan.turns_of(turns, pid))  # type: ignore[union-attr]
            for pid, learner in self.learners.items()
        }

    def sync(self) -> None:
        """Push the adapters of LoRA learners; colocated full models need nothing."""
        for learner in self.learners.values():
            if not learner.colocated:
                self.worker.load_weights(learner.weights())

    def influence(self, step: int, episodes: Sequence[Any]) -> list[Any]:
        """Influence on the one worker, which played every episode."""
        return self.worker.influence(step, list(episodes))

    def state(self) -> dict[str, dict[str, Any]]:
        """Every learner's checkpoint state."""
        return {pid: learner.state_dict() for pid, learner in self.learners.items()}

    def load_state(self, states: dict[str, dict[str, Any]]) -> None:
        """Restore the learners, then push their weights."""
        for pid, learner in self.learners.items():
            if pid not in states:
                raise ConfigError(
                    f"resume: the checkpoint has no state for policy {pid!r} (it has: "
                    f"{', '.join(sorted(states)) or 'none'}); was it written with other policies?"
                )
            learner.load_state_dict(states[pid])
        self.sync()

    def placement(self) -> dict[str, Any]:
        """One process: every learner here."""
        return {
            "runtime": "local",
            "learners": {pid: learner.info() for pid, learner in self.learners.items()},
            "workers": [self.worker.info()],
        }

    def close(self) -> None:
        """Nothing to release."""
