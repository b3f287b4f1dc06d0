"""One CUDA profiling session (oracle.kernels_seen): what it keeps of the records, and what starting it costs
a fresh process. Its device side is in tests/test_oracle_gpu.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oracle.kernels_seen import Seen

ROOT = Path(__file__).resolve().parents[1]


def test_the_fillers_are_counted_apart_from_the_kernels_seen():
    seen = Seen()
    seen.add("at::cuda::(anonymous namespace)::spin_kernel(long)", 3.0)
    seen.add("relu_vec4_kernel(float const*, float*, int)", 1500.0)
    seen.add("relu_vec4_kernel(float const*, float*, int)", 500.0)
    seen.add("spin_kernel", 2.0)
    assert seen.names == {"relu_vec4_kernel(float const*, float*, int)"}
    assert seen.gpu_ms == 2.0
    assert seen.fillers == 2


def test_a_session_that_recorded_not_even_its_fillers_is_blind():
    assert Seen(launched=4).blind and Seen(launched=4).counts() == [0, 0, 4]
    assert not Seen(launched=4, fillers=1).blind  # it recorded something: the call launched no kernel
    assert not Seen(launched=4, names={"k"}).blind
    assert not Seen().blind  # no fillers launched (no session yet): nothing to tell by


def test_starting_the_profiler_imports_none_of_the_compiler_stack():
    """Through `torch.profiler.profile` a process's first session imported `torch._dynamo` and more: 3.6 s
    of every fresh worker on an H200. The bindings this module drives import none of it, and the warm-up
    still counts as a session."""
    code = ("import sys; from oracle import kernels_seen, profiler_head; assert kernels_seen.BINDINGS; "
            "kernels_seen.start_once(); print(profiler_head.sessions(), 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["1", "False"], out.stdout
