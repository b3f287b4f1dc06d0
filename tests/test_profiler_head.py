"""The fillers that take the place of a profiling session's lost first kernel records (oracle.profiler_head):
counted per process, and left out of what a session saw. Their device side is in tests/test_oracle_gpu.py."""

from __future__ import annotations

from oracle import profiler_head


def test_every_session_of_the_process_is_counted():
    first = profiler_head.session_started()
    second = profiler_head.session_started()
    assert second == first + 1  # the k-th session of a process may lose its first k kernel records


def test_the_fillers_are_told_apart_from_the_calls_kernels_by_name():
    assert profiler_head.is_filler("at::cuda::(anonymous namespace)::spin_kernel(long)")
    assert profiler_head.is_filler("spin_kernel")
    assert not profiler_head.is_filler("relu_vec4_kernel(float const*, float*, int)")
    assert not profiler_head.is_filler("void at::native::vectorized_elementwise_kernel<4, ...>")
