"""Workers start with what the fork server imported (`oracle.preload`), not importing it again."""

from __future__ import annotations

import multiprocessing.forkserver as forkserver
import sys

import pytest

from oracle import preload
from oracle.harness import build_entry
from oracle.sandbox import Worker, run_to_result

# Raised by the "candidate" at its build, so that its message carries what its process had imported at its start.
PROBE = '''
import sys
raise RuntimeError("LOADED " + " ".join(name for name in {names!r} if name in sys.modules))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is POSIX")
def test_a_worker_starts_with_the_modules_the_fork_server_imported(tmp_path):
    job = {"cache": str(tmp_path), "candidate_path": "probe.py", "build_timeout_s": 60}
    probe = PROBE.format(names=list(preload.MODULES) + ["torch._inductor.compile_fx"])
    outcome = run_to_result(Worker(build_entry, job, files={"probe.py": probe}))
    assert outcome.result is not None, outcome.crashed or outcome.timed_out_phase
    loaded = outcome.result["message"].split("LOADED", 1)[1].split()
    assert set(preload.MODULES) <= set(loaded), outcome.result["message"]
    assert "torch._inductor.compile_fx" not in loaded  # the control: what no one imported before the candidate
    assert forkserver._forkserver._forkserver_pid  # they came from the fork server, not from this process
