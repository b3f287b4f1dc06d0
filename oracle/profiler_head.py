"""Kernel records the CUDA profiler loses at the start of a session, and what takes their place.

CUPTI from CUDA 12.6 update 2 up to 13.0 corrupts the timestamps of the first kernel records of a profiling
session when its timestamp callback is registered again, which Kineto does once per session: in a process's
k-th session, the first k kernel records (pytorch/pytorch#192021, fixed in CUDA 13.1's CUPTI). The profiler
then drops them. A call whose only kernel came first looked as if it had run none: on an H200 a correct
ReLU candidate was rejected once with "none of the candidate's __global__ kernels ran".

So a session begins with more throwaway kernels than the process has had sessions (`torch.cuda._sleep`,
a few cycles each), and what the session saw leaves them out (`is_filler`).
"""

from __future__ import annotations

import threading

import torch

FILLER_KERNEL = "spin_kernel"  # the kernel of torch.cuda._sleep
SPARE_FILLERS = 2  # beyond the sessions counted, in case the profiler counted one more than this module
_sessions = 0
_lock = threading.Lock()
# bound when the module is imported, before a candidate's code could replace them (as `oracle.timing` does)
_sleep, _synchronize = torch.cuda._sleep, torch.cuda.synchronize


def session_started() -> int:
    """Count a profiling session of this process (every one counts, a warm-up too); its number."""
    global _sessions
    with _lock:
        _sessions += 1
        return _sessions


def sessions() -> int:
    """This process's profiling sessions so far."""
    with _lock:
        return _sessions


def lead_with_fillers() -> int:
    """First thing inside a CUDA profiling session: count it, launch the fillers whose records may be lost
    in its place, and wait for them. How many were launched."""
    n = session_started() + SPARE_FILLERS
    for _ in range(n):
        _sleep(1)
    _synchronize()
    return n


def is_filler(name: str) -> bool:
    """A kernel record of `lead_with_fillers`, not of the call profiled."""
    return FILLER_KERNEL in name
