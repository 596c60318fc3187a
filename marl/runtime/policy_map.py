"""Policies and the agent -> policy map, resolved against a scenario's agents and checked.

A run declares ``policies`` (id -> :class:`~marl.config.PolicyConfig`) and a ``policy_map``
(agent -> policy id, exact names or glob patterns), as RLlib's policy mapping does. The
``sharing`` mode generates the policies of the agents the map leaves out, from the scenario's own
agent list, so the presets ``sharing=shared|independent|lora`` fit any scenario:

- ``shared``: one policy ``shared`` for all of them;
- ``independent``: one full policy per agent, named after it;
- ``lora``: one LoRA adapter per agent over the frozen ``model``, named after it;
- ``custom``: nothing generated; the map must name every agent.

Generated policies take ``policy_defaults``. The modes mix: ``sharing=shared`` with
``policy_map: {bob: opponent}`` and ``policies: {opponent: {trainable: false}}`` trains one
shared policy for everyone but bob, who plays a frozen copy.

:func:`resolve_policies` returns a :class:`PolicyPlan` or raises :class:`ConfigError` naming the
key: an agent with no policy, a policy nobody uses, a map entry naming no agent or no policy.
:func:`assign_gpus` checks the device requests against what the machine or cluster has.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from marl.agents.models import ModelSpec
from marl.config import Config, ConfigError, LoraSettings, PolicyConfig

SHARED = "shared"
_ID = re.compile(r"^[A-Za-z0-9_-]+$")
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class PolicySpec:
    """One resolved policy: every setting filled in, and the agents that play it."""

    id: str
    model: ModelSpec
    lora: LoraSettings | None
    trainable: bool
    num_gpus: float | None  # as requested; None = one per trainable policy where GPUs exist
    lr: float
    beta: float
    agents: tuple[str, ...]
    entropy: float = 0.0
    temperature: float = 1.0  # the sampling temperature (``sampling.temperature`` unless set)
    choice: str = "sample"  # ``scored``: finite-choice turns answered by scored legal texts

    @property
    def adapter(self) -> str | None:
        """The adapter's name in the inference backends (``None`` for a full-model policy)."""
        # A suffix keeps every id a valid peft adapter name (peft refuses substrings of "lora_").
        return f"{self.id}_adapter" if self.lora is not None else None

    @property
    def scored(self) -> bool:
        """Whether it answers finite-choice turns by scoring their legal texts
        (``policies.<id>.choice: scored``)."""
        return self.choice == "scored"

    @property
    def base_key(self) -> tuple:
        """Policies with equal keys run on the same base model (LoRA policies share its copy)."""
        return tuple(sorted(vars(self.model).items()))


@dataclass(frozen=True)
class PolicyPlan:
    """The run's policies (sorted by id) and which agent plays which."""

    policies: dict[str, PolicySpec]
    agent_policy: dict[str, str]
    sharing: str = SHARED
    explicit: tuple[str, ...] = field(default_factory=tuple)  # ids declared in ``policies``

    def policy_of(self, agent: str) -> str:
        """The policy id ``agent`` plays."""
        try:
            return self.agent_policy[agent]
        except KeyError:
            known = ", ".join(self.agent_policy)
            raise KeyError(f"agent {agent!r} is not in the policy map (agents: {known})") from None

    @property
    def trainable(self) -> list[str]:
        """Ids of the policies that learn, sorted."""
        return [pid for pid, spec in self.policies.items() if spec.trainable]

    @property
    def temperatures(self) -> dict[str, float]:
        """Each policy's sampling temperature (``policies.<id>.temperature``, else
        ``sampling.temperature``): what generation takes as ``temperatures``."""
        return {pid: spec.temperature for pid, spec in self.policies.items()}

    @property
    def scored(self) -> frozenset[str]:
        """Ids of the policies that answer finite-choice turns by scoring their legal texts
        (``policies.<id>.choice: scored``): what generation takes as ``scored``."""
        return frozenset(pid for pid, spec in self.policies.items() if spec.scored)

    def turns_of(self, turns: Sequence, policy_id: str) -> list:
        """The turn records ``policy_id`` learns from: the turns of its own agents, nothing else."""
        return [t for t in turns if t.policy_id == policy_id]


