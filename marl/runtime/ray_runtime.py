"""The Ray runtime: rollout worker actors and one learner actor per trainable policy.

The trainer's process is the driver. It calls coarse methods on the actors:

- **Rollout workers** (``ray.num_rollout_workers``) each hold environment copies and the
  inference side of every policy, built through the backend registry (``backend=hf|vllm``).
  A step's GRPO groups are dealt to them in contiguous blocks.
- **Learners**: one actor per trainable policy, all reserved together by ONE placement group with
  a bundle per learner (``{"CPU": ray.learner_num_cpus, "GPU": policies.<id>.num_gpus}``), so a
  run either gets every device it asked for or fails before it starts. Frozen policies get no
  learner and no GPU. ``ray.placement_strategy`` spreads or packs the bundles over nodes.
- **Counterfactual credit** (and the emergence metrics' influence) runs where the
  environments are: each worker re-simulates the episodes it played (the driver sends back
  their recorded completions, plain data), forking them on its own environment copies with its
  own policies' generation; the parts are merged in group order. Environments never leave a
  worker: what comes back from a rollout is turn records and episode records.
- **Updates** are submitted to every learner at once and gathered with one ``ray.get`` on the
  list: independent learners run concurrently.
- **Sync**: after each update every learner publishes its weights (a LoRA policy only its
  adapter) to the object store ONCE; every worker loads them from there before the next rollout.
- **Fault tolerance**: a worker that dies (its process killed, its node lost) is replaced by a
  new actor, which first loads the current weights and is then given the same call again. A
  worker's result is a pure function of (step, groups, weights), so the retried call returns
  what the dead one would have: no step is lost and none is counted twice. (Learner deaths are
  fatal: a learner's optimizer state lives only in it and in the last checkpoint.)

``ray.address`` joins an existing cluster; otherwise a local one is started with
``ray.num_cpus`` / ``ray.num_gpus`` (logical GPUs on a CPU machine are enough to test placement)
and shut down by :meth:`RayRuntime.close`. Before any actor is requested, the learners' bundles
and the workers' requests are checked against the cluster's nodes (:func:`can_place`): a run
that could never be placed, such as the ``cluster`` preset's 4 CPUs per learner on a 2-CPU head,
fails at once with the numbers and the keys to change, instead of waiting for a timeout. (The
check sees the nodes that are up when the run starts: on an autoscaling cluster, start the
nodes the run needs first.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import (
    AuthenticationError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RayTaskError,
)
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from marl.config import Config, ConfigError, RayConfig
from marl.credit import CreditResult
from marl.errors import RunError, remote_cause
from marl.runtime.job_layout import sweep_job_layout
from marl.runtime.policies import PolicyLearner
from marl.runtime.policy_map import PolicyPlan, assign_shares
from marl.runtime.ray_join import AUTH_HINT, join_failure, probe, token_source_problem
from marl.runtime.resimulation import merge_credit
from marl.runtime.rollout import RolloutResult
from marl.runtime.threads import actor_threads, configure_threads, thread_env
from marl.runtime.workers import RolloutWorker, split_groups


def _actor_device() -> str | None:
    """CUDA when Ray gave this actor a GPU that torch can see (logical GPUs: CPU)."""
    if not ray.get_gpu_ids():
        return None
    import torch

    return "cuda" if torch.cuda.is_available() else None


def _where() -> dict[str, Any]:
    import torch

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "torch_threads": torch.get_num_threads(),
        "thread_env": {k: os.environ.get(k) for k in thread_env(1)},
    }


def _actor_options(threads: int | None, num_cpus: float) -> tuple[int, dict[str, Any]]:
    """An actor's torch threads (:func:`marl.runtime.threads.actor_threads`) and the ``runtime_env``
    that starts OpenMP and MKL with the same count."""
    count = actor_threads(threads, num_cpus)
    return count, {"env_vars": thread_env(count)}


class LearnerActor(PolicyLearner):
    """A :class:`PolicyLearner` in its own actor, on the device its bundle reserved, with
    ``threads`` torch threads (set before the model is built)."""

    def __init__(self, spec: Any, config: Config, threads: int = 1) -> None:
        configure_threads(threads, stream=None)
        super().__init__(spec, config, device=_actor_device())

    def info(self) -> dict[str, Any]:
        """Process, node, GPU ids, device and last update window."""
        return {**super().info(), **_where()}


class WorkerActor(RolloutWorker):
    """A :class:`RolloutWorker` in its own actor, with ``threads`` torch threads (set before
    the models are built)."""

    def __init__(
        self, config: Config, plan: PolicyPlan | None, index: int, threads: int = 1
    ) -> None:
        configure_threads(threads, stream=None)
        super().__init__(config, plan, index=index, device=_actor_device())

    def load_many(self, *payloads: Any) -> dict[str, int]:
        """Load several policies' weights (object refs passed as arguments arrive resolved)."""
        for payload in payloads:
            self.load_weights(payload)
        return self.versions()

    def info(self) -> dict[str, Any]:
        """Process, node and GPU ids."""
        return {**super().info(), **_where()}


