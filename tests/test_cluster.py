"""A real Ray cluster: `--address`, an oracle on every node, a node lost mid-run, a driver killed and resumed.

Fast: where a plan puts every actor on made-up clusters of several nodes, how the pool picks an oracle, the
live view's oracles-per-node line, and the one-line errors for an address that is wrong or has no cluster.

Slow: a two-node cluster started here with two `ray start` processes on loopback addresses. Ray on Linux
rewrites 127.0.0.1 to the machine's outward address for a node that joins a cluster, so the head listens on
127.0.0.2 and the second node on 127.0.0.3 (both on `lo`), with a token only this test knows. Each node has
a build cache of its own (`KERNELSEARCH_CACHE`), which is also how a candidate tells where it runs.

The candidates are plain PyTorch (`--allow-torch`: nothing to compile) with a gate at import that the test
opens by creating files: a candidate writes `started.<node>.<name>.<pid>` and, where its rule says so, waits
for a `release-*` file (never longer than HOLD_S). The rules make every step an event the test can wait for,
whatever the order in which the replay generator hands out the completions and Ray answers:

- node b (the one that is lost): the first candidate to arrive passes, every later one waits;
- node a (the driver's node): every candidate waits for `release-a`, so its load only grows, and the pool's
  least-loaded choice sends node b at least two of the first four candidates;
- `late` candidates wait for `release-late` on any node (the driver kill -9).
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from search.placement import NodeShape, PlacementError, plan_placement
from search.pool import pick_oracle
from search.store import SampleRecord, read_samples
from tests.test_search_run import TASK, kernelsearch

ROOT = Path(__file__).resolve().parent.parent
RAY = Path(sys.executable).with_name("ray")
HOLD_S = 240  # a held candidate gives up waiting (below the oracle's 300 s import limit)


# -- placement on several nodes ------------------------------------------------------------------------------


def nodes(*shapes: tuple[float, float]) -> list[NodeShape]:
    """Nodes n0, n1, ... with (cpus, gpus) each; n0 is the driver's."""
    return [NodeShape(f"n{i}", f"10.0.0.{i + 1}", cpus, gpus, driver=i == 0) for i, (cpus, gpus) in enumerate(shapes)]


def on(actors) -> list[str | None]:
    return [a.node for a in actors]


def test_cpu_oracles_one_per_node_and_the_replay_generator_on_the_drivers_node():
    p = plan_placement(device="cpu", nodes=nodes((2, 0), (8, 0), (0, 0)))  # n2 has no CPU for an oracle
    assert on(p.oracles) == ["n0", "n1"] and [o.build_slots for o in p.oracles] == [1, 7]
    assert on(p.generators) == ["n0"] and [n.node_id for n in p.nodes] == ["n0", "n1", "n2"]
    p = plan_placement(device="cpu", nodes=nodes((2, 0), (2, 0)), replicas=2, share=True)
    assert on(p.generators) == ["n0", "n0"] and [o.gate_key for o in p.oracles] == ["all", "all"]
    with pytest.raises(PlacementError, match="no node of the cluster has a CPU"):
        plan_placement(device="cpu", nodes=nodes((0, 0)))


def test_gpu_oracles_on_every_gpu_of_every_node():
    p = plan_placement(device="cuda", nodes=nodes((16, 2), (32, 4)))  # replay: every GPU holds an oracle
    assert sorted(on(p.oracles)) == ["n0", "n0", "n1", "n1", "n1", "n1"] and on(p.generators) == ["n0"]
    assert {o.node: o.build_slots for o in p.oracles} == {"n0": 7, "n1": 7}
    p = plan_placement(device="cuda", oracle_gpus=2, nodes=nodes((16, 4), (16, 4)))  # --gpus 2: one per node
    assert sorted(on(p.oracles)) == ["n0", "n1"]