def resolve_policies(config: Config, agents: Sequence[str]) -> PolicyPlan:
    """Expand ``sharing``, ``policies`` and ``policy_map`` for ``agents``; check them."""
    if not agents:
        raise ConfigError("scenario: the scenario declares no agents")
    mapping = _map_agents(config, list(agents))
    declared = config.policies
    specs: dict[str, PolicySpec] = {}
    for pid in sorted(set(mapping.values())):
        users = tuple(a for a in agents if mapping[a] == pid)
        if pid in declared:
            policy, key = declared[pid], f"policies.{pid}"
            if _generated(config.sharing, pid, users):  # a preset's policy, some fields set
                policy = _over_template(_template(config), policy)
        elif _generated(config.sharing, pid, users):
            policy, key = _template(config), "policy_defaults"
        else:
            entry = _map_key_of(config.policy_map, users[0])
            names = ", ".join(sorted(declared)) or "none"
            raise ConfigError(
                f"policy_map.{entry}: policy {pid!r} is not declared in `policies` "
                f"(declared: {names}; sharing={config.sharing} generates "
                f"{_generated_ids(config.sharing, agents)})"
            )
        specs[pid] = _spec(config, pid, policy, key, users)
    unused = sorted(set(declared) - set(specs))
    if unused:
        raise ConfigError(
            f"policies.{unused[0]}: no agent plays this policy; map an agent to it in "
            f"`policy_map` or remove it (agents: {', '.join(agents)})"
        )
    return PolicyPlan(
        policies=specs,
        agent_policy={a: mapping[a] for a in agents},
        sharing=config.sharing,
        explicit=tuple(sorted(declared)),
    )


def scenario_agents(config: Config) -> list[str]:
    """The configured scenario's agents (builds the environment once, no model)."""
    from marl.scenarios.registry import make

    return list(make(config.scenario.name, **config.scenario.overrides).possible_agents)


def plan_for(config: Config) -> PolicyPlan:
    """:func:`resolve_policies` for the configured scenario."""
    return resolve_policies(config, scenario_agents(config))


def _map_agents(config: Config, agents: list[str]) -> dict[str, str]:
    """Agent -> policy id: an exact ``policy_map`` key, else the first matching pattern, else the
    sharing mode's generated policy."""
    exact = {k: v for k, v in config.policy_map.items() if not _GLOB.search(k)}
    patterns = [(k, v) for k, v in config.policy_map.items() if _GLOB.search(k)]
    for key in exact:
        if key not in agents:
            raise ConfigError(
                f"policy_map.{key}: the scenario has no agent {key!r} (agents: {', '.join(agents)})"
            )
    for key, _ in patterns:
        if not any(fnmatch.fnmatchcase(a, key) for a in agents):
            raise ConfigError(
                f"policy_map.{key}: the pattern matches no agent (agents: {', '.join(agents)})"
            )
    mapping: dict[str, str] = {}
    for agent in agents:
        if agent in exact:
            mapping[agent] = exact[agent]
            continue
        match = next((v for k, v in patterns if fnmatch.fnmatchcase(agent, k)), None)
        if match is not None:
            mapping[agent] = match
        elif config.sharing == SHARED:
            mapping[agent] = SHARED
        elif config.sharing in ("independent", "lora"):
            mapping[agent] = agent
        else:
            raise ConfigError(
                f"policy_map: agent {agent!r} has no policy; with sharing=custom every agent "
                f"must be mapped (add policy_map.{agent}=<policy id> or a '*' pattern)"
            )
    for agent, pid in mapping.items():
        if not _ID.match(pid):
            raise ConfigError(
                f"policy_map.{_map_key_of(config.policy_map, agent)}: policy id {pid!r} (for "
                f"agent {agent!r}) may only use letters, digits, '_' and '-'"
            )
    return mapping


