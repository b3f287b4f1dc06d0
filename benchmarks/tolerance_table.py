"""Tolerance table: KernelBench-style CUDA kernels judged under each tolerance policy, against what each expects.

    python benchmarks/tolerance_table.py [--out FILE.json] [--max-input-mb MB] [--only NAME,...]
    python benchmarks/tolerance_table.py --list          # no GPU: parse the candidates and their tasks
    python benchmarks/tolerance_table.py --nvcc-check    # no GPU: compile each kernel's CUDA source with nvcc

Each file under `benchmarks/candidates_kb/` is one kernel written the way KernelBench submissions are
(a `ModelNew` calling a `load_inline` extension, some reading the task file's module-level constants). Its
first line says the verdict expected under each policy (`# expected: kernelbench=STATUS
kernelbench-v0.1=STATUS numeric=STATUS - what it is`), its second the task (`# task: level1/...`), a real
task of the KernelBench dataset file, fitted to `--max-input-mb` as a run fits it.

Every kernel is built once, all in parallel first (`Oracle.build` in a thread pool; the build cache is by
content, so the oracles of the other policies find it built). Then one oracle per policy
(`OracleConfig(device="cuda", tolerance=...)`) judges every kernel in turn, and the table shows each policy's
status, the kernel's worst error over that policy's bound (<= 1 passes; from the verdict's `errors`), and
whether the three statuses are the expected ones. `--out` writes the rows and verdicts as JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle.tolerance import POLICIES  # noqa: E402

CANDIDATES = ROOT / "candidates_kb"
DATA = [ROOT.parent.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent / ".shared" / "kernelbench" / "kernelbench_levels1-3.jsonl",
        ROOT.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"]
# torch's own flags for CUDA extensions (torch.utils.cpp_extension.COMMON_NVCC_FLAGS), so the check here
# refuses what a real build refuses.
NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-std=c++17"]


@dataclass
class KbCandidate:
    name: str  # the file's stem
    path: Path
    task_id: str
    expected: dict[str, str]  # policy -> status
    what: str
    text: str


def read_candidate(path: Path) -> KbCandidate:
    """A candidate file and its two header lines; ValueError naming the file when they are malformed."""
    text = path.read_text()
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("# expected: ") or not lines[1].startswith("# task: "):
        raise ValueError(f"{path.name}: the first lines must be '# expected: ...' and '# task: ...'")
    head, _, what = lines[0][len("# expected: "):].partition(" - ")
    expected = dict(pair.split("=", 1) for pair in head.split())
    if set(expected) != set(POLICIES):
        raise ValueError(f"{path.name}: expected statuses for {', '.join(POLICIES)}, found {', '.join(expected)}")
    return KbCandidate(path.stem, path, lines[1][len("# task: "):].strip(), expected, what.strip(), text)


def read_candidates(folder: Path = CANDIDATES, only: set[str] | None = None) -> list[KbCandidate]:
    return [read_candidate(p) for p in sorted(folder.glob("*.py")) if not only or p.stem in only]


def cuda_sources(text: str) -> list[str]:
    """The CUDA source strings the file hands to `load_inline` (module-level string constants named there,
    or literals), read without running the file."""
    tree = ast.parse(text)
    strings = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
               for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "load_inline":
            for kw in node.keywords:
                if kw.arg == "cuda_sources":
                    value = kw.value.elts if isinstance(kw.value, (ast.List, ast.Tuple)) else [kw.value]
                    for v in value:
                        found.append(strings[v.id] if isinstance(v, ast.Name) else v.value)
    return found


# ATen/cuda/CUDAContext.h names the handle and status types of CUDA's math libraries. A toolkit without those
# libraries (a compiler-only install) gets these declarations instead: enough to compile a kernel, nothing linked.
LIBRARY_TYPES = {"cusparse.h": ("cusparseHandle_t", "cusparseStatus_t"), "cublas_v2.h": ("cublasHandle_t", "cublasStatus_t"),
                 "cublasLt.h": ("cublasLtHandle_t",), "cusolverDn.h": ("cusolverDnHandle_t",),
                 "cusolver_common.h": ("cusolverStatus_t",)}


def _stand_in_headers(folder: Path) -> list[str]:
    """-I flags for stand-ins of the library headers nvcc cannot find (none where the toolkit has them)."""
    nvcc = shutil.which("nvcc")
    toolkit = Path(os.environ.get("CUDA_HOME") or (Path(nvcc).resolve().parent.parent if nvcc else "/usr/local/cuda"))
    roots = [toolkit / "include", Path("/usr/local/cuda/include"), Path("/usr/include")]
    missing = {h: t for h, t in LIBRARY_TYPES.items() if not any((r / h).exists() for r in roots)}
    for header, names in missing.items():
        lines = [f"typedef struct {n[:-2]}_opaque* {n};" if n.endswith("Handle_t") else f"typedef int {n};" for n in names]
        (folder / header).write_text("#pragma once\n" + "\n".join(lines) + "\n")
    # A CPU build of torch lacks the header its CUDA build generates; its one macro, as a shared-library build has it.
    from torch.utils.cpp_extension import include_paths

    generated = Path("c10/cuda/impl/cuda_cmake_macros.h")
    if not any((Path(p) / generated).exists() for p in include_paths()):
        (folder / generated).parent.mkdir(parents=True)
        (folder / generated).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        missing[str(generated)] = ()
    return [f"-I{folder}"] if missing else []


def nvcc_check(candidate: KbCandidate, arch: str = "sm_90") -> str | None:
    """Compile the candidate's CUDA sources to an object file with nvcc (no GPU needed): None, or the
    compiler's first error lines."""
    from torch.utils.cpp_extension import include_paths

    includes = [*include_paths(), sysconfig.get_paths()["include"]]  # torch's and Python's; nvcc knows its own
    with tempfile.TemporaryDirectory() as tmp:
        stand_ins = _stand_in_headers(Path(tmp))
        for i, source in enumerate(cuda_sources(candidate.text)):
            cu = Path(tmp) / f"{candidate.name}_{i}.cu"
            cu.write_text(source)
            cmd = ["nvcc", "-c", str(cu), "-o", str(cu.with_suffix(".o")), f"-arch={arch}", *NVCC_FLAGS,
                   *(f"-I{p}" for p in includes), *stand_ins]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                return "\n".join(line for line in done.stderr.splitlines() if "error" in line)[:2000] or done.stderr[-2000:]
    return None


