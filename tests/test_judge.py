"""The judging rules as pure functions (oracle/judge.py) and the hand-over of outputs (oracle/shared_tensors.py),
without any worker process."""

from __future__ import annotations

import json
import os

import pytest
import torch

from oracle import judge
from oracle.protocol import Checked, OutputsReady, WorkerResult
from oracle.shared_tensors import SharedTensor, ShareError, export_tensor, import_tensor


def checked(**kw) -> Checked:
    return Checked(**{"own_calls": 3, "ops": ["aten::empty"], "kernels": ["k_relu"], "extensions": ["e"],
                      "compiled_now": False, **kw})


def test_outputs_within_tolerance_pass_and_a_wrong_element_is_named():
    ref = [torch.randn(32, 32)]
    assert judge.judge_outputs([ref[0] + 1e-6], ref, "check 1 of 6").problem is None
    bad = ref[0].clone()
    bad[2, 3] += 1.0
    message = judge.judge_outputs([bad], ref, "check 1 of 6").problem
    assert message.startswith("check 1 of 6: output: 1 of 1024 elements wrong") and "at [2, 3]" in message
    assert "forward returned 2 output(s), expected 1" in judge.judge_outputs([bad, bad], ref, "check 2 of 6").problem


def test_a_later_call_changing_an_earlier_output_is_caught():
    first = [torch.tensor([1.0, float("nan")])]
    assert judge.unchanged(first, [torch.tensor([1.0, float("nan")])])
    assert not judge.unchanged(first, [torch.tensor([2.0, float("nan")])])


def test_own_kernel_rules():
    source = "__global__ void relu_kernel(float* x) {}"
    other = judge.own_kernel_problem("cuda", source, checked(), ["aten::relu"])  # k_relu is not relu_kernel
    assert other is not None and "(the profiled call ran 1 kernels: k_relu; its sessions recorded nothing)" in other
    none = judge.own_kernel_problem("cuda", source, checked(kernels=[], profile_sessions=[[0, 4, 4]]), [])
    assert "(the profiled call ran 0 kernels; its sessions recorded 0 kernels, 4 of 4 fillers)" in none
    assert judge.own_kernel_problem("cuda", source, checked(kernels=["void relu_kernel(float*)"]), ["aten::relu"]) is None
    assert "never called" in judge.own_kernel_problem("cpp", "", checked(own_calls=0), ["aten::relu"])
    fallback = judge.own_kernel_problem("cpp", "", checked(ops=["aten::relu", "aten::mul"]), ["aten::relu", "aten::mul"])
    assert "still calls every PyTorch operator" in fallback


def test_a_blind_profiler_does_not_reject_but_the_operator_rule_still_holds():
    """Sessions that recorded nothing, not even their own fillers, cannot say which kernels ran: the
    kernel-name rule is skipped rather than a correct kernel rejected; calling every operator of the
    reference is still caught at the dispatcher."""
    source = "__global__ void relu_kernel(float* x) {}"
    blind = {"kernels": [], "kernels_unseen": True, "profile_sessions": [[0, 0, 4]] * 3}
    assert judge.own_kernel_problem("cuda", source, checked(**blind), ["aten::relu"]) is None
    fallback = judge.own_kernel_problem("cuda", source, checked(ops=["aten::relu"], **blind), ["aten::relu"])
    assert "still calls every PyTorch operator" in fallback
    assert "never called" in judge.own_kernel_problem("cuda", source, checked(own_calls=0, **blind), ["aten::relu"])


def test_a_worker_can_report_failures_only():
    assert judge.worker_failure({"status": "incorrect", "message": "x"}) == ("incorrect", "x")
    status, message = judge.worker_failure({"status": "correct"})
    assert status == "runtime_error" and "unexpected result" in message
    assert judge.worker_failure("garbage")[0] == "runtime_error"


def timing(median: float, wall: float | None = None) -> dict:
    return {"median_ms": median, "wall_ms": wall if wall is not None else median, "external_ms": None}


