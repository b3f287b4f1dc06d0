"""A candidate's checks hold the device only while one of its calls (or its comparison) is in flight: a
timing that asks for the device alone waits for the current call, not for every check to end."""

from __future__ import annotations

import threading
import time

import pytest

from oracle import Oracle, OracleConfig
from oracle.timing import TimingParams
from tasks import Selection, load_tasks

# Right for builtin/1_LeakyReLU_Scale; its second call (check 2) waits until the test lets it return, and
# every call leaves a mark, so the test sees how far the checks got.
GATED = '''
import os
import time
import torch
import torch.nn as nn

GATE = {gate!r}

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:
            open(os.path.join(GATE, "inside"), "w").close()
            while not os.path.exists(os.path.join(GATE, "release")):
                time.sleep(0.005)
        open(os.path.join(GATE, "call%d" % self.calls), "w").close()
        return torch.where(x >= 0, x, x * negative_slope) * scale
'''


def _wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_a_timing_waits_for_the_call_in_flight_not_for_the_whole_check(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    task = load_tasks("builtin", Selection(task_ids=frozenset({"builtin/1_LeakyReLU_Scale"})), 8).tasks[0]
    oracle = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path / "cache", allow_torch=True,
                                 timing=TimingParams(warmup_calls=1, min_calls=3, max_calls=5, target_s=0.05, wall_calls=3)))
    found: dict = {}
    try:
        judged = threading.Thread(target=lambda: found.update(verdict=oracle.evaluate(task, GATED.format(gate=str(gate)), "torch")))
        judged.start()
        _wait_for(lambda: (gate / "inside").exists() or not judged.is_alive(), "check 2's call")
        assert (gate / "call1").exists() and not (gate / "call2").exists(), found

        def timing() -> None:
            with oracle.alone():  # what a timing (another candidate's, a baseline's) asks for
                found["calls_done_when_timed"] = sorted(p.name for p in gate.glob("call*"))
        timer = threading.Thread(target=timing)
        timer.start()
        _wait_for(lambda: oracle.quiet.lock._waiting == 1, "the timing to queue for the device")
        (gate / "release").touch()  # check 2's call returns: the timing goes before check 3
        timer.join(timeout=120)
        judged.join(timeout=300)
    finally:
        (gate / "release").touch()
        oracle.close()
    assert found["calls_done_when_timed"] == ["call1", "call2"]
    v = found["verdict"]
    assert v.status == "correct", v.message
    spent = v.device_s
    assert spent["waiting"] > 0 and spent["compare"] > 0 and spent["checks"] > 0 and spent["timing"] > 0
    assert spent["waiting"] + spent["compare"] + spent["checks"] + spent["timing"] == pytest.approx(v.verify_s + v.time_s)