_LearnerRemote = ray.remote(LearnerActor)
_WorkerRemote = ray.remote(WorkerActor)


def connect(settings: RayConfig) -> bool:
    """Join ``ray.address`` or start a local cluster; returns whether this call started Ray.

    A process already connected keeps its session (and the caller must not shut it down). A
    cluster that cannot be joined (nothing at the address, a token this process does not send:
    :mod:`marl.runtime.ray_join`) is a :class:`RunError` of one line.
    """
    if ray.is_initialized():
        return False
    unusable = token_source_problem()  # before Ray reads it: a FIFO would hang the join
    if unusable:
        raise RunError(unusable)
    common: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if settings.address:
        # a cluster that refuses our token, or nothing at the address: one line, at once
        refused = probe(settings.address)
        if refused:
            raise RunError(refused)
        try:
            ray.init(address=settings.address, **common)
        except (ConnectionError, RuntimeError, RayError) as exc:
            raise RunError(join_failure(settings.address, exc)) from None
    else:  # "local": a new cluster even if another one runs on this machine (no auto-join)
        try:
            ray.init(
                address="local", num_cpus=settings.num_cpus, num_gpus=settings.num_gpus, **common
            )
        except AuthenticationError as exc:  # Ray's own words say what is wrong; then the hint
            reason = next((line for line in str(exc).splitlines() if line.strip()), "")
            reason = reason.split(". Ensure")[0][:300]
            raise RunError(f"ray (local): {reason}; {AUTH_HINT}") from None
    return True