def test_score_correct_with_speedup_and_flags():
    fields = judge.score(timing(1.0), {"median_ms": 2.0, "wall_ms": 2.0}, None, [], kernel_ms=0.9)
    assert fields["status"] == "correct" and fields["speedup_vs_eager"] == pytest.approx(2.0)
    assert "launch_bound" not in fields["flags"] and "2.00x eager" in fields["message"]
    launch = judge.score(timing(1.0), {"median_ms": 2.0, "wall_ms": 2.0}, None, [], kernel_ms=0.1)
    assert "launch_bound" in launch["flags"] and launch["timing"]["gpu_busy_fraction"] == pytest.approx(0.1)


def test_a_call_whose_launches_take_longer_than_its_gpu_work_is_launch_bound():
    """The events see a call's GPU work (0.9 of its 1 ms); issued back to back, each call takes 3 ms of the
    wall clock, as eager's do (so the clocks do not disagree): the GPU is busy 30% of the time."""
    fields = judge.score(timing(1.0, wall=3.0), {"median_ms": 2.0, "wall_ms": 6.0}, None, [], kernel_ms=0.9)
    assert "wall_clock_disagrees" not in fields["flags"] and fields["time_ms"] == 1.0
    assert "launch_bound" in fields["flags"] and fields["timing"]["gpu_busy_fraction"] == pytest.approx(0.3)


def test_score_falls_back_to_the_wall_clock_and_rejects_below_the_floor():
    missed = judge.score(timing(0.1, wall=1.0), {"median_ms": 1.0, "wall_ms": 1.0}, None, [])
    assert "wall_clock_disagrees" in missed["flags"] and missed["time_ms"] == 1.0
    floor = {"sol_ms": 0.5, "bytes": 1e6, "flops": 1e9}
    fast = judge.score(timing(0.1), {"median_ms": 1.0, "wall_ms": 1.0}, floor, [])
    assert fast["status"] == "rejected" and "below_floor" in fast["flags"]


def held(median: float, wall: float, external: float, drains: tuple[float | None, float | None]) -> dict:
    """A GPU timing whose two wall-clock blocks' final synchronises waited `drains` ms for the GPU."""
    return {"median_ms": median, "wall_ms": wall, "external_ms": external,
            "wall_drain_ms": drains[0], "external_drain_ms": drains[1]}


def test_a_busy_hosts_slow_launches_are_not_work_the_events_missed():
    """Beside 15 builds on an H200, a launch-bound kernel's events said 0.0207 ms in five fresh processes and
    its wall clocks 0.04-0.08 ms, the host issuing more slowly than the GPU worked: each block's GPU had
    caught up by its last launch, and its profiled kernels took 0.008 ms. Scored by its events, flagged."""
    eager = {"median_ms": 0.024, "wall_ms": 0.026, "external_ms": 0.027}
    fields = judge.score(held(0.0207, 0.0745, 0.0694, (0.02, 0.03)), eager, None, [], kernel_ms=0.008)
    assert "wall_clock_disagrees" not in fields["flags"] and fields["time_ms"] == 0.0207
    assert "launch_bound" in fields["flags"]


def test_work_the_events_miss_still_shows_whatever_the_host():
    """Another stream's work leaves the GPU behind at the end of a block (a long final wait), or, on a host
    too slow for the GPU to fall behind, shows in the profiled call's kernels: either way the wall clock."""
    eager = {"median_ms": 1.0, "wall_ms": 1.0, "external_ms": 1.0}
    behind = judge.score(held(0.01, 1.0, 1.0, (0.02, 15.0)), eager, None, [], kernel_ms=0.005)
    assert "wall_clock_disagrees" in behind["flags"] and behind["time_ms"] == 1.0
    profiled = judge.score(held(0.01, 1.0, 1.0, (0.02, 0.02)), eager, None, [], kernel_ms=0.9)
    assert "wall_clock_disagrees" in profiled["flags"] and profiled["time_ms"] == 1.0
    unprofiled = judge.score(held(0.01, 1.0, 1.0, (0.02, 0.02)), eager, None, [], kernel_ms=None)
    assert "wall_clock_disagrees" in unprofiled["flags"]
    cpu = judge.score(held(0.01, 1.0, 1.0, (None, 0.02)), eager, None, [], kernel_ms=0.005)  # no drain: a CPU
    assert "wall_clock_disagrees" in cpu["flags"]


