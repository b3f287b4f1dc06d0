"""Cold build time of candidate extensions: plain `load_inline` against the oracle's build, side by side.

    python benchmarks/build_speed.py [--backend cpp|cuda] [--limit N] [--against plain|no-pch] [--nvcc-phases]
                                     [--out FILE.json]

For every distinct candidate under `benchmarks/candidates/` of the backend (`*_cpp.py` for cpp, the others for
cuda; those expected not to compile are left out), one after another so that no two builds share the cores:
- plain: a fresh `python` imports the candidate with an empty TORCH_EXTENSIONS_DIR, so `load_inline` builds
  it exactly as the candidate wrote it, the way simple harnesses do; the seconds around the import;
- oracle: `Oracle.build` with an empty build cache, as the engine's build slots run it (the C++ half against
  the lite binding header, precompiled; CUDA sources against the lite header; see oracle/build.py); `build_s`.
With `--against no-pch` the first side is the oracle's own build without precompiled headers instead (what
the headers alone save). The order alternates between candidates so that drift in the machine's speed does
not favour one side.
Each build's ninja log says where its time went: the C++ binding file (`main.o`), the CUDA file
(`cuda.cuda.o`) and the link. The precompiled headers are made once before the builds and their one-time
cost printed. `--nvcc-phases` compiles one CUDA source with `nvcc --time` against each header (no GPU needed)
to show nvcc's passes: the host and device front ends parse every header the source includes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from oracle import Oracle, OracleConfig  # noqa: E402
from oracle.build import LITE_PRELUDE, lighten_cuda_sources  # noqa: E402
from oracle.candidate import Candidate  # noqa: E402
from oracle.pch import HEADERS, make_header, spec_for  # noqa: E402

PLAIN = r"""
import json, runpy, sys, time
import torch  # imported before the clock starts, as in the oracle's workers
t0 = time.perf_counter()
runpy.run_path(sys.argv[1], run_name="candidate")
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def candidates(backend: str, limit: int | None) -> list[tuple[str, str]]:
    seen, out = set(), []
    for f in sorted((ROOT / "candidates").glob("level*/*/*.py")):
        first = f.read_text().splitlines()[0]
        if (backend == "cpp") != f.stem.endswith("_cpp") or "compile_error" in first:
            continue
        text = f.read_text()
        if text not in seen:
            seen.add(text)
            out.append((f"{f.parent.name}/{f.stem}", text))
    return out[:limit] if limit is not None else out


