"""Cores kept for timing (oracle/cores.py) and workers started on them (oracle/sandbox.py's `placement`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oracle.cores import CorePlan, Placement, group_nice, plan_cores
from oracle.harness import build_entry
from oracle.sandbox import Worker, _descendants, run_to_result

CANDIDATES = Path(__file__).parent / "candidates"
ALLOWED = sorted(os.sched_getaffinity(0))
OWN_NICE = os.getpriority(os.PRIO_PROCESS, 0)
needs_two_cores = pytest.mark.skipif(len(ALLOWED) < 2 or OWN_NICE >= 19,
                                     reason="needs two cores and room to lower the priority")


def test_a_plan_keeps_cores_for_timing_and_gives_builds_the_rest():
    two = plan_cores([0, 1])
    assert two == CorePlan(timing=(1,), builds=(0,)) and two.reserved
    sixteen = plan_cores(range(16), siblings=lambda c: {c})
    assert sixteen.timing == (15,) and sixteen.builds == tuple(range(15))
    assert len(plan_cores(range(64), siblings=lambda c: {c}).timing) == 2
    assert plan_cores(range(8), timing_cores=3, siblings=lambda c: {c}).timing == (5, 6, 7)
    # SMT: the timing core's sibling is kept from the builds too, unless that leaves them nothing
    smt = plan_cores(range(16), siblings=lambda c: {c % 8, c % 8 + 8})
    assert smt.timing == (7, 15) and 7 not in smt.builds and 15 not in smt.builds
    assert plan_cores([0, 8], siblings=lambda c: {c % 8, c % 8 + 8}).timing == (8,)
    one = plan_cores([3])
    assert not one.reserved and one.timing == one.builds == (3,)
    assert plan_cores([0, 1], build_nice=15).for_builds == Placement((0,), 15)
    assert plan_cores([0, 1]).for_timing == Placement((1,), 0)


PROBE = '''
import json, os, subprocess, sys, threading

def here():
    return {"cores": sorted(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0)}

seen = {}
t = threading.Thread(target=lambda: seen.update(thread=here()))
t.start()
t.join()
code = "import json, os; print(json.dumps({'cores': sorted(os.sched_getaffinity(0)), 'nice': os.getpriority(os.PRIO_PROCESS, 0)}))"
child = subprocess.run(["/bin/sh", "-c", f"{sys.executable} -c \\"{code}\\""], capture_output=True, text=True, check=True)
seen.update(worker=here(), grandchild=json.loads(child.stdout))
open("placement.json", "w").write(json.dumps(seen))
'''


def _placement_seen(tmp_path: Path, placement: Placement | None) -> dict:
    """What a build worker (its main thread, a thread, and a process two levels below) reports of its
    cores and niceness."""
    job = {"cache": str(tmp_path), "candidate_path": "probe.py", "build_timeout_s": 60}
    worker = Worker(build_entry, job, files={"probe.py": PROBE}, placement=placement)
    try:
        outcome = run_to_result(worker, close=False)
        assert outcome.result is not None and outcome.result["error_kind"] is None, (outcome, worker.stderr_tail())
        (tmp_path / "group_nice.json").write_text(json.dumps(group_nice(worker.process.pid)))
        return json.loads((worker.dir / "placement.json").read_text())
    finally:
        worker.close()


@needs_two_cores
def test_a_worker_placed_on_a_core_runs_there_niced_and_so_do_its_threads_and_children(tmp_path):
    placement = Placement(cores=(ALLOWED[-1],), nice=min(19, OWN_NICE + 6))
    seen = _placement_seen(tmp_path, placement)
    expected = {"cores": [ALLOWED[-1]], "nice": placement.nice}
    assert seen == {"worker": expected, "thread": expected, "grandchild": expected}
    if group_nice() is not None:  # the worker's own session is its own scheduling group: niced too
        assert json.loads((tmp_path / "group_nice.json").read_text()) == placement.nice
    unplaced = _placement_seen(tmp_path, None)  # the same probe without a placement: every core, our nice
    assert unplaced["grandchild"] == {"cores": ALLOWED, "nice": OWN_NICE}


def _thread_state(pid: int, tid: int) -> tuple[str, int]:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    cores = next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
    nice = int(Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    return cores, nice


HOLDER = '''
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen(["sleep", "60"])
print("ready", child.pid, flush=True)
sys.stdin.read()
child.kill()
'''


@needs_two_cores
def test_a_running_process_is_placed_with_every_thread_and_child(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        word, child = proc.stdout.readline().split()
        assert word == "ready"
        placement = Placement(cores=(ALLOWED[0],), nice=min(19, OWN_NICE + 4))
        ours = group_nice()
        assert placement.apply_to(proc.pid) == []
        pids = [proc.pid, *_descendants(proc.pid)]
        assert int(child) in pids
        states = {(pid, tid): _thread_state(pid, int(tid)) for pid in pids for tid in os.listdir(f"/proc/{pid}/task")}
        assert len(states) >= 3  # the main thread, its sleeping thread, the child
        assert set(states.values()) == {(str(ALLOWED[0]), placement.nice)}, states
        assert group_nice() == ours  # it shares our session's group: that group (ours) is left alone
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_a_placement_never_raises_priority_and_reports_what_it_could_not_do():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.setpriority(os.PRIO_PROCESS, proc.pid, min(19, OWN_NICE + 3))
        assert Placement(cores=None, nice=OWN_NICE + 1).apply_to(proc.pid) == []
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(19, OWN_NICE + 3)  # not made less nice
        assert Placement(cores=(10_000,)).apply_to(proc.pid)  # no such core: reported, not raised
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@needs_two_cores
def test_a_real_build_runs_its_compiler_on_the_build_cores(tmp_path):
    """The C++ compiler a build worker starts (through torch's load_inline and ninja) inherits the
    worker's cores and niceness."""
    placement = Placement(cores=(ALLOWED[0],), nice=min(19, OWN_NICE + 5))
    job = {"cache": str(tmp_path), "candidate_path": "candidate.py", "build_timeout_s": 600}
    worker = Worker(build_entry, job, files={"candidate.py": (CANDIDATES / "leaky_correct.py").read_text()},
                    placement=placement)
    try:
        compiler = None
        deadline = time.monotonic() + 120
        while compiler is None and time.monotonic() < deadline and worker.process.is_alive():
            for pid in _descendants(worker.process.pid):
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "cc1plus":
                        compiler = pid
                except OSError:
                    pass
            time.sleep(0.05)
        assert compiler is not None, "no compiler seen"
        assert _thread_state(compiler, compiler) == (str(ALLOWED[0]), placement.nice)
    finally:
        worker.close()


def _build_sees(tmp_path: Path, reserve: bool) -> dict:
    """What a build worker of an oracle sees of its own placement: the candidate module, imported by the
    build, writes its cores and niceness down (it builds nothing, so this takes a second)."""
    from oracle.evaluate import Oracle, OracleConfig

    seen = tmp_path / f"seen-{reserve}.json"
    source = ("import json, os\n"
              f"json.dump({{'cores': sorted(os.sched_getaffinity(0)), 'nice': os.getpriority(os.PRIO_PROCESS, 0)}}, "
              f"open({str(seen)!r}, 'w'))\n")
    oracle = Oracle(OracleConfig(device="cpu", reserve_timing_cores=reserve, cache_dir=tmp_path / f"cache-{reserve}",
                                 precompiled_headers=False))
    try:
        oracle.builds.build(source, "cpp")
    finally:
        oracle.close()
    return {**json.loads(seen.read_text()), "plan": oracle.cores}


@needs_two_cores
def test_an_oracle_that_reserves_timing_cores_builds_off_them(tmp_path):
    kept = _build_sees(tmp_path, reserve=True)
    plan = kept["plan"]
    assert plan is not None and plan.reserved
    assert kept["cores"] == sorted(plan.builds) and not set(kept["cores"]) & set(plan.timing)
    assert kept["nice"] >= min(19, OWN_NICE + 1)
    free = _build_sees(tmp_path, reserve=False)
    assert free["plan"] is None and free["cores"] == ALLOWED and free["nice"] == OWN_NICE


def test_a_cuda_oracle_reserves_timing_cores_by_default_and_a_cpu_one_does_not():
    from oracle.evaluate import OracleConfig

    assert OracleConfig(device="cuda").reserves_cores and not OracleConfig(device="cpu").reserves_cores
    assert OracleConfig(device="cpu", reserve_timing_cores=True).reserves_cores
    assert not OracleConfig(device="cuda", reserve_timing_cores=False).reserves_cores


@needs_two_cores
def test_the_process_that_times_runs_on_the_timing_cores_and_gets_its_cores_back(tmp_path):
    from oracle.device_quiet import QuietDevice

    plan = plan_cores()
    quiet = QuietDevice("cuda", machine=None, build_placement=plan.for_builds, timing_placement=plan.for_timing)
    job = {"cache": str(tmp_path), "candidate_path": "wait.py", "build_timeout_s": 60}
    timer = Worker(build_entry, job, files={"wait.py": "import time\ntime.sleep(60)\n"})
    try:
        before = os.sched_getaffinity(timer.process.pid)
        assert before == set(ALLOWED)
        with quiet.alone(timer):
            assert os.sched_getaffinity(timer.process.pid) == set(plan.timing)
        assert os.sched_getaffinity(timer.process.pid) == before
        with quiet.alone(None):  # nobody named to time: nothing moved
            assert os.sched_getaffinity(timer.process.pid) == before
    finally:
        timer.close()


def test_a_cuda_oracle_times_on_the_kept_cores_and_a_cpu_one_on_all(tmp_path):
    from oracle.evaluate import Oracle, OracleConfig

    gpu = Oracle(OracleConfig(device="cuda", cache_dir=tmp_path / "gpu"))
    cpu = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cpu", reserve_timing_cores=True))
    try:
        if gpu.cores.reserved:
            assert gpu.quiet.timing_placement == gpu.cores.for_timing
        assert cpu.quiet.timing_placement is None  # a CPU timing needs every core it may use
    finally:
        gpu.close()
        cpu.close()


@needs_two_cores
def test_a_header_maker_runs_on_the_build_cores_at_the_oracles_priority():
    """Builds are niced; the header maker is not: every build after it waits on that one process, and niced
    among the builds it finished only after the next wave of builds had started without it."""
    from oracle.device_quiet import QuietDevice

    plan = plan_cores()
    quiet = QuietDevice("cuda", machine=None, build_placement=plan.for_builds, timing_placement=plan.for_timing)
    maker = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        quiet.header_maker(maker)
        assert os.sched_getaffinity(maker.pid) == set(plan.builds)  # never on the cores kept for timing
        assert os.getpriority(os.PRIO_PROCESS, maker.pid) == OWN_NICE
    finally:
        maker.kill()
        maker.wait()


def test_a_session_leader_placed_while_running_gets_its_group_niced(tmp_path):
    """A process in its own session is its own scheduling autogroup: its threads' nice alone would not make
    it yield to the other groups (a niced build would share a core evenly with the timing worker)."""
    if group_nice() is None or OWN_NICE >= 19:
        pytest.skip("the kernel keeps no scheduling autogroups")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert group_nice(proc.pid) == 0
        assert Placement(cores=None, nice=min(19, OWN_NICE + 7)).apply_to(proc.pid) == []
        assert group_nice(proc.pid) == min(19, OWN_NICE + 7)
    finally:
        proc.kill()
        proc.wait()
