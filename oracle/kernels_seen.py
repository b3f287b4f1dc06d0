"""Which CUDA kernels ran during a block of code, and for how long: one profiling session of Kineto.

A candidate's worker opens one such session per candidate, a fresh process each time. Through
`torch.profiler.profile` the first session of a process took 3.6 s on an H200 (5.8 s beside 14 busy host
processes, as during a run's builds), nearly all of it importing Python modules the session never uses
(`torch._dynamo` among them); through Kineto's own bindings, which that class drives, the same session took
0.015-0.021 s and saw the same kernels (`benchmarks/profiler_start.py`). So this module drives the bindings
itself, and falls back on the class where a torch build lacks them.

Each session begins with `oracle.profiler_head`'s fillers, which are left out of what it saw.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from oracle import profiler_head

# bound when the module is imported, before a candidate's code could replace them (as `oracle.timing` does)
_synchronize = torch.cuda.synchronize
try:
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

    _prepare, _enable, _disable = (torch._C._autograd._prepare_profiler, torch._C._autograd._enable_profiler,
                                   torch._C._autograd._disable_profiler)
    BINDINGS = True
except (ImportError, AttributeError):  # pragma: no cover - a torch build without them: the class instead
    BINDINGS = False


@dataclass
class Seen:
    """The kernels of a session (fillers left out): their names, and their GPU time summed (ms)."""

    names: set[str] = field(default_factory=set)
    gpu_ms: float = 0.0
    fillers: int = 0  # filler kernels the session recorded (each session launches a few: `profiler_head`)
    launched: int = 0  # filler kernels the session launched

    @property
    def blind(self) -> bool:
        """The session recorded no kernel at all, not even the fillers it launched: it cannot say what ran."""
        return self.launched > 0 and not self.fillers and not self.names

    def counts(self) -> list[int]:
        """What the session recorded, for a verdict's record: [kernels, fillers recorded, fillers launched]."""
        return [len(self.names), self.fillers, self.launched]

    def add(self, name: str, duration_us: float) -> None:
        if profiler_head.is_filler(name):
            self.fillers += 1
            return
        self.names.add(name)
        self.gpu_ms += duration_us / 1e3


@contextlib.contextmanager
def kernels_seen() -> Iterator[Seen]:
    """Record the CUDA kernels launched inside the block; the `Seen` is filled when the block ends, after
    the device has finished them. The session leads with `profiler_head`'s throwaway kernels."""
    seen = Seen()
    if not BINDINGS:
        with _through_the_class(seen):
            yield seen
        return
    config, activities = _config()
    _prepare(config, activities)
    _enable(config, activities)
    try:
        seen.launched = profiler_head.lead_with_fillers()
        yield seen
        _synchronize()
    finally:
        result = _disable()
    for event in result.events():
        if _on_the_device(event.device_type()):
            seen.add(event.name(), event.duration_ns() / 1e3)


def start_once() -> None:
    """A session with nothing in it, so that a later one finds the profiler loaded and set up (CUPTI). It
    counts as a session all the same (`oracle.profiler_head`); it launches nothing and waits for nothing, so
    it may run on a thread of its own beside device work."""
    if not BINDINGS:
        from torch.profiler import ProfilerActivity as Activity
        from torch.profiler import profile

        with profile(activities=[Activity.CUDA]):
            profiler_head.session_started()
        return
    config, activities = _config()
    _prepare(config, activities)
    _enable(config, activities)
    try:
        profiler_head.session_started()
    finally:
        _disable()


def _config():
    return (ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig()),
            {ProfilerActivity.CUDA})


@contextlib.contextmanager
def _through_the_class(seen: Seen) -> Iterator[None]:
    from torch.profiler import ProfilerActivity as Activity
    from torch.profiler import profile

    with profile(activities=[Activity.CUDA]) as prof:
        seen.launched = profiler_head.lead_with_fillers()
        yield
        _synchronize()
    for event in prof.events():
        if _on_the_device(getattr(event, "device_type", "")):
            seen.add(event.name, event.time_range.elapsed_us())


def _on_the_device(device_type: object) -> bool:
    return "cuda" in str(device_type).lower()