def _map_key_of(policy_map: Mapping[str, str], agent: str) -> str:
    """The ``policy_map`` key that decided ``agent``'s policy (the agent itself if none did)."""
    if agent in policy_map:
        return agent
    for key in policy_map:
        if _GLOB.search(key) and fnmatch.fnmatchcase(agent, key):
            return key
    return agent


def _generated(sharing: str, pid: str, users: Sequence[str]) -> bool:
    """Whether the sharing mode generates ``pid`` for these agents."""
    if sharing == SHARED:
        return pid == SHARED
    if sharing in ("independent", "lora"):
        return tuple(users) == (pid,)
    return False


def _generated_ids(sharing: str, agents: Sequence[str]) -> str:
    if sharing == SHARED:
        return f"'{SHARED}'"
    if sharing in ("independent", "lora"):
        return "one policy per agent, named after it"
    return "none"


def _template(config: Config) -> PolicyConfig:
    """The settings of a generated policy: ``policy_defaults``, with an adapter under ``lora``."""
    template = config.policy_defaults
    if config.sharing == "lora" and template.lora is None:
        template = replace(template, lora=LoraSettings())
    return template


def _over_template(template: PolicyConfig, declared: PolicyConfig) -> PolicyConfig:
    """A policy the sharing preset generates and ``policies`` also declares: the preset's
    settings (``policy_defaults``, its adapter under ``lora``) with the fields the declaration
    sets over them, so ``policies.listener.entropy: 0.01`` under ``sharing=lora`` keeps the
    listener's adapter. A declared frozen policy (``trainable: false``) without an adapter of
    its own is the base model, as it always was."""
    default = PolicyConfig()
    changes = {
        name: getattr(declared, name)
        for name in vars(default)
        if getattr(declared, name) != getattr(default, name)
    }
    merged = replace(template, **changes)
    if not merged.trainable and declared.lora is None:
        merged = replace(merged, lora=None)
    return merged


def _spec(
    config: Config, pid: str, policy: PolicyConfig, key: str, users: tuple[str, ...]
) -> PolicySpec:
    if policy.lora is not None and not policy.trainable:
        raise ConfigError(
            f"{key}.lora: a frozen LoRA adapter is never trained, so it is just the base model; "
            "drop `lora` or make the policy trainable"
        )
    if not policy.trainable and policy.num_gpus:
        raise ConfigError(
            f"{key}.num_gpus: a frozen policy has no learner, so it takes no GPU (its generation "
            "runs in the rollout workers: see ray.worker_num_gpus)"
        )
    return PolicySpec(
        id=pid,
        model=policy.model if policy.model is not None else config.model,
        lora=policy.lora,
        trainable=policy.trainable,
        num_gpus=policy.num_gpus,
        lr=policy.lr if policy.lr is not None else config.algo.lr,
        beta=policy.beta if policy.beta is not None else config.algo.beta,
        agents=users,
        entropy=policy.entropy if policy.entropy is not None else config.algo.entropy,
        temperature=(
            policy.temperature if policy.temperature is not None else config.sampling.temperature
        ),
        choice=policy.choice,
    )


def gpu_requests(plan: PolicyPlan, total: float, reserved: float = 0.0) -> dict[str, float]:
    """GPUs each trainable policy's learner takes, out of ``total`` GPUs of which ``reserved``
    go to other actors. An explicit ``num_gpus`` stays as written. The others (null) are packed
    onto the GPUs left: one each when there are enough, else equal shares of them, each share
    ``1 / k`` of a GPU for the smallest whole ``k`` that fits them all, so that every share
    lies on one GPU (Ray never splits a fraction across devices). No GPUs: none. Frozen
    policies take none (their generation runs in the rollout workers)."""
    requests = {pid: spec.num_gpus for pid, spec in plan.policies.items() if spec.trainable}
    packed = [pid for pid, gpus in requests.items() if gpus is None]
    left = total - reserved - sum(g for g in requests.values() if g is not None)
    share = _packed_share(len(packed), left) if total > 0 else 0.0
    return {pid: (share if gpus is None else gpus) for pid, gpus in requests.items()}