def test_a_vllm_replica_gets_its_gpus_on_one_node():
    p = plan_placement(device="cuda", generator_gpus=True, nodes=nodes((8, 1), (8, 1)))
    assert not p.shared and len(p.generators) == 1 and len(p.oracles) == 1
    assert on(p.generators) == ["n0"] and on(p.oracles) == ["n1"]  # each has a GPU to itself, the driver's first
    p = plan_placement(device="cuda", generator_gpus=True, tensor_parallel_size=2, nodes=nodes((8, 1), (8, 2), (8, 1)))
    assert on(p.generators) == ["n1"] and sorted(on(p.oracles)) == ["n0", "n2"]
    with pytest.raises(PlacementError, match="needs 2 GPU.s. on one node; the nodes have 1, 1"):
        plan_placement(device="cuda", generator_gpus=True, tensor_parallel_size=2, nodes=nodes((8, 1), (8, 1)))


def test_a_shared_group_is_pinned_to_the_node_of_its_gpus():
    p = plan_placement(device="cuda", generator_gpus=True, nodes=nodes((8, 0), (8, 1)))  # one GPU, on n1
    assert p.shared and p.groups == [1] and p.group_nodes == ["n1"]
    assert on(p.generators) == ["n1"] and on(p.oracles) == ["n1"]
    json.dumps(p.describe())


def test_no_node_is_given_more_gpus_than_it_has():
    shapes = [((8, 1), (8, 1)), ((8, 2), (8, 1)), ((8, 4), (8, 4)), ((8, 0), (8, 3), (8, 1))]
    for shape in shapes:
        cluster = nodes(*shape)
        for tp in (1, 2):
            for k in (None, 1, 2):
                try:
                    p = plan_placement(device="cuda", generator_gpus=True, tensor_parallel_size=tp, oracle_gpus=k, nodes=cluster)
                except PlacementError:
                    continue
                for n in cluster:
                    whole = sum(a.num_gpus for a in p.oracles + p.generators if a.node == n.node_id and a.group is None)
                    groups = sum(size for size, node in zip(p.groups, p.group_nodes) if node == n.node_id)
                    assert whole + groups <= n.gpus, (shape, tp, k)


def test_oracles_are_held_to_their_node_and_generators_prefer_theirs():
    from search.placement import ActorPlacement
    from search.pool import actor_options

    n0, n1 = "0a" * 28, "1b" * 28  # Ray node ids are hex
    oracle = actor_options(ActorPlacement(0.0, node=n1), [])["scheduling_strategy"]
    generator = actor_options(ActorPlacement(1.0, node=n0), [], hard_node=False)
    assert (oracle.node_id, oracle.soft) == (n1, False)
    assert generator["num_gpus"] == 1.0 and (generator["scheduling_strategy"].node_id, generator["scheduling_strategy"].soft) == (n0, True)
    assert "scheduling_strategy" not in actor_options(ActorPlacement(0.0), [])  # a plan without nodes: Ray decides


def test_the_pool_picks_the_least_loaded_oracle_in_turn():
    assert pick_oracle([0, 0], [True, True], last=-1) == 0
    assert pick_oracle([0, 0], [True, True], last=0) == 1  # finished before the next arrived: still in turn
    assert pick_oracle([1, 0, 0], [True, True, True], last=1) == 2
    assert pick_oracle([0, 3], [False, True], last=1) == 1  # a lost oracle gets nothing
    assert pick_oracle([0, 0], [False, False], last=0) is None
    assert pick_oracle([1, 1], [True, True], last=0, prefer=0) == 0  # a re-timing goes where it was built
    assert pick_oracle([2, 1], [True, True], last=0, prefer=0) == 1  # unless that oracle is busier