def ninja_steps(build_dir: Path) -> dict[str, float]:
    """Seconds per output of the last ninja run in `build_dir` (main.o, cuda.cuda.o, NAME.so -> link)."""
    steps: dict[str, float] = {}
    for log in build_dir.rglob(".ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 4:
                name = "link" if parts[3].endswith(".so") else parts[3]
                steps[name] = (int(parts[1]) - int(parts[0])) / 1000.0
    return steps


def plain_build(text: str) -> tuple[float, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="ks-plain-") as tmp:
        path = Path(tmp) / "candidate.py"
        path.write_text(text)
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(Path(tmp) / "ext"))
        out = subprocess.run([sys.executable, "-c", PLAIN, str(path)], capture_output=True, text=True, env=env,
                             timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"plain build failed: {out.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])["seconds"], ninja_steps(Path(tmp) / "ext")


def oracle_build(text: str, device: str, backend: str, pch: Path | None) -> tuple[float, dict[str, float], dict]:
    """`pch` None: without precompiled headers."""
    with tempfile.TemporaryDirectory(prefix="ks-oracle-") as tmp:
        oracle = Oracle(OracleConfig(device=device, cache_dir=Path(tmp), pch_dir=pch, precompiled_headers=pch is not None))
        outcome = oracle.build(Candidate.make("bench", text, backend))
        if not outcome.ok:
            raise RuntimeError(f"oracle build failed: {outcome.message[:300]}")
        return outcome.build_s, ninja_steps(Path(tmp)), {"pch": outcome.pch_used, "cuda_header": outcome.cuda_header}


def nvcc_phases(text: str, extra_includes: list[str]) -> list[tuple[str, dict[str, float]]]:
    """`nvcc --time` per pass, compiling the candidate's CUDA source as written, with torch/types.h, and with
    the `lite` header (and without load_inline's torch/types.h, as a build's first rung compiles it)."""
    import sysconfig

    import torch.utils.cpp_extension as cpp

    source = next((m for m in re.finditer(r'"""(.*?)"""', text, re.S)
                   if "__global__" in m.group(1) and "#include <torch/extension.h>" in m.group(1)), None)
    if not source or not shutil.which("nvcc"):
        return []
    light = lighten_cuda_sources([source.group(1)], "types")
    lite = lighten_cuda_sources([source.group(1)], "lite")
    rows = []
    for label, code in (("torch/extension.h", source.group(1)), ("torch/types.h", light[0] if light else None),
                        ("lite", LITE_PRELUDE + "\n" + lite[0] if lite else None)):
        if code is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cu, times = Path(tmp) / "k.cu", Path(tmp) / "time.csv"
            cu.write_text(code)
            includes = [f"-I{p}" for p in [*cpp.include_paths(), sysconfig.get_paths()["include"], *extra_includes]]
            cmd = ["nvcc", "-c", str(cu), "-o", str(Path(tmp) / "k.o"), "-std=c++17", "--expt-relaxed-constexpr",
                   "-O3", "-Xcompiler", "-fPIC", "-gencode=arch=compute_90,code=sm_90", "--time", str(times), *includes]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True)
            phases = {"total": time.perf_counter() - t0}
            if done.returncode != 0:
                phases["failed"] = 1.0
            for line in times.read_text().splitlines()[1:] if times.exists() else []:
                cells = [c.strip() for c in line.split(",")]
                if len(cells) >= 8 and cells[1]:
                    phases[cells[1]] = float(cells[6]) / 1000.0
            rows.append((label, phases))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cpp", "cuda"], default=None, help="default: cuda with a GPU, else cpp")
    ap.add_argument("--limit", type=int, default=None, help="at most this many candidates")
    ap.add_argument("--nvcc-phases", action="store_true")
    ap.add_argument("--nvcc-candidates", type=int, default=1, help="how many CUDA candidates --nvcc-phases compiles")
    ap.add_argument("--nvcc-include", action="append", default=[],
                    help="an extra include folder for --nvcc-phases (a toolkit without cuSPARSE/cuBLAS headers)")
    ap.add_argument("--pch-dir", type=Path, default=None, help="default: a fresh folder (the one-time cost is shown)")
    ap.add_argument("--against", choices=["plain", "no-pch"], default="plain",
                    help="the other side: plain load_inline, or the oracle's build without precompiled headers")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or ("cuda" if device == "cuda" else "cpp")
    files = candidates(backend, args.limit)
    print(f"{len(files)} {backend} candidates, device {device}, torch {torch.__version__}, {os.cpu_count()} cores", flush=True)
    report: dict = {"backend": backend, "device": device, "torch": torch.__version__, "cores": os.cpu_count(), "rows": []}

    if args.nvcc_phases:  # the first CUDA candidates whose sources compile here as written
        done = 0
        for name, text in candidates("cuda", None):
            if done >= args.nvcc_candidates:
                break
            rows = nvcc_phases(text, args.nvcc_include)
            if not rows or "failed" in rows[0][1]:
                continue
            done += 1
            for label, phases in rows:
                print(f"nvcc passes, {name} with {label}: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()), flush=True)
                report.setdefault("nvcc_phases", []).append({"candidate": name, "header": label, **phases})
        totals = {label: [r["total"] for r in report.get("nvcc_phases", []) if r["header"] == label and "failed" not in r]
                  for label in ("torch/extension.h", "torch/types.h", "lite")}
        if all(totals.values()):
            med = {k: statistics.median(v) for k, v in totals.items()}
            print("nvcc total, median over %d candidates: " % done + ", ".join(f"{k} {v:.1f} s" for k, v in med.items())
                  + f"; lite against torch/types.h x{med['torch/types.h'] / med['lite']:.2f}", flush=True)
    if not files:  # --limit 0: the nvcc passes only
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
        return

    pch = args.pch_dir or Path(tempfile.mkdtemp(prefix="ks-pch-"))
    for header in HEADERS:  # torch/extension.h, and the lite binding header the oracle's bindings compile against
        spec = spec_for(["-O3"], None, with_cuda=backend == "cuda", header=header)
        t0 = time.perf_counter()
        made = make_header(pch, spec) if spec else None
        report.setdefault("pch_s", {})[header] = made
        print(f"precompiled {header}: {'made in %.1f s (once per toolchain)' % made if made else 'already there' if made == 0.0 else 'not made'}"
              f" {time.perf_counter() - t0:.1f} s", flush=True)

    for i, (name, text) in enumerate(files):
        order = ("plain", "oracle") if i % 2 == 0 else ("oracle", "plain")
        row: dict = {"candidate": name}
        for side in order:
            try:
                if side == "plain" and args.against == "no-pch":
                    row["plain_s"], row["plain_steps"], _ = oracle_build(text, device, backend, None)
                elif side == "plain":
                    row["plain_s"], row["plain_steps"] = plain_build(text)
                else:
                    row["oracle_s"], row["oracle_steps"], row["oracle_used"] = oracle_build(text, device, backend, pch)
            except Exception as exc:  # noqa: BLE001 - one candidate's failure is a row, not the end
                row[f"{side}_error"] = str(exc)[:300]
        report["rows"].append(row)
        if "plain_s" in row and "oracle_s" in row:
            print(f"  {name:60s} {args.against} {row['plain_s']:6.1f} s  oracle {row['oracle_s']:6.1f} s  "
                  f"x{row['plain_s'] / row['oracle_s']:.2f}  {row['oracle_used']}", flush=True)
        else:
            print(f"  {name:60s} {row.get('plain_error') or row.get('oracle_error')}", flush=True)

    both = [r for r in report["rows"] if "plain_s" in r and "oracle_s" in r]
    if both:
        p50_plain = statistics.median(r["plain_s"] for r in both)
        p50_oracle = statistics.median(r["oracle_s"] for r in both)
        ratios = [r["plain_s"] / r["oracle_s"] for r in both]
        report["summary"] = {"candidates": len(both), "plain_p50_s": p50_plain, "oracle_p50_s": p50_oracle,
                             "p50_ratio": p50_plain / p50_oracle, "median_ratio": statistics.median(ratios)}
        print("\nwhere the time went (median seconds per step):")
        for side in ("plain", "oracle"):
            steps: dict[str, list[float]] = {}
            for r in both:
                for k, v in r[f"{side}_steps"].items():
                    steps.setdefault(k, []).append(v)
            print(f"  {(args.against if side == 'plain' else side):7s}" + "".join(f"  {k} {statistics.median(v):.1f}" for k, v in sorted(steps.items())))
        other = "plain load_inline" if args.against == "plain" else "the oracle without precompiled headers"
        report["against"] = args.against
        print(f"\ncold build p50: {other} {p50_plain:.1f} s, oracle {p50_oracle:.1f} s, "
              f"ratio {p50_plain / p50_oracle:.2f} (median per-candidate ratio {statistics.median(ratios):.2f}, "
              f"{len(both)} candidates, {backend}, {device})")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
