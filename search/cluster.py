"""Joining a Ray cluster and saying what a run would place where on it (`kernelsearch cluster`).

`join_cluster` is how a run reaches a cluster it did not start (`--address HOST:PORT`): it first checks that
something answers at that address (Ray itself would wait minutes on a wrong one), then joins with the
project's packages as the runtime environment, so that no node needs the code on its disk. `cluster_nodes`
reads the live nodes into the placement plan's `NodeShape`s; `cluster_command` prints the plan for a run's
options on them before anything is started.
"""

from __future__ import annotations

import json
import socket
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from search import options as opt
from search.placement import NodeShape, Placement, PlacementError, cluster_runtime_env

NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: pins a placement group to one
REACH_TIMEOUT_S = 5.0


class ClusterError(RuntimeError):
    """The cluster cannot be joined: one line for the user."""


def split_address(address: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as a pair; `ClusterError` for anything else."""
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"--address must be HOST:PORT (the head node's `ray start --head --port`) or auto, not '{address}'")
    return host, int(port)


def reachable(host: str, port: int, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """None when a TCP connection to host:port opens; otherwise why it did not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def join_cluster(address: str, **init_kwargs: Any) -> None:
    """`ray.init` on a running cluster, with the project's packages shipped to its nodes."""
    import ray

    if address != "auto":  # "auto": the cluster `ray start` last started on this machine (Ray finds it)
        host, port = split_address(address)
        why = reachable(host, port)
        if why is not None:
            raise ClusterError(f"no Ray cluster answers at {address} ({why}): start one there with "
                               f"`ray start --head --port {port}`, or check the address")
    try:
        runtime_env = cluster_runtime_env()
    except PlacementError as exc:
        raise ClusterError(str(exc)) from None
    try:
        ray.init(address=address, runtime_env=runtime_env, **init_kwargs)
    except Exception as exc:  # noqa: BLE001 - Ray's reasons vary (version mismatch, authentication): say it in one line
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ClusterError(f"cannot join the Ray cluster at {address}: {first[:300]}") from None


def cluster_nodes() -> list[NodeShape]:
    """The cluster's live nodes, the driver's first, then by address and id (a stable order for the plan)."""
    import ray

    me = ray.get_runtime_context().get_node_id()
    nodes = [NodeShape(n["NodeID"], n.get("NodeManagerAddress", "?"), float(n["Resources"].get("CPU", 0)),
                       float(n["Resources"].get("GPU", 0)), n["NodeID"] == me)
             for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: (not n.driver, n.address, n.node_id))


def placed_here(placement: Placement, node: NodeShape, generator: str) -> list[str]:
    """What a run puts on one node, in words."""
    parts = ["driver"] if node.driver else []
    for k, g in enumerate(placement.generators):
        if g.node == node.node_id:
            gpus = f", {g.num_gpus:g} GPU" if g.num_gpus else ""
            group = f", shares group {g.group}" if g.group is not None else ""
            parts.append(f"generator{f' {k}' if len(placement.generators) > 1 else ''} ({generator}{gpus}{group})")
    for o in placement.oracles:
        if o.node == node.node_id:
            where = f"{o.num_gpus:g} GPU" if o.num_gpus else "CPU"
            share = f", shares group {o.group}" if o.group is not None else ""
            parts.append(f"oracle ({where}{share}, {o.build_slots} build slot{'s' if o.build_slots != 1 else ''})")
    return parts


def plan_table(placement: Placement, generator: str) -> Table:
    table = Table(title="what a run places where", title_justify="left", caption_justify="left")
    for col, justify in (("node", "left"), ("CPUs", "right"), ("GPUs", "right"), ("a run places here", "left")):
        table.add_column(col, justify=justify)
    for node in placement.nodes:
        table.add_row(node.label, f"{node.cpus:g}", f"{node.gpus:g}", ", ".join(placed_here(placement, node, generator)) or "-")
    table.caption = "the oracles time " + ("on the GPUs they hold" if any(o.num_gpus for o in placement.oracles)
                                           else "on their node's CPUs") + (
        "; generation pauses while an oracle times" if placement.shared else "")
    return table


def cluster_command(
    address: Annotated[Optional[str], typer.Option("--address", help="A running Ray cluster (HOST:PORT); default: the local one a run would start.")] = None,
    generator: Annotated[Optional[str], typer.Option("--generator", help="The run's generator (vllm:... takes GPUs; default: one that takes none, as replay: and openai:).")] = None,
    device: opt.Device = "auto",
    gpus: Annotated[Optional[int], typer.Option("--gpus", min=1, help="GPU oracles, as for `run`.")] = None,
    generator_replicas: Annotated[int, typer.Option("--generator-replicas", min=1, help="As for `run`.")] = 1,
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", min=1, help="As for `run`.")] = 1,
    share_generator: Annotated[bool, typer.Option("--share-generator", help="As for `run`.")] = False,
    as_json: opt.Json = False,
) -> None:
    """Show the cluster's nodes and what a run with these options would place on each, starting nothing."""
    from search.cli import console, fail, resolve_device
    from search.generators.base import GeneratorError
    from search.generators.spec import parse_generator_spec
    from search.controller import SearchPlan
    from search.runner import RunSettings, plan_for, start_ray

    dev = resolve_device(device)
    shown = generator.split(":", 1)[0] if generator else "replay or endpoint"
    generator = generator or "replay:-"  # the plan only asks whether the generator needs GPUs
    try:
        parse_generator_spec(generator)
    except GeneratorError as exc:
        fail(str(exc))
    try:
        start_ray(address, dev)
    except ClusterError as exc:
        fail(str(exc))
    settings = RunSettings(generator=generator, strategy="zero-shot", plan=SearchPlan(n=1), device=dev, gpus=gpus,
                           address=address, generator_replicas=generator_replicas,
                           tensor_parallel_size=tensor_parallel_size, share_generator=share_generator)
    try:
        placement = plan_for(settings, cluster_nodes())
    except PlacementError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps({"address": address, "device": dev, "placement": placement.describe()}))
        return
    where = f"the Ray cluster at {address}" if address else "a local Ray cluster (as a run without --address starts)"
    console.print(f"{where}: {len(placement.nodes)} node(s)", highlight=False)
    console.print(plan_table(placement, shown))
