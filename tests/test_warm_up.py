"""A candidate's checks never run beside its profiling warm-up: the worker waits for it, as a phase of its own."""

from __future__ import annotations

import multiprocessing
import threading
import time

from oracle.harness import warmed_up
from oracle.protocol import receive


def test_a_warm_up_still_running_is_waited_for_as_its_own_phase():
    ours, theirs = multiprocessing.Pipe()
    release = threading.Event()
    warming = threading.Thread(target=release.wait, daemon=True)
    warming.start()
    threading.Timer(0.3, release.set).start()
    started = time.perf_counter()
    warmed_up(theirs, warming, deadline_s=30.0)
    assert not warming.is_alive()  # the checks start only after it
    assert time.perf_counter() - started >= 0.25
    assert ours.poll(1) and receive(ours) == {"phase": "warm-up", "deadline_s": 30.0}


def test_a_finished_warm_up_costs_no_phase():
    ours, theirs = multiprocessing.Pipe()
    warming = threading.Thread(target=lambda: None)
    warming.start()
    warming.join()
    warmed_up(theirs, warming, deadline_s=30.0)
    assert not ours.poll(0.1)  # a standby worker's: nothing sent, nothing waited for