def test_the_live_view_counts_oracles_per_node():
    from rich.console import Console

    from search.progress import RunProgress

    progress = RunProgress(Console(file=open(os.devnull, "w")), [], 0, [])
    progress.pool = [{"node_label": "10.0.0.1 (aaaaaa)", "timing": 1, "device_slots": 1},
                     {"node_label": "10.0.0.2 (bbbbbb)", "dead": True, "lost": True}]
    assert progress.nodes_text() == "oracles per node: 10.0.0.1 (aaaaaa) 1, 10.0.0.2 (bbbbbb) 0 (lost)"
    assert progress.pool_text().endswith("1 lost with their node") and "restarting" not in progress.pool_text()
    progress.pool = progress.pool[:1]
    assert progress.nodes_text() is None  # one node: nothing to split


def test_a_wrong_address_is_one_line():
    from search.cluster import ClusterError, join_cluster, split_address

    assert split_address("10.0.0.2:6379") == ("10.0.0.2", 6379) and split_address("[::1]:10001") == ("::1", 10001)
    for bad in ("10.0.0.2", "host:port", ":6379", "h:0"):
        with pytest.raises(ClusterError, match="HOST:PORT.* or auto"):
            split_address(bad)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClusterError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        join_cluster(f"127.0.0.1:{port}")
    res = kernelsearch("cluster", "--address", "nowhere")
    assert res.returncode == 2 and "HOST:PORT" in res.stderr and "Traceback" not in res.stderr