def cluster_gpus() -> tuple[float, float]:
    """(GPUs in the cluster, most GPUs on one live node)."""
    per_node = [n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    return float(sum(per_node)), float(max(per_node, default=0.0))


Resources = Mapping[str, float]
_EPS = 1e-6  # Ray counts resources in units of 1e-4


class _GaveUp(Exception):
    """The placement search took too many steps."""


def can_place(
    learners: Sequence[Resources],
    strategy: str,
    workers: Sequence[Resources],
    nodes: Sequence[Resources],
    max_steps: int = 100_000,
) -> bool | None:
    """Whether the learners' bundles and the workers' requests fit the ``nodes`` all at once.

    ``nodes`` holds each live node's total resources: the question is whether the run could
    ever be placed, not whether it fits what is free now. ``strategy`` constrains the learners'
    placement group: ``STRICT_PACK`` puts every bundle on one node, ``STRICT_SPREAD`` each on its
    own node; ``PACK`` and ``SPREAD`` are best-effort and may use any node. Workers go anywhere.
    Exact (backtracking bin packing); ``None`` when the search gave up after ``max_steps``.
    """
    items: list[tuple[Resources, bool]] = []  # (demand, must be on a node of its own)
    if strategy == "STRICT_PACK" and learners:
        keys = {k for b in learners for k in b}
        items.append(({k: sum(b.get(k, 0.0) for b in learners) for k in keys}, False))
    else:
        items += [(b, strategy == "STRICT_SPREAD") for b in learners]
    items += [(w, False) for w in workers]
    items.sort(key=lambda item: -sum(item[0].values()))  # biggest first: fails fastest
    free = [dict(node) for node in nodes]
    steps = 0

    def place(k: int, spread_nodes: frozenset[int]) -> bool:
        nonlocal steps
        steps += 1
        if steps > max_steps:
            raise _GaveUp
        if k == len(items):
            return True
        demand, alone = items[k]
        for j, node in enumerate(free):
            if alone and j in spread_nodes:
                continue
            if any(node.get(r, 0.0) + _EPS < v for r, v in demand.items() if v > 0):
                continue
            for r, v in demand.items():
                node[r] = node.get(r, 0.0) - v
            if place(k + 1, spread_nodes | {j} if alone else spread_nodes):
                return True
            for r, v in demand.items():
                node[r] += v
        return False

    try:
        return place(0, frozenset())
    except _GaveUp:
        return None


def learner_bundles(
    plan: PolicyPlan | None, requests: Mapping[str, float], cpus: float
) -> list[dict[str, float]]:
    """One resource bundle per trainable policy, in ``plan.trainable`` order: ``cpus``
    (``ray.learner_num_cpus``) and the policy's GPU share from ``requests``, when it has one."""
    if plan is None:
        return []
    bundles = []
    for pid in plan.trainable:
        bundle = {"CPU": cpus}
        if requests[pid] > 0:
            bundle["GPU"] = requests[pid]
        bundles.append(bundle)
    return bundles


def cluster_nodes() -> list[dict[str, float]]:
    """The CPUs and GPUs of every live node of the connected cluster (totals, not free)."""
    return [
        {"CPU": float(n["Resources"].get("CPU", 0.0)), "GPU": float(n["Resources"].get("GPU", 0.0))}
        for n in ray.nodes()
        if n.get("Alive")
    ]


# CPU requests the refusal may suggest, largest first: Ray schedules fractions of a CPU
_LEARNER_CPUS = (4.0, 2.0, 1.0, 0.5, 0.25, 0.2, 0.1, 0.05)
_WORKER_CPUS = (1.0, 0.5, 0.25, 0.1)


def suggest_fit(
    learners: Sequence[Resources],
    settings: RayConfig,
    n_workers: int,
    nodes: Sequence[Resources],
    worker_gpus: float | None = None,
) -> dict[str, float] | None:
    """Overrides of ``ray.*`` CPU requests under which the run fits ``nodes``, or ``None``
    (``worker_gpus``: each worker's GPUs, resolved; default ``ray.worker_num_gpus`` or 0).

    Keeps as many rollout workers as possible (down to one), then the largest learner CPUs,
    then the largest worker CPUs; only the keys that change are returned. GPU requests are
    left alone (:func:`marl.runtime.policy_map.assign_shares` has checked them). With one
    learner per trainable policy, this finds a fit for every sharing mode whenever the CPUs can
    hold one: 4 independent learners on a 2-CPU head get ``ray.learner_num_cpus=0.25``.
    """
    s = settings
    worker_gpus = (s.worker_num_gpus or 0.0) if worker_gpus is None else worker_gpus
    lcpus = sorted({c for c in (s.learner_num_cpus, *_LEARNER_CPUS) if c <= s.learner_num_cpus})
    wcpus = sorted({c for c in (s.worker_num_cpus, *_WORKER_CPUS) if c <= s.worker_num_cpus})
    for count in range(n_workers, 0, -1):
        for lcpu in reversed(lcpus):
            bundles = [{**b, "CPU": lcpu} for b in learners]
            for wcpu in reversed(wcpus):
                worker = {"CPU": wcpu, "GPU": worker_gpus}
                if can_place(bundles, s.placement_strategy, [worker] * count, nodes):
                    fix = {
                        "ray.learner_num_cpus": (lcpu, s.learner_num_cpus),
                        "ray.num_rollout_workers": (count, n_workers),
                        "ray.worker_num_cpus": (wcpu, s.worker_num_cpus),
                    }
                    return {k: new for k, (new, old) in fix.items() if new != old}
    return None


@dataclass
class PendingCalls:
    """Calls submitted to workers and not yet gathered: worker index -> (ref, method, args)."""

    calls: dict[int, tuple[Any, str, tuple]]


class RayRuntime:
    """Rollout workers and learners as Ray actors; see the module docstring."""

    def __init__(self, config: Config, plan: PolicyPlan | None) -> None:
        self.config = config
        self.plan = plan
        self.settings = config.ray
        self.workers: list[Any] = []
        self.learners: dict[str, Any] = {}
        self.requests: dict[str, float] = {}
        self.restarts = 0  # rollout workers replaced so far
        self._pg = None
        self._job = sweep_job_layout()  # inside a sweep job: the bundles reserved for the actors
        self._weights: dict[str, Any] = {}  # policy id -> object ref of its newest weights
        s = self.settings
        self.worker_gpus = s.worker_num_gpus or 0.0  # each rollout worker's; _start packs null
        declared = s.num_gpus is not None and not s.address and not ray.is_initialized()
        if declared:  # checked before Ray starts
            assign_shares(
                plan, s.num_gpus, None, "ray.num_gpus", self._workers_wanted(), s.worker_num_gpus
            )
        self._started = connect(s)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start-up

    def _workers_wanted(self) -> int:
        return min(self.settings.num_rollout_workers, self.config.train.seeds_per_step)

    def _start(self) -> None:
        s, plan = self.settings, self.plan
        total, largest = cluster_gpus()
        source = f"the Ray cluster at {s.address}" if s.address else "the Ray cluster"
        self.requests, self.worker_gpus = assign_shares(
            plan, total, largest, source, self._workers_wanted(), s.worker_num_gpus
        )
        self._check_fits(source)
        if self._job is not None:
            self._job.check(len(plan.trainable) if plan else 0, self._workers_wanted())
        if plan is not None:
            self._place_learners()
        for index in range(self._workers_wanted()):
            self.workers.append(self._new_worker(index))
        self.sync()

    def _learner_bundles(self) -> list[dict[str, float]]:
        """One resource bundle per trainable policy, in ``plan.trainable`` order."""
        return learner_bundles(self.plan, self.requests, self.settings.learner_num_cpus)

    def _check_fits(self, source: str) -> None:
        """Fail at once, with the numbers, when the run could never be placed on the cluster."""
        s = self.settings
        learners = self._learner_bundles()
        n_workers = self._workers_wanted()
        worker = {"CPU": s.worker_num_cpus, "GPU": self.worker_gpus}
        nodes = cluster_nodes()
        if can_place(learners, s.placement_strategy, [worker] * n_workers, nodes) is not False:
            return
        gpus = sum(b.get("GPU", 0.0) for b in learners) + n_workers * self.worker_gpus
        cpus = len(learners) * s.learner_num_cpus + n_workers * s.worker_num_cpus
        seeds = self.config.train.seeds_per_step
        capped = (
            f" (ray.num_rollout_workers={s.num_rollout_workers}; a step has "
            f"train.seeds_per_step={seeds} group(s), so {n_workers} start)"
            if n_workers < s.num_rollout_workers
            else " (ray.num_rollout_workers)"
        )
        sharing = f", sharing={self.config.sharing}" if self.plan is not None else ""
        fix = suggest_fit(learners, s, n_workers, nodes, self.worker_gpus)
        hint = (
            "this would fit: " + " ".join(f"{k}={v:g}" for k, v in fix.items())
            if fix
            else "lower those requests, or add nodes"
        )
        raise RunError(
            f"ray: the run can never be placed on {source}: {len(learners)} learner(s) x "
            f"{s.learner_num_cpus:g} CPU (ray.learner_num_cpus, one per trainable policy"
            f"{sharing}, ray.placement_strategy={s.placement_strategy}) + {n_workers} rollout "
            f"worker(s){capped} x {s.worker_num_cpus:g} CPU, {self.worker_gpus:g} GPU "
            f"(ray.worker_num_cpus, ray.worker_num_gpus) ask {cpus:g} CPUs and {gpus:g} GPUs, but "
            f"its {len(nodes)} node(s) have CPUs {[n['CPU'] for n in nodes]} and GPUs "
            f"{[n['GPU'] for n in nodes]}; {hint}"
        )

    def _place_learners(self) -> None:
        s, plan = self.settings, self.plan
        assert plan is not None
        ids = plan.trainable
        if not ids:
            return
        if self._job is None:
            bundles = self._learner_bundles()
            self._pg = placement_group(bundles, strategy=s.placement_strategy)
            try:
                ray.get(self._pg.ready(), timeout=s.placement_timeout_s)
            except GetTimeoutError:
                raise RunError(
                    f"policies {', '.join(ids)}: the learners' placement group {bundles} "
                    f"(ray.placement_strategy={s.placement_strategy}) could not be placed within "
                    f"ray.placement_timeout_s={s.placement_timeout_s:g}s; the cluster has "
                    f"{ray.cluster_resources()}"
                ) from None
        threads, runtime_env = _actor_options(self.config.runtime.threads, s.learner_num_cpus)
        for index, pid in enumerate(ids):
            if self._job is not None:  # the bundle the sweep reserved for this learner
                strategy = self._job.strategy(self._job.learners[index])
            else:
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=index
                )
            self.learners[pid] = _LearnerRemote.options(
                num_cpus=s.learner_num_cpus,
                num_gpus=self.requests[pid],
                scheduling_strategy=strategy,
                max_restarts=0,
                runtime_env=runtime_env,
            ).remote(plan.policies[pid], self.config, threads)

    def _new_worker(self, index: int) -> Any:
        s = self.settings
        threads, runtime_env = _actor_options(self.config.runtime.threads, s.worker_num_cpus)
        placed: dict[str, Any] = {}
        if self._job is not None:  # the bundle the sweep reserved for this worker
            placed["scheduling_strategy"] = self._job.strategy(self._job.workers[index])
        return _WorkerRemote.options(
            num_cpus=s.worker_num_cpus,
            num_gpus=self.worker_gpus,
            max_restarts=0,
            runtime_env=runtime_env,
            **placed,
        ).remote(self.config, self.plan, index, threads)

    # ------------------------------------------------------------------ worker calls

    def _submit(self, calls: Sequence[tuple[int, str, tuple]]) -> PendingCalls:
        return PendingCalls(
            {i: (getattr(self.workers[i], m).remote(*args), m, args) for i, m, args in calls}
        )

    def _collect(self, pending: PendingCalls) -> dict[int, Any]:
        """Gather the calls; a worker found dead is replaced and its call made again."""
        results: dict[int, Any] = {}
        calls = dict(pending.calls)
        budget = self.settings.max_worker_restarts
        while calls:
            refs = {ref: i for i, (ref, _, _) in calls.items()}
            ready, _ = ray.wait(list(refs), num_returns=1)
            index = refs[ready[0]]
            _, method, args = calls.pop(index)
            try:
                results[index] = ray.get(ready[0])
            except RayActorError as err:
                if budget == 0:
                    raise RunError(
                        f"rollout worker {index} died again after ray.max_worker_restarts="
                        f"{self.settings.max_worker_restarts} replacements: {err}"
                    ) from None
                budget -= 1
                self._replace_worker(index)
                calls[index] = (getattr(self.workers[index], method).remote(*args), method, args)
        return results

    def _replace_worker(self, index: int) -> None:
        """A new actor in place of worker ``index``, holding the current weights."""
        try:
            ray.kill(self.workers[index], no_restart=True)
        except RayError:  # the actor died: its handle may refuse the kill; anything else raises
            pass
        self.restarts += 1
        worker = self._new_worker(index)
        ray.get(worker.load_many.remote(*self._weights.values()))
        self.workers[index] = worker

    # ------------------------------------------------------------------ phases

    def submit_rollout(self, step: int, matchup: Any = None) -> PendingCalls:
        """Start ``step``'s rollout on every worker; :meth:`collect_rollout` gathers it."""
        blocks = split_groups(self.config.train.seeds_per_step, len(self.workers))
        return self._submit(
            [(i, "rollout", (step, block, matchup)) for i, block in enumerate(blocks)]
        )

    def collect_rollout(self, pending: PendingCalls) -> RolloutResult:
        """Gather the workers' results into one rollout, in group order."""
        parts = self._collect(pending)
        return merge_rollouts([parts[i] for i in sorted(parts)])

    def rollout(self, step: int, matchup: Any = None) -> RolloutResult:
        """Play the iteration's groups on the workers."""
        return self.collect_rollout(self.submit_rollout(step, matchup))

    def policy_weights(self, policy_id: str) -> Any:
        """A learner's current weights, fetched from its actor."""
        return ray.get(self.learners[policy_id].weights.remote())

    def load_frozen(self, payload: Any) -> None:
        """Put a frozen policy's weights in the object store once; every worker loads them (a
        replaced worker loads them too, with the learners' newest weights)."""
        self._weights[payload.policy_id] = ray.put(payload)
        ref = self._weights[payload.policy_id]
        self._collect(self._submit([(i, "load_many", (ref,)) for i in range(len(self.workers))]))

    def credit(self, step: int, rollout: RolloutResult) -> CreditResult:
        """Counterfactual credit on every worker at once, each on the groups it played (the
        same contiguous blocks as the rollout); merged in block order, which is the rollout's
        episode order (:func:`marl.loop.credit_phase.credit_phase` checks that it is)."""
        blocks = split_groups(self.config.train.seeds_per_step, len(self.workers))
        worker_of = {g: i for i, block in enumerate(blocks) for g in block}
        episodes: dict[int, list[Any]] = {i: [] for i in range(len(blocks))}
        for record in rollout.episodes:
            episodes[worker_of[record.group_id]].append(record.recorded)
        calls = [(i, "credit", (step, eps)) for i, eps in episodes.items() if eps]
        parts = self._collect(self._submit(calls))
        return merge_credit([parts[i] for i in sorted(parts)])

    def update(self, turns: Sequence[Any]) -> dict[str, dict[str, float]]:
        """Every learner on its own agents' turns, all at once; one ``ray.get`` on the list."""
        assert self.plan is not None or not self.learners
        ids = list(self.learners)
        futures = [
            self.learners[pid].update.remote(self.plan.turns_of(turns, pid))  # type: ignore[union-attr]
            for pid in ids
        ]
        try:
            return dict(zip(ids, ray.get(futures)))
        except RayTaskError as err:  # a learner's own error (NonFiniteUpdateError): as locally
            cause = remote_cause(err)
            if isinstance(cause, RunError):
                raise cause from None
            raise

    def sync(self) -> None:
        """Each learner puts its weights in the object store once; every worker loads them."""
        if not self.learners:
            return
        frozen = {p: r for p, r in self._weights.items() if p not in self.learners}
        self._weights = {pid: learner.weights.remote() for pid, learner in self.learners.items()}
        self._weights.update(frozen)  # a league opponent's weights stay for replaced workers
        refs = tuple(self._weights[pid] for pid in self.learners)
        self._collect(self._submit([(i, "load_many", refs) for i in range(len(self.workers))]))

    def evaluate(self, episodes: int, step: int) -> RolloutResult:
        """The held-out evaluation on worker 0 (it holds every policy's newest weights)."""
        return self.call_worker(0, "evaluate", episodes, step)

    def influence(self, step: int, episodes: Sequence[Any]) -> list[Any]:
        """Influence on every worker at once, each on the episodes of the groups it played
        (``episodes`` in rollout order); the parts joined in that order."""
        t = self.config.train
        if len(episodes) != t.seeds_per_step * t.group_size:
            raise ValueError(
                f"influence: {len(episodes)} episodes, but a step plays "
                f"{t.seeds_per_step} x {t.group_size}"
            )
        blocks = split_groups(t.seeds_per_step, len(self.workers))
        calls = [
            (
                i,
                "influence",
                (step, list(episodes[b[0] * t.group_size : (b[-1] + 1) * t.group_size])),
            )
            for i, b in enumerate(blocks)
            if b
        ]
        parts = self._collect(self._submit(calls))
        return [effects for i in sorted(parts) for effects in parts[i]]

    def call_worker(self, index: int, method: str, *args: Any) -> Any:
        """Call one worker method (replacing the worker if it died); for tools and tests."""
        return self._collect(self._submit([(index, method, args)]))[index]

    def call_learner(self, policy_id: str, method: str, *args: Any) -> Any:
        """Call one learner method and wait for it."""
        return ray.get(getattr(self.learners[policy_id], method).remote(*args))

    def state(self) -> dict[str, dict[str, Any]]:
        """Every learner's checkpoint state."""
        ids = list(self.learners)
        return dict(zip(ids, ray.get([self.learners[p].state_dict.remote() for p in ids])))

    def load_state(self, states: dict[str, dict[str, Any]]) -> None:
        """Restore every learner, then sync the workers."""
        missing = sorted(set(self.learners) - set(states))
        if missing:
            raise ConfigError(
                f"resume: the checkpoint has no state for policies {missing} (it has: "
                f"{', '.join(sorted(states)) or 'none'}); was it written with other policies?"
            )
        ray.get([self.learners[p].load_state_dict.remote(states[p]) for p in self.learners])
        self.sync()

    def placement(self) -> dict[str, Any]:
        """Where every learner and worker runs (node, GPU ids, process)."""
        learners = dict(
            zip(self.learners, ray.get([a.info.remote() for a in self.learners.values()]))
        )
        workers = [self.call_worker(i, "info") for i in range(len(self.workers))]
        frozen = [p for p, s in self.plan.policies.items() if not s.trainable] if self.plan else []
        return {
            "runtime": "ray",
            "strategy": self.settings.placement_strategy,
            "gpu_requests": dict(self.requests),
            "learners": learners,
            "frozen": frozen,
            "workers": workers,
            "worker_restarts": self.restarts,
        }

    def close(self) -> None:
        """Kill the actors, free the placement group, and stop Ray if this runtime started it."""
        for actor in [*self.workers, *self.learners.values()]:
            try:
                ray.kill(actor, no_restart=True)
            except RayError:  # already dead, or Ray already stopped; anything else raises
                pass
        self.workers, self.learners = [], {}
        if self._pg is not None:  # never the sweep job's group: the launcher owns it
            try:
                remove_placement_group(self._pg)
            except RayError:  # the cluster is gone (RaySystemError); anything else raises
                pass
            self._pg = None
        if self._started and ray.is_initialized():
            ray.shutdown()
        self._started = False


def merge_rollouts(parts: Sequence[RolloutResult]) -> RolloutResult:
    """One rollout from the workers' parts (given in group order)."""
    merged = RolloutResult()
    for part in parts:
        merged.turns += part.turns
        merged.returns += part.returns
        merged.malformed += part.malformed
        merged.episodes += part.episodes
        merged.generate_calls += part.generate_calls
        merged.generated_tokens += part.generated_tokens
    return merged


__all__: list[str] = [
    "LearnerActor",
    "PendingCalls",
    "RayRuntime",
    "WorkerActor",
    "can_place",
    "cluster_gpus",
    "cluster_nodes",
    "connect",
    "merge_rollouts",
]