def load_tasks_for(candidates: list[KbCandidate], source: Path, max_input_mb: float) -> dict:
    from tasks import Selection, load_tasks

    wanted = frozenset(c.task_id for c in candidates)
    loaded = load_tasks(str(source), Selection(task_ids=wanted), max_input_mb)
    tasks = {t.id: t for t in loaded.tasks}
    missing = sorted(wanted - set(tasks))
    if missing:
        raise SystemExit(f"tasks not in {source}: {', '.join(missing)}")
    return tasks


def extracted(candidate: KbCandidate, task):
    """What the oracle would judge: the `Candidate` (a CUDA one), or SystemExit naming the file."""
    from oracle.candidate import Candidate
    from oracle.extract import candidate_from_completion

    found = candidate_from_completion(task, candidate.text, "auto", "cuda")
    if not isinstance(found, Candidate) or found.backend != "cuda":
        raise SystemExit(f"{candidate.name}: not a CUDA candidate ({getattr(found, 'message', found.backend)})")
    return found


def judge(candidates: list[KbCandidate], tasks: dict, jobs: int, cache: Path | None) -> list[dict]:
    from oracle import Oracle, OracleConfig
    from oracle.timing import TimingParams

    # Enough calls for a median; the verdicts, not the speeds, are what this table is about.
    quick = TimingParams(warmup_calls=2, min_calls=5, max_calls=30, target_s=0.3, wall_calls=5)
    made = {c.name: extracted(c, tasks[c.task_id]) for c in candidates}
    verdicts: dict[tuple[str, str], object] = {}
    started = time.perf_counter()
    for n, policy in enumerate(POLICIES):
        oracle = Oracle(OracleConfig(device="cuda", tolerance=policy, cache_dir=cache, timing=quick,
                                     compile_baseline=False))
        try:
            with ThreadPoolExecutor(max_workers=jobs) as pool:  # built once; later policies find them cached
                builds = dict(zip(made, pool.map(oracle.build, made.values())))
            if n == 0:
                print(f"built {len(builds)} kernels in {time.perf_counter() - started:.0f} s "
                      f"({sum(not b.cached for b in builds.values())} compiled)", flush=True)
            # Checks of several kernels overlap on the device (the oracle's device slots); timing holds it alone.
            with ThreadPoolExecutor(max_workers=oracle.config.device_slots) as pool:
                judged = pool.map(lambda c: oracle.check_and_time(tasks[c.task_id], made[c.name], builds[c.name]),
                                  candidates)
                for c, v in zip(candidates, judged):
                    verdicts[c.name, policy] = v
                    print(f"  {policy:17s} {c.name:40s} {v.status:14s} {v.message[:110]}", flush=True)
        finally:
            oracle.close()
    rows = []
    for c in candidates:
        row = {"kernel": c.name, "task": c.task_id, "what": c.what, "expected": c.expected,
               "sizes": dict(tasks[c.task_id].sizes)}
        for policy in POLICIES:
            v = verdicts[c.name, policy]
            errors = v.errors
            row[policy] = {"status": v.status, "over_bound": errors.over_bound.get(policy) if errors else None,
                           "passes": v.passes, "message": v.message, "flags": v.flags,
                           "errors": errors.to_json() if errors else None}
        row["matched"] = all(row[p]["status"] == c.expected[p] for p in POLICIES)
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    header = f"{'kernel':40s} {'task':44s} " + " ".join(f"{p:>24s}" for p in POLICIES) + "  matched"
    print(header)
    print("-" * len(header))
    for r in rows:
        cells = []
        for p in POLICIES:
            cell = r[p]
            over = cell.get("over_bound")
            shown = "-" if over is None else ("inf" if over >= 1e29 else f"{over:.3g}")
            cells.append(f"{cell['status']:>14s} {shown:>9s}")
        print(f"{r['kernel']:40s} {r['task']:44s} " + " ".join(cells) + f"  {'yes' if r['matched'] else 'NO'}")
    print(f"\n{sum(r['matched'] for r in rows)} of {len(rows)} kernels got the expected verdict under every policy "
          "(each cell: status, worst error over that policy's bound; <= 1 passes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=next((p for p in DATA if p.exists()), DATA[0]))
    ap.add_argument("--max-input-mb", type=float, default=256, help="fit each task's inputs to this (as a run does)")
    ap.add_argument("--only", default="", help="comma-separated kernel names (file stems)")
    ap.add_argument("--device", default="cuda", help="cuda (judge), or cpu: the same as --list")
    ap.add_argument("--list", action="store_true", help="parse the candidates and their tasks; judge nothing")
    ap.add_argument("--nvcc-check", action="store_true", help="compile each kernel's CUDA source with nvcc; judge nothing")
    ap.add_argument("--arch", default="sm_90", help="for --nvcc-check")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel builds")
    ap.add_argument("--cache", type=Path, default=None, help="build cache folder (default: $KERNELSEARCH_CACHE)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()

    candidates = read_candidates(only={s for s in args.only.split(",") if s} or None)
    if args.nvcc_check:
        failed = 0
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for c, error in zip(candidates, pool.map(lambda c: nvcc_check(c, args.arch), candidates)):
                failed += error is not None
                print(f"{c.name:40s} {'ok' if error is None else 'FAILED'}" + (f"\n{error}" if error else ""), flush=True)
        raise SystemExit(1 if failed else 0)
    tasks = load_tasks_for(candidates, args.source, args.max_input_mb)
    if args.list or args.device == "cpu":
        for c in candidates:
            extracted(c, tasks[c.task_id])
            expected = " ".join(f"{p}={c.expected[p]}" for p in POLICIES)
            print(f"{c.name:40s} {c.task_id:44s} {tasks[c.task_id].sizes}\n    {expected}: {c.what}")
        return
    started = time.perf_counter()
    rows = judge(candidates, tasks, args.jobs, args.cache)
    print()
    print_table(rows)
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "max_input_mb": args.max_input_mb, "source": str(args.source)},
                                       indent=1, default=str))


if __name__ == "__main__":
    main()