# -- a two-node cluster on this machine -----------------------------------------------------------------------


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process goes, however it goes (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Node:
    name: str  # "a" (head, the driver's) or "b"
    ip: str
    process: subprocess.Popen
    log: Path
    cache: Path

    def raylet_pid(self) -> int:
        import psutil

        raylets = [p for p in psutil.Process(self.process.pid).children() if p.name() == "raylet"]
        assert len(raylets) == 1, f"node {self.name}: raylets {raylets}"
        return raylets[0].pid


@dataclass
class LocalCluster:
    """`ray start --block` per node: a node is its process, and stopping the process stops the node."""

    root: Path
    env: dict[str, str]
    address: str = ""
    nodes: dict[str, Node] = field(default_factory=dict)

    def start_node(self, name: str, ip: str, head: bool) -> Node:
        """Start a node's `ray start` (a second node retries until the head answers); `wait_joined` waits."""
        cache = self.root / f"node-{name}"
        cache.mkdir()
        args = [str(RAY), "start", "--block", "--node-ip-address", ip, "--num-cpus", "2",
                "--resources", json.dumps({f"node_{name}": 1}), "--temp-dir", str(self.root / "ray"),
                "--disable-usage-stats", "--dashboard-agent-listen-port", str(free_port(ip))]
        if head:
            port = free_port(ip)
            self.address = f"{ip}:{port}"
            args += ["--head", "--port", str(port), "--include-dashboard", "false",
                     "--dashboard-port", str(free_port(ip)), "--ray-client-server-port", str(free_port(ip))]
        else:
            args += ["--address", self.address]
        log = self.root / f"node-{name}.log"
        env = {**self.env, "KERNELSEARCH_CACHE": str(cache)}
        env.pop("PYTHONPATH", None)  # the code reaches the nodes through the run's runtime environment
        with open(log, "w") as stdout:
            process = subprocess.Popen(args, stdout=stdout, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                       start_new_session=True, preexec_fn=_die_with_parent)
        node = self.nodes[name] = Node(name, ip, process, log, cache)
        return node

    def wait_joined(self) -> None:
        for node in self.nodes.values():  # `ray start --block` says so once its node is registered
            wait_for(lambda: "block forever" in node.log.read_text(), 120, f"node {node.name} to join",
                     processes=[node.process], log=node.log)

    def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            if node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes.values():
            try:
                node.process.wait(60)
            except subprocess.TimeoutExpired:  # its children share its fate (Ray's prctl on Linux)
                node.process.kill()
                node.process.wait(30)


def wait_for(condition, timeout: float, what: str, processes=(), log: Path | None = None):
    """Poll `condition` until it holds; fail at once when a process it depends on has exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        gone = [p for p in processes if p.poll() is not None]
        if gone or time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            pytest.fail(f"waiting for {what}: " + (f"process exited {gone[0].returncode}" if gone else f"not within {timeout:.0f} s")
                        + f"\n{tail}")
        time.sleep(0.2)


@pytest.fixture
def cluster():
    for ip in ("127.0.0.2", "127.0.0.3"):
        try:
            free_port(ip)
        except OSError:
            pytest.skip(f"{ip} is not a loopback address here")
    root = Path(tempfile.mkdtemp(prefix="ksc", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16), RAY_ADDRESS="",
               RAY_health_check_period_ms="1000", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    c = LocalCluster(root, env)
    try:
        c.start_node("a", "127.0.0.2", head=True)
        c.start_node("b", "127.0.0.3", head=False)
        c.wait_joined()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


HOLDING = '''# {name}: plain PyTorch, {verdict}; held at import while the test says so
import os
import pathlib
import time

import torch
import torch.nn as nn

GATES = pathlib.Path({gates!r})
NAME = {name!r}


def _hold():
    node = pathlib.Path(os.environ.get("KERNELSEARCH_CACHE", "?")).name.removeprefix("node-")
    (GATES / f"started.{{node}}.{{NAME}}.{{os.getpid()}}").touch()
    gate = None
    if NAME.startswith("late"):
        gate = "release-late"
    elif node == "a":
        gate = "release-a"
    elif node == "b":
        first = GATES / "b-first"
        try:
            with open(first, "x") as f:
                f.write(NAME)
        except FileExistsError:
            pass
        if first.read_text() != NAME:
            gate = "release-b"
    deadline = time.monotonic() + {hold_s}
    while gate and not (GATES / gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


_hold()


class ModelNew(nn.Module):
    def __init__(self, negative_slope, scale):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x):
        return torch.where(x >= 0, x, x * {slope}) * self.scale
'''


def write_completions(path: Path, gates: Path, names: list[str]) -> dict[str, str]:
    """A replay file: a name with `wrong` in it uses the wrong slope, `prose` has no code, the others are correct.
    Returns name -> the verdict each must get."""
    expected = {}
    with open(path, "w") as f:
        for name in names:
            if name == "prose":
                text, expected[name] = "No kernel today, sorry.", "no_code"
            else:
                wrong = "wrong" in name
                expected[name] = "incorrect" if wrong else "correct"
                code = HOLDING.format(name=name, verdict=expected[name], gates=str(gates), hold_s=HOLD_S,
                                      slope="0.5" if wrong else "self.negative_slope")
                text = f"```python\n{code}```\n"
            f.write(json.dumps({"task": TASK, "completion": text, "tokens": 10}) + "\n")
    return expected


def records(run: Path) -> list[SampleRecord]:
    """The run's complete records (a line being written while the test reads is not one yet)."""
    path = run / "samples.jsonl"
    return read_samples(path) if path.exists() else []


def name_of(record: SampleRecord) -> str:
    text = record.completion
    return text.split(":", 1)[0].removeprefix("```python\n# ") if text.startswith("```") else "prose"


def started(gates: Path, node: str) -> set[str]:
    return {p.name.split(".")[2] for p in gates.glob(f"started.{node}.*")}


def start_run(drivers: list[subprocess.Popen], log: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """`kernelsearch run` on the test task with CPU oracles and plain-PyTorch candidates, in the background."""
    with open(log, "w") as stdout:
        run = subprocess.Popen([sys.executable, "-m", "search.cli", "run", "--device", "cpu", "--tasks", TASK,
                                "--max-input-mb", "0.25", "--allow-torch", "--no-early-stop", *args],
                               cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)
    drivers.append(run)
    return run


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_run_on_two_nodes_loses_one_then_a_killed_driver_resumes(cluster, tmp_path):
    env = {**cluster.env, "KERNELSEARCH_CACHE": str(tmp_path / "driver-cache")}
    gates = tmp_path / "gates"
    gates.mkdir()
    drivers: list[subprocess.Popen] = []
    try:
        # What a run would place where: an oracle on each node, the generator and the driver on the head.
        res = kernelsearch("cluster", "--address", cluster.address, "--device", "cpu", "--json", env=env, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        plan = json.loads(res.stdout)["placement"]
        node_of = {n["address"]: n["node_id"] for n in plan["nodes"]}
        a, b = node_of["127.0.0.2"], node_of["127.0.0.3"]
        assert [n["driver"] for n in plan["nodes"]] == [True, False]
        assert [o["node"] for o in plan["oracles"]] == [a, b] and [g["node"] for g in plan["generators"]] == [a]

        # 1. A run over both nodes; node b's raylet is killed while it holds a sample.
        # Two correct kernels, so that the best is re-timed (a task's only one keeps its verdict, oracle rule 18).
        expected = write_completions(tmp_path / "lost.jsonl", gates, ["ok1", "wrong1", "ok2", "wrong3", "wrong4", "prose"])
        out = tmp_path / "lost"
        log = tmp_path / "lost.out"
        run = start_run(drivers, log, env, "--address", cluster.address, "--generator", f"replay:{tmp_path / 'lost.jsonl'}",
                        "-n", "6", "--out", str(out))
        wait_for(lambda: any(r.node == b for r in records(out)), 240,
                 "a sample judged on node b", [run], log)
        first_b = (gates / "b-first").read_text()
        wait_for(lambda: started(gates, "b") - {first_b}, 120, "node b to hold a second sample", [run], log)
        held_on_b = started(gates, "b") - {first_b}
        os.kill(cluster.nodes["b"].raylet_pid(), signal.SIGKILL)
        (gates / "release-a").touch()
        assert run.wait(240) == 0, log.read_text()[-4000:]

        rows = records(out)
        assert sorted((r.round, r.sample_index) for r in rows) == [(0, i) for i in range(6)]  # every sample, once
        assert {name_of(r): r.status for r in rows} == expected
        judged = [r for r in rows if r.status != "no_code"]
        assert {r.node for r in judged} == {a, b}  # judged on both nodes
        by_name = {name_of(r): r for r in rows}
        assert by_name[first_b].node == b and "node_lost_retried" not in by_name[first_b].flags
        retried = {name_of(r) for r in rows if "node_lost_retried" in r.flags}
        assert held_on_b <= retried and {r.node for r in judged if name_of(r) != first_b} == {a}
        best = json.loads((out / "best" / "builtin__1_LeakyReLU_Scale.json").read_text())
        assert best["status"] == "correct" and best["retimed"] and best["node"] == a  # re-timed where a node was left

        # 2. A second run on what is left of the cluster; its driver is killed -9 while a sample is held.
        expected = write_completions(tmp_path / "killed.jsonl", gates, ["latewrong", "wrong5", "prose"])
        out = tmp_path / "killed"
        log = tmp_path / "killed.out"
        run = start_run(drivers, log, env, "--address", cluster.address, "--generator", f"replay:{tmp_path / 'killed.jsonl'}",
                        "-n", "3", "--out", str(out))
        wait_for(lambda: started(gates, "a") & {"latewrong"} and records(out), 240,
                 "the late sample held and one sample recorded", [run], log)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(30)
        before = records(out)
        assert 1 <= len(before) < 3 and "latewrong" not in {name_of(r) for r in before}
        (gates / "release-late").touch()
        res = kernelsearch("run", "--resume", str(out), "--address", cluster.address, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-4000:]
        after = records(out)
        assert after[: len(before)] == before
        assert sorted((r.round, r.sample_index) for r in after) == [(0, i) for i in range(3)]
        assert {name_of(r): r.status for r in after} == expected
        assert {r.node for r in after if r.status != "no_code"} == {a}
    finally:
        for gate in ("release-a", "release-b", "release-late"):  # no held candidate outlives the test
            (gates / gate).touch()
        for proc in drivers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