def _packed_share(policies: int, left: float) -> float:
    """Each of ``policies`` policies' share of ``left`` free GPUs (see :func:`gpu_requests`)."""
    whole = int(left + 1e-9)
    if not policies or left <= 1e-9:
        return 0.0
    if whole >= policies:
        return 1.0
    if whole >= 1:
        return 1.0 / math.ceil(policies / whole)
    return left / policies  # what remains of one partly used GPU


def packed_shares(
    plan: PolicyPlan | None, total: float, workers: int, worker_request: float | None
) -> tuple[dict[str, float], float]:
    """The learners' GPU requests and each of ``workers`` rollout workers' GPUs, out of
    ``total``. ``worker_request`` (``ray.worker_num_gpus``) as written, the learners packed onto
    what is left (:func:`gpu_requests`); ``None`` packs the workers with the learners whose
    ``num_gpus`` is null, every one an equal share (``1 / k`` of a GPU, as there). No GPUs, or
    no model (scripted agents, ``plan`` None): none."""
    if plan is None:  # scripted agents: no model, so no GPU for anyone unless asked
        return {}, worker_request or 0.0
    if worker_request is not None or total <= 0:
        per_worker = worker_request or 0.0
        return gpu_requests(plan, total, workers * per_worker), per_worker
    asked = {pid: spec.num_gpus for pid, spec in plan.policies.items() if spec.trainable}
    packed = [pid for pid, gpus in asked.items() if gpus is None]
    left = total - sum(g for g in asked.values() if g is not None)
    share = _packed_share(len(packed) + workers, left)
    return {pid: (share if gpus is None else gpus) for pid, gpus in asked.items()}, share


def assign_shares(
    plan: PolicyPlan | None,
    total: float,
    largest_node: float | None = None,
    source: str = "this machine",
    workers: int = 0,
    worker_request: float | None = 0.0,
) -> tuple[dict[str, float], float]:
    """:func:`packed_shares`, checked against ``total`` GPUs as :func:`assign_gpus` checks."""
    requests, per_worker = packed_shares(plan, total, workers, worker_request)
    _check_requests(requests, total, largest_node, source, workers * per_worker)
    return requests, per_worker


def assign_gpus(
    plan: PolicyPlan,
    total: float,
    largest_node: float | None = None,
    source: str = "this machine",
    reserved: float = 0.0,
) -> dict[str, float]:
    """The learners' GPU requests, checked against ``total`` GPUs (``largest_node``: the most
    on one node); ``reserved`` GPUs are taken by other actors. Raises ConfigError naming the
    policies whose request cannot be met."""
    requests = gpu_requests(plan, total, reserved)
    _check_requests(requests, total, largest_node, source, reserved)
    return requests


def _check_requests(
    requests: dict[str, float],
    total: float,
    largest_node: float | None,
    source: str,
    reserved: float,
) -> None:
    """Raise ConfigError naming the policies whose GPU request cannot be met."""
    largest = total if largest_node is None else largest_node
    for pid, gpus in requests.items():
        if gpus > largest:
            where = "one node of " + source if largest_node is not None else source
            raise ConfigError(
                f"policies.{pid}.num_gpus: asks for {gpus:g} GPU(s), but {where} has {largest:g}"
            )
    needed = sum(requests.values()) + reserved
    if needed > total + 1e-9:
        asked = ", ".join(f"{pid}: {g:g}" for pid, g in requests.items() if g)
        keys = ", ".join(f"policies.{pid}.num_gpus" for pid, g in requests.items() if g)
        extra = f" + {reserved:g} for rollout workers (ray.worker_num_gpus)" if reserved else ""
        raise ConfigError(
            f"{keys or 'ray.worker_num_gpus'}: the learners ask for {needed:g} GPU(s) "
            f"({asked or 'none'}{extra}) but {source} has {total:g}; lower the requests "
            "(fractions share a GPU, 0 = CPU)"
        )