def test_the_compile_baseline_arrives_later():
    fields = judge.score(timing(1.0), {"median_ms": 2.0, "wall_ms": 2.0}, None, [])
    both = judge.with_compile_baseline(fields, {"median_ms": 4.0}, None)
    assert both["speedup_vs_compile"] == pytest.approx(4.0) and "4.00x torch.compile" in both["message"]
    failed = judge.with_compile_baseline(fields, None, "inductor failed")
    assert failed["compile_ms"] is None and failed["timing"]["compile_error"] == "inductor failed"


def test_records_round_trip_through_json_and_refuse_malformed_ones():
    ready = OutputsReady("check", 0, [None])
    assert OutputsReady.from_json(json.loads(json.dumps(ready.to_json()))) == ready
    assert WorkerResult.from_json({"status": "timed", "extra": 1}).status == "timed"
    with pytest.raises(ValueError):
        OutputsReady.from_json({"kind": "check"})
    with pytest.raises(ValueError):
        Checked.from_json(["not", "an", "object"])


def test_cpu_outputs_round_trip_through_a_memory_file(tmp_path):
    t = torch.randn(6, 10)[:, 2:7]  # a non-contiguous view
    t[0, 0] = float("nan")
    desc = SharedTensor.from_json(json.loads(json.dumps(export_tensor(t, tmp_path, 3).to_json())))
    back = import_tensor(desc, tmp_path)
    assert back.shape == t.shape and torch.equal(back.nan_to_num(0), t.nan_to_num(0))
    for dtype in (torch.int64, torch.bool, torch.bfloat16):
        x = (torch.arange(7) % 2).to(dtype)
        assert torch.equal(import_tensor(export_tensor(x, tmp_path, 4), tmp_path), x)


def test_an_output_the_device_has_no_room_to_copy_is_copied_to_the_host(tmp_path, monkeypatch):
    """A full device (other processes' memory) is the oracle's problem, not the candidate's: the copy is
    taken on the host, still a copy and still checked against the live memory."""
    t = torch.randn(6, 10)[:, 2:7]
    desc = export_tensor(t, tmp_path, 5)
    calls = []

    def no_room(self, *args, **kwargs):
        calls.append(self.shape)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")

    monkeypatch.setattr(torch.Tensor, "clone", no_room)
    try:
        back = import_tensor(desc, tmp_path)
    finally:
        monkeypatch.undo()  # before any report of a failure, which may clone
    assert calls == [t.shape]  # the device copy was tried first
    assert back.device.type == "cpu" and torch.equal(back, t)
    back.fill_(0)  # a copy: the live memory is not changed through it
    assert torch.equal(import_tensor(desc, tmp_path), t)


def test_a_failed_copy_leaves_no_view_of_the_closed_mapping_behind(tmp_path, monkeypatch):
    """Whatever fails while an output is copied, the error's traceback holds no view of the memory file's
    mapping, which is closed on the way out: a look at such a view (a report, a debugger) would read
    unmapped memory and crash the oracle."""
    t = torch.randn(64, 64)
    desc = export_tensor(t, tmp_path, 6)

    def broken(self, *args, **kwargs):
        raise RuntimeError("the copy failed")

    monkeypatch.setattr(torch.Tensor, "clone", broken)
    try:
        with pytest.raises(RuntimeError, match="the copy failed") as caught:
            import_tensor(desc, tmp_path)
    finally:
        monkeypatch.undo()
    frames, tb = [], caught.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    left = [name for f in frames for name, value in f.f_locals.items() if isinstance(value, torch.Tensor)]
    assert "live" not in left and frames, left


