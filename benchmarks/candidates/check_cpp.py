"""Build and check the CPU-only `correct_cpp.py` candidates of level 1 against the KernelBench reference.

Usage (from the repository root, CPU torch is enough):
    TORCH_EXTENSIONS_DIR=/tmp/ks_ext .venv/bin/python benchmarks/candidates/check_cpp.py [--data FILE] [TASK ...]

For every task it execs the task's code from the data file in a fresh namespace, overrides the module-level
size constants with the small sizes below (two sizes each), builds `Model` and `ModelNew` from the same seed,
copies matching state-dict entries, and compares the outputs with torch.allclose(atol=1e-4, rtol=1e-4) on the
task's own get_inputs() and on a randn copy of them (so negative values are exercised too). It also checks that
the candidate neither mutated nor aliased its inputs. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = Path("/work/shared/kernelbench/kernelbench_levels1-3.jsonl")

# Hand-shrunk size constants: a "small" size and a second, smaller and odd one (non-multiple-of-4 numel).
SIZES: dict[str, list[dict[str, int]]] = {
    "19_ReLU": [{"batch_size": 16, "dim": 4096}, {"batch_size": 3, "dim": 1001}],
    "21_Sigmoid": [{"batch_size": 16, "dim": 4096}, {"batch_size": 3, "dim": 1001}],
    "23_Softmax": [{"batch_size": 16, "dim": 4096}, {"batch_size": 5, "dim": 33}],
    "36_RMSNorm_": [
        {"batch_size": 4, "features": 64, "dim1": 32, "dim2": 32},
        {"batch_size": 2, "features": 7, "dim1": 3, "dim2": 5},
    ],
    "47_Sum_reduction_over_a_dimension": [
        {"batch_size": 8, "dim1": 256, "dim2": 255},
        {"batch_size": 3, "dim1": 5, "dim2": 7},
    ],
}
# Extra constructor arguments to try besides get_init_inputs() (the reduction dim of task 47).
EXTRA_INIT: dict[str, list[list]] = {
    "47_Sum_reduction_over_a_dimension": [[0], [2], [-1], [-3]],
}


def load_tasks(data: Path) -> dict[str, dict]:
    tasks = {}
    with open(data) as f:
        for line in f:
            d = json.loads(line)
            if d["level"] == 1:
                tasks[d["name"]] = d
    return tasks


def import_candidate(path: Path):
    mod_name = "cand_" + "_".join(path.with_suffix("").parts[-3:]).replace("-", "_")
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_models(ns: dict, cand, init: list):
    torch.manual_seed(0)
    ref = ns["Model"](*init)
    torch.manual_seed(0)
    new = cand.ModelNew(*init)
    ref_sd = ref.state_dict()
    new_sd = new.state_dict()
    shared = {k: v for k, v in ref_sd.items() if k in new_sd and new_sd[k].shape == v.shape}
    new.load_state_dict(shared, strict=False)
    return ref.eval(), new.eval()


def compare(ref, new, inputs: list[torch.Tensor]) -> tuple[bool, str]:
    with torch.no_grad():
        expected = ref(*[t.clone() for t in inputs])
        cand_in = [t.clone() for t in inputs]
        got = new(*cand_in)
    for a, b in zip(cand_in, inputs):
        if not torch.equal(a, b):
            return False, "input mutated"
    if any(got.data_ptr() == t.data_ptr() for t in cand_in):
        return False, "output aliases an input"
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False, f"shape/dtype {tuple(got.shape)}/{got.dtype} != {tuple(expected.shape)}/{expected.dtype}"
    if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
        err = (got - expected).abs().max().item()
        return False, f"max abs err {err:.3g}"
    err = (got - expected).abs().max().item() if got.numel() else 0.0
    return True, f"max abs err {err:.3g}"


def check_task(name: str, task: dict, path: Path) -> bool:
    t0 = time.time()
    try:
        cand = import_candidate(path)
    except Exception as e:  # build failure
        print(f"FAIL {name}: import/build failed: {type(e).__name__}: {str(e)[:500]}")
        return False
    print(f"     {name}: built/imported in {time.time() - t0:.1f}s")
    ok_all = True
    for sizes in SIZES[name]:
        ns: dict = {}
        exec(compile(task["code"], f"<{name}>", "exec"), ns)
        ns.update(sizes)
        inits = [list(ns["get_init_inputs"]())] + EXTRA_INIT.get(name, [])
        for init in inits:
            ref, new = build_models(ns, cand, init)
            torch.manual_seed(1)
            inputs = list(ns["get_inputs"]())
            variants = {"get_inputs": inputs, "randn": [torch.randn_like(t) for t in inputs]}
            for label, ins in variants.items():
                ok, msg = compare(ref, new, ins)
                ok_all &= ok
                shape = tuple(inputs[0].shape)
                print(f"{'ok  ' if ok else 'FAIL'} {name} sizes={sizes} init={init} {label} {shape}: {msg}")
    return ok_all


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("tasks", nargs="*", help="task names (default: every level-1 folder with a correct_cpp.py)")
    args = ap.parse_args()
    tasks = load_tasks(args.data)
    names = args.tasks or sorted(p.parent.name for p in (HERE / "level1").glob("*/correct_cpp.py"))
    ok = True
    for name in names:
        ok &= check_task(name, tasks[name], HERE / "level1" / name / "correct_cpp.py")
    print("ALL OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
