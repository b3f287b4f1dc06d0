"""Check every CUDA candidate under this folder on a GPU and compare its observed verdict with the expected one.

Usage (on a machine with a CUDA GPU and nvcc; --data is the KernelBench JSONL, or any subset of it holding the
candidates' tasks, e.g. copied next to this script for a run on the device machine):
    TORCH_EXTENSIONS_DIR=/tmp/ks_ext TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=1 \
    python benchmarks/candidates/check_gpu.py --data kernelbench_levels1-3.jsonl [--jobs 16] [--run-jobs 3] \
        [--timeout 60] [--out DIR] [FILE ...]
Without FILE it checks every level*/*/*.py except correct_cpp.py. KS_CHECK_DEVICE=cpu KS_CHECK_SKIP_FULL=1 dry-runs
the script itself on correct_cpp.py files (they then read "rejected": no CUDA kernel of their own runs).

Phase 1 builds every candidate (imports it, which runs load_inline) in parallel child processes.
Phase 2 runs each candidate in its own child process with a timeout (a hung kernel or a poisoned CUDA context
never touches the next candidate). The child:
  * execs the task's code from the data file, at the task's own sizes ("full") and at a hand-shrunk odd size
    ("small"), builds Model and ModelNew from the same seed and copies the matching state-dict entries;
  * computes the reference first and keeps it, then runs ModelNew under torch.profiler on clones of the inputs;
  * records: exceptions (runtime_error), whether the inputs were changed or aliased by the output,
    torch.allclose(atol=1e-4, rtol=1e-4), and whether any CUDA kernel defined in the candidate's own source
    ran (else "no own kernel" -> rejected);
  * times reference and candidate with CUDA events at the full size.
This is a check of the candidate files, not the project's evaluator: its verdict names follow the first-line
comment of each file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEV = os.environ.get("KS_CHECK_DEVICE", "cuda")  # "cpu" only to dry-run this script with correct_cpp.py files

# Second, smaller size per task (odd where possible, to exercise the scalar paths).
SMALL: dict[str, dict[str, object]] = {
    "19_ReLU": {"batch_size": 3, "dim": 1001},
    "21_Sigmoid": {"batch_size": 3, "dim": 1001},
    "23_Softmax": {"batch_size": 5, "dim": 33},
    "36_RMSNorm_": {"batch_size": 2, "features": 7, "dim1": 3, "dim2": 5},
    "47_Sum_reduction_over_a_dimension": {"batch_size": 3, "dim1": 5, "dim2": 7},
    # bias_shape is computed from out_channels when the code runs, so it is overridden too.
    "1_Conv2D_ReLU_BiasAdd": {"batch_size": 2, "in_channels": 3, "out_channels": 5, "height": 9, "width": 9,
                              "bias_shape": (5, 1, 1)},
    "2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide": {
        "batch_size": 2, "in_channels": 3, "out_channels": 5, "height": 7, "width": 7, "bias_shape": (5, 1, 1)},
    "4_Conv2d_Mish_Mish": {"batch_size": 2, "in_channels": 3, "out_channels": 5, "height": 9, "width": 9},
    "7_Conv3d_ReLU_LeakyReLU_GELU_Sigmoid_BiasAdd": {
        "batch_size": 2, "in_channels": 3, "out_channels": 5, "depth": 5, "height": 7, "width": 9,
        "bias_shape": (5, 1, 1, 1)},
    "9_Matmul_Subtract_Multiply_ReLU": {"batch_size": 3, "in_features": 37, "out_features": 33},
}
# Constructor arguments to try besides get_init_inputs() (the reduction dim of task 47), at a mid size.
EXTRA_INIT: dict[str, tuple[dict[str, int], list[list]]] = {
    "47_Sum_reduction_over_a_dimension": ({"batch_size": 16, "dim1": 256, "dim2": 255}, [[0], [2], [-1]]),
}


def expected_of(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    m = re.match(r"#\s*expected verdict:\s*(.*)", first)
    return m.group(1) if m else "?"


def own_kernel_names(path: Path) -> list[str]:
    return sorted(set(re.findall(r"__global__\s+void\s+(\w+)", path.read_text())))


def import_candidate(path: Path):
    mod_name = "cand_" + re.sub(r"\W", "_", "_".join(path.with_suffix("").parts[-3:]))
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------- child

def child(path: Path, data: Path, mode: str) -> None:
    import torch

    def emit(**kw):
        print("@@" + json.dumps(kw), flush=True)

    t0 = time.time()
    try:
        cand = import_candidate(path)
    except Exception as e:
        msg = str(e)
        kind = "compile_error" if "Error building extension" in msg else "import_error"
        emit(phase="import", status=kind, error=f"{type(e).__name__}: {msg[-1500:]}")
        return
    emit(phase="import", status="ok", seconds=round(time.time() - t0, 1))
    if mode == "build":
        return

    level, name = path.parent.parent.name, path.parent.name
    task = None
    with open(data) as f:
        for line in f:
            d = json.loads(line)
            if f"level{d['level']}" == level and d["name"] == name:
                task = d
    assert task is not None, f"task {level}/{name} not in {data}"
    own = own_kernel_names(path)
    sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)

    configs = [("full", {}, None), ("small", SMALL[name], None)]
    if os.environ.get("KS_CHECK_SKIP_FULL"):  # dry runs on a CPU
        configs = configs[1:]
    if mode == "time":
        configs = configs[:1]
    elif name in EXTRA_INIT:
        sizes, inits = EXTRA_INIT[name]
        configs += [(f"init{init}", sizes, init) for init in inits]

    for label, sizes, init in configs:
        ns: dict = {}
        exec(compile(task["code"], f"<{name}>", "exec"), ns)
        ns.update(sizes)
        init_args = list(ns["get_init_inputs"]()) if init is None else init
        torch.manual_seed(0)
        ref = ns["Model"](*init_args).to(DEV).eval()
        torch.manual_seed(0)
        new = cand.ModelNew(*init_args).to(DEV).eval()
        rsd, nsd = ref.state_dict(), new.state_dict()
        new.load_state_dict({k: v for k, v in rsd.items() if k in nsd and nsd[k].shape == v.shape}, strict=False)
        torch.manual_seed(1)
        with torch.device(DEV):  # torch.rand & co. allocate straight on the GPU (fast at full size)
            inputs = [t.to(DEV) if isinstance(t, torch.Tensor) else t for t in ns["get_inputs"]()]
        pristine = inputs  # never handed to either model: both get clones
        with torch.no_grad():
            expected = ref(*[t.clone() for t in inputs])
        sync()
        cand_in = [t.clone() for t in inputs]
        emit(phase="run", config=label, status="started", shape=list(inputs[0].shape))
        kernels: list[str] = []
        try:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CUDA] if DEV == "cuda" else [ProfilerActivity.CPU]
            with profile(activities=acts) as prof, torch.no_grad():
                got = new(*cand_in)
                sync()
            kernels = sorted({ev.name for ev in prof.events() if ev.device_type.name == DEV.upper()})
        except Exception as e:
            emit(phase="run", config=label, status="runtime_error", error=f"{type(e).__name__}: {str(e)[:800]}")
            return
        ran_own = [k for k in kernels if any(n in k for n in own)]
        mutated = any(not torch.equal(a, b) for a, b in zip(cand_in, pristine))
        aliased = any(got.data_ptr() == t.data_ptr() for t in cand_in)
        same_shape = tuple(got.shape) == tuple(expected.shape) and got.dtype == expected.dtype
        close, err, nonzero = same_shape, None, 0
        if same_shape and got.numel():
            # allclose chunk by chunk: at full size its temporaries would be several times the output.
            g, x = got.reshape(-1), expected.reshape(-1)
            err = 0.0
            for i in range(0, g.numel(), 1 << 26):
                gc, xc = g[i:i + (1 << 26)], x[i:i + (1 << 26)]
                close = close and torch.allclose(gc, xc, atol=1e-4, rtol=1e-4)
                err = max(err, (gc - xc).abs().max().item())
                nonzero += int((xc != 0).sum().item())
        frac_nonzero = nonzero / expected.numel() if expected.numel() else None
        res = dict(phase="run", config=label, status="done", close=close, max_abs_err=err, mutated_input=mutated,
                   output_aliases_input=aliased, shape_ok=same_shape, own_kernels_ran=ran_own,
                   ref_frac_nonzero=frac_nonzero, kernels=[k[:80] for k in kernels][:8])
        if mode == "time" and label == "full" and close:
            def bench(fn, args, iters=20):
                with torch.no_grad():
                    for _ in range(3):
                        fn(*args)
                    sync()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(iters):
                        fn(*args)
                    e.record()
                    sync()
                return s.elapsed_time(e) / iters

            res["ref_ms"] = round(bench(ref, inputs), 4)
            res["new_ms"] = round(bench(new, [t.clone() for t in inputs]), 4)
        emit(**res)
        del expected, got, cand_in, inputs, pristine, ref, new, prof
        if DEV == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- parent

def run_child(path: Path, data: Path, mode: str, timeout: float) -> tuple[list[dict], bool, str]:
    cmd = [sys.executable, "-u", __file__, "--child", mode, "--data", str(data), str(path)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        timed_out = True
    events = [json.loads(l[2:]) for l in out.splitlines() if l.startswith("@@")]
    return events, timed_out, out


def verdict(events: list[dict], timed_out: bool) -> str:
    imp = [e for e in events if e["phase"] == "import"]
    if imp and imp[0]["status"] != "ok":
        return imp[0]["status"]
    runs = [e for e in events if e["phase"] == "run" and e["status"] != "started"]
    for e in runs:
        if e["status"] != "done":
            return e["status"]
    if timed_out:
        return "timeout"
    if not runs:
        return "crashed (no result)"
    if any(e["mutated_input"] or e["output_aliases_input"] for e in runs):
        return "input_mutation"
    if not all(e["close"] for e in runs):
        return "incorrect"
    if not all(e["own_kernels_ran"] for e in runs):
        return "rejected (no own kernel ran)"
    return "correct"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds for one candidate's run phase")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=["build", "run", "time"], default=None)
    ap.add_argument("--run-jobs", type=int, default=3, help="candidates checked at once in the run phase")
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    if args.child:
        child(args.files[0].resolve(), args.data.resolve(), args.child)
        return 0

    files = [f.resolve() for f in args.files] or sorted(
        p for p in HERE.glob("level*/*/*.py") if p.name != "correct_cpp.py")
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as ex:
        builds = dict(zip(files, ex.map(lambda f: run_child(f, args.data, "build", 590), files)))
    print(f"built {len(files)} candidates in {time.time() - t0:.0f}s", flush=True)
    def check(f: Path) -> dict:
        bevents, _, bout = builds[f]
        if bevents and bevents[0]["status"] != "ok":
            events, timed_out, out = bevents, False, bout
        else:
            events, timed_out, out = run_child(f, args.data, "run", args.timeout)
        v = verdict(events, timed_out)
        return dict(file=str(f.relative_to(HERE)), expected=expected_of(f), observed=v, events=events,
                    tail=out[-1500:] if v != "correct" or not events else "")

    with ThreadPoolExecutor(args.run_jobs) as ex:
        results = list(ex.map(check, files))
    print(f"checked in {time.time() - t0:.0f}s", flush=True)
    for r in results:
        print(f"{r['observed']:32s} <- expected {r['expected'][:70]:70s} {r['file']}", flush=True)
        for e in r["events"]:
            if e["phase"] == "run" and e["status"] != "started":
                brief = {k: e.get(k) for k in ("config", "status", "close", "max_abs_err", "mutated_input",
                                                "own_kernels_ran", "ref_frac_nonzero", "error")
                         if e.get(k) is not None}
                print("      ", json.dumps(brief)[:400], flush=True)
    # Timing: the correct candidates one at a time, full size, nothing else on the GPU.
    for r in results:
        if r["file"].endswith("/correct.py") and r["observed"] == "correct":
            events, timed_out, _ = run_child(HERE / r["file"], args.data, "time", args.timeout)
            t = [e for e in events if e.get("new_ms") is not None]
            r["timing"] = t[0] if t else None
            if t:
                print(f"time {r['file']:80s} ref {t[0]['ref_ms']:.3f} ms  new {t[0]['new_ms']:.3f} ms  "
                      f"speedup {t[0]['ref_ms'] / t[0]['new_ms']:.2f}x", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "check_gpu.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