def test_hostile_descriptors_are_refused(tmp_path):
    good = export_tensor(torch.ones(4), tmp_path, 0).to_json()
    for bad in ({**good, "file": "../../etc/passwd"}, {**good, "dtype": "object"}, {**good, "shape": [-1]},
                {**good, "ipc": {"device": 0}}, {**good, "file": None}, "not a dict"):
        with pytest.raises(ShareError):
            SharedTensor.from_json(bad)
    too_far = SharedTensor.from_json({**good, "shape": [400]})
    with pytest.raises(ShareError, match="past its storage"):
        import_tensor(too_far, tmp_path)
    os.symlink("/etc/hostname", tmp_path / "o_9.bin")  # a link to a file the oracle can read
    linked = SharedTensor.from_json({**good, "file": "o_9.bin"})
    with pytest.raises(ShareError):
        import_tensor(linked, tmp_path)


def _exact(out, ref, correction=None, scale=None):
    from oracle import compare as module
    quick, module._clear_pass = module._clear_pass, lambda *args: None
    try:
        return module.compare(out, ref, correction=correction, scale=scale)
    finally:
        module._clear_pass = quick


def _same_figures(quick, exact):
    assert quick.ok == exact.ok and quick.passes == exact.passes
    q, e = quick.figures, exact.figures
    assert q.max_abs == pytest.approx(e.max_abs) and q.max_rel == pytest.approx(e.max_rel)
    for name in (q.rel_l2_64, e.rel_l2_64), (q.ref32_rel_l2_64, e.ref32_rel_l2_64):
        assert (name[0] is None) == (name[1] is None) and (name[0] is None or name[0] == pytest.approx(name[1], rel=1e-4))
    assert set(q.over_bound) == set(e.over_bound)
    for policy in e.over_bound:
        assert q.over_bound[policy] == pytest.approx(e.over_bound[policy], rel=1e-4, abs=1e-12)


def test_the_quick_comparison_gives_the_exact_numeric_figures_for_a_clear_pass():
    """With a float64 reference: a matmul summed in another order passes `numeric` clearly, on both paths."""
    from oracle.compare import _clear_pass, compare
    from oracle.tolerance import Float64Scale

    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(64, 512, generator=g), torch.randn(512, 32, generator=g)
    ref = a @ b
    ref64 = a.double() @ b.double()
    correction = (ref64 - ref.double()).float()
    scale = Float64Scale(float(torch.linalg.vector_norm(ref64 - ref.double()) / torch.linalg.vector_norm(ref64)),
                         float((ref64 - ref.double()).abs().max() / ref64.abs().max()))
    out = (a.double().flip(1) @ b.double().flip(0)).float()  # another summation order, rounded to float32
    assert _clear_pass(out, ref, correction, scale) is not None
    _same_figures(compare(out, ref, correction=correction, scale=scale), _exact(out, ref, correction, scale))
    lower = out.bfloat16().float()  # lower precision: numeric fails, so the exact path decides
    assert _clear_pass(lower, ref, correction, scale) is None
    assert compare(lower, ref, correction=correction, scale=scale).passes == _exact(lower, ref, correction, scale).passes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_quick_comparison_gives_the_exact_figures_for_a_clear_pass(dtype):
    from oracle.compare import _clear_pass, compare
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(4096, generator=g).to(dtype)
    ref[::7] = 0  # elements where the relative error is left out
    out = (ref.float() * (1 + 1e-6 * torch.randn(4096, generator=g))).to(dtype)
    assert _clear_pass(out, ref) is not None  # taken: finite and far within every bound
    quick, exact = compare(out, ref), _exact(out, ref)
    assert quick.ok
    _same_figures(quick, exact)


@pytest.mark.parametrize("case", ["near_bound", "over_bound", "nan", "inf_in_both", "tiny_values"])
def test_outputs_near_or_over_a_bound_or_not_finite_take_the_exact_comparison(case):
    from oracle.compare import _clear_pass, compare
    ref = torch.linspace(-2, 2, 1000)
    out = ref.clone()
    if case == "near_bound":
        out[10] += 0.995e-4 * (1 + ref[10].abs())  # within kernelbench's bound by less than the margin
    elif case == "over_bound":
        out[10] += 1e-3
    elif case == "nan":
        out[10] = float("nan")
    elif case == "inf_in_both":
        ref[10] = out[10] = float("inf")
    else:  # every element within atol of tiny values, but 50% off: the relative L2 guard's case
        ref = torch.full((1000,), 1e-6)
        out = ref * 1.5
    assert _clear_pass(out, ref) is None
    assert compare(out, ref).passes == _exact(out, ref).passes


