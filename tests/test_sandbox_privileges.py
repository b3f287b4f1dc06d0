"""A worker started as root drops every capability before the entry runs (oracle.sandbox)."""

from __future__ import annotations

import os
import sys

import pytest

from oracle.harness import build_entry
from oracle.sandbox import Worker, run_to_result

# A "candidate" that reports the worker's capability sets through the error of its import.
PROBE = '''
fields = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
raise RuntimeError("CAPS " + " ".join(k + "=" + fields[k].strip() for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb", "NoNewPrivs")))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="capabilities are Linux")
@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker has capabilities to drop")
def test_root_worker_has_no_capabilities(tmp_path):
    job = {"cache": str(tmp_path), "candidate_path": "probe.py", "build_timeout_s": 60}
    outcome = run_to_result(Worker(build_entry, job, files={"probe.py": PROBE}))
    assert outcome.result is not None, outcome.crashed or outcome.timed_out_phase
    message = outcome.result["message"]
    assert "CAPS " in message, message
    caps = dict(item.split("=", 1) for item in message.split("CAPS ", 1)[1].split())
    for key in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        assert int(caps[key], 16) == 0, f"{key} is {caps[key]} in the worker"
    assert caps["NoNewPrivs"] == "1"