@pytest.mark.parametrize("case", ["clear", "nan_in_last_piece", "over_bound_in_a_middle_piece"])
def test_the_quick_comparison_in_pieces_gives_the_figures_of_the_whole(monkeypatch, case):
    """Large outputs are compared piece by piece (bounded temporaries); peaks and norms combine to the same
    figures as one pass, and a NaN or a bad value in any piece still sends the output to the exact path."""
    from oracle import compare as module
    from oracle.tolerance import Float64Scale

    g = torch.Generator().manual_seed(11)
    a, b = torch.randn(40, 256, generator=g), torch.randn(256, 50, generator=g)  # 2000 elements
    ref = a @ b
    ref64 = a.double() @ b.double()
    correction = (ref64 - ref.double()).float()
    scale = Float64Scale(float(torch.linalg.vector_norm(ref64 - ref.double()) / torch.linalg.vector_norm(ref64)),
                         float((ref64 - ref.double()).abs().max() / ref64.abs().max()))
    out = (a.double().flip(1) @ b.double().flip(0)).float().t().contiguous().t()  # column-major, as a kernel may give
    if case == "nan_in_last_piece":
        out[-1, -1] = float("nan")
    elif case == "over_bound_in_a_middle_piece":
        out[20, 25] += 1.0
    whole = module._clear_pass(out, ref, correction, scale)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 300)  # seven pieces, the last one short
    pieces = module._clear_pass(out, ref, correction, scale)
    if case == "clear":
        assert whole is not None and pieces is not None
        _same_figures(pieces, whole)
        _same_figures(pieces, _exact(out, ref, correction, scale))
    else:
        assert whole is None and pieces is None
        assert not module.compare(out, ref, correction=correction, scale=scale).ok


def test_a_profiled_call_that_recorded_no_kernel_is_profiled_again(monkeypatch):
    """A CUDA session that recorded nothing of the call is not taken as the candidate running no kernel: the
    call is profiled again (up to `PROFILE_TRIES` sessions), and the first session that saw kernels is the
    answer. Sessions that recorded not even their own fillers leave the kernels unknown (`blind`)."""
    import contextlib

    from oracle import harness, kernels_seen

    answers = [(set(), 0), (set(), 3), ({"void relu_kernel(float*)"}, 4)]  # (kernels, fillers recorded)
    sessions = []

    @contextlib.contextmanager
    def session():
        seen = kernels_seen.Seen(launched=len(sessions) + 2)
        yield seen
        seen.names, seen.fillers = answers[len(sessions)]
        sessions.append(seen)

    monkeypatch.setattr(harness.timing, "sync", lambda device: None)
    monkeypatch.setattr(kernels_seen, "kernels_seen", session)
    calls = []
    profiled = harness._profile_call_timed(lambda x: calls.append(x) or x.relu(), [torch.ones(2)], "cuda")
    assert profiled.kernels == ["void relu_kernel(float*)"] and len(sessions) == 3 and len(calls) == 4
    assert profiled.ops == ["aten::relu"] and not profiled.blind
    assert profiled.sessions == [[0, 0, 2], [0, 3, 3], [1, 4, 4]]
    for fillers, blind in ((0, True), (2, False)):  # a call that truly launches nothing is not retried forever
        answers[:] = [(set(), fillers)] * harness.PROFILE_TRIES
        sessions.clear()
        profiled = harness._profile_call_timed(lambda x: x.relu(), [torch.ones(2)], "cuda")
        assert profiled.kernels == [] and len(sessions) == harness.PROFILE_TRIES and profiled.blind is blind


def test_a_kernel_thousands_of_times_slower_than_eager_is_not_called_zero_times_as_fast():
    """Two decimals would print 0.00x for the demo's slow kernels (86 ms against eager's 0.025 ms)."""
    message = judge.correct_message(86.14, 0.02525, 0.0212)
    assert "0.00029x eager PyTorch (0.02525 ms)" in message and "0.00025x torch.compile" in message
    assert "1.29x eager" in judge.correct_message(0.01952, 0.02525, None)
