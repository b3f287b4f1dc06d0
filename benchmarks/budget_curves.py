"""Strategies at equal budget, from real runs of the engine on a CPU: `kernelsearch report --by ... --compare`.

Three runs of the real engine (Ray, the CPU oracle: build, check against PyTorch, time; the run store) on
four built-in tasks, three level-1 operators and one level-2 fusion, with recorded completions standing
in for a model (no model runs):

- `zero-shot-terse`: zero-shot, n=10, from a replay file in which 2 of a task's 10 completions are correct
  (one fast, one slow) and each costs what it was recorded with (about 400 to 700 tokens);
- `zero-shot-careful`: zero-shot, n=10, from one in which 5 of 10 are correct (3 fast) and each costs 2.5
  times as many tokens (a longer answer);
- `refine`: the refine strategy, 4 chains of up to 4 rounds, from a replay file laid out so that the
  completion each (chain, round) draws is correct more often in later rounds (fast with probability
  0.1, 0.3, 0.5, 0.7 and slow with 0, 0.2, 0.2, 0.1 by round, drawn once with a fixed seed), each at
  the terse cost; a chain stops once it is correct and at least as fast as eager.

Generation seconds are recorded with the completions at 40 tokens a second (a 7B model's decode rate on
one GPU, roughly); oracle seconds are the ones this machine measured. The completions are the demo's
(`search/demo_data`: fast, slow, wrong, does not compile, crashes, cheats) and, for the level-2 task, the
same six written around `benchmarks/candidates/builtin/8_BiasAdd_SiLU_Scale_Residual/fast_cpp.py`.

    python benchmarks/budget_curves.py --out runs/budget --plot benchmarks/budget_curves.png

Then the report prints the budget tables by tokens, gpu-seconds and samples, each with --compare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search.demo import DEMO_TASKS, demo_completions  # noqa: E402
from search.generators.replay import ReplayGenerator  # noqa: E402

LEVEL2 = "builtin/8_BiasAdd_SiLU_Scale_Residual"
TASKS = DEMO_TASKS + (LEVEL2,)
FAST_CPP = ROOT / "benchmarks" / "candidates" / "builtin" / "8_BiasAdd_SiLU_Scale_Residual" / "fast_cpp.py"
TOKENS_PER_S = 40.0
TERSE = {"fast": 1, "slow": 1, "wrong": 2, "compile_error": 2, "crash": 2, "cheat": 2}
CAREFUL = {"fast": 3, "slow": 2, "wrong": 2, "compile_error": 1, "crash": 1, "cheat": 1}
CAREFUL_COST = 2.5
CHAINS, ROUNDS = 4, 4
FAST_BY_ROUND = (0.1, 0.3, 0.5, 0.7)
SLOW_BY_ROUND = (0.0, 0.2, 0.2, 0.1)
FAILURES = ("wrong", "compile_error", "crash", "cheat")

FORWARD = "        return fused_ext.bias_silu_scale_residual(x.contiguous(), self.bias.contiguous(), residual.contiguous(), self.scale)\n"
LEVEL2_VARIANTS = {
    "fast": ("One C++ kernel adds the channel bias, applies SiLU, scales and adds the residual in a single pass "
             "over memory, where eager PyTorch makes four.", None, None),
    "slow": ("The fused C++ kernel, fed 256-element tiles so every call stays in the L1 cache.", None,
             "        # 256-element tiles of each (batch, channel) plane, so each call works in the L1 cache.\n"
             "        out = []\n"
             "        for n in range(x.size(0)):\n"
             "            for c in range(x.size(1)):\n"
             "                b = self.bias[:, c:c + 1].contiguous()\n"
             "                xs, rs = x[n, c].reshape(-1).split(256), residual[n, c].reshape(-1).split(256)\n"
             "                out += [fused_ext.bias_silu_scale_residual(a.view(1, 1, 1, -1).contiguous(), b,\n"
             "                        r.view(1, 1, 1, -1).contiguous(), self.scale).view(-1) for a, r in zip(xs, rs)]\n"
             "        return torch.cat(out).view_as(x)\n"),
    "wrong": ("A fused C++ kernel for bias, SiLU, scale and residual in one pass.", None,
              "        return fused_ext.bias_silu_scale_residual(residual.contiguous(), self.bias.contiguous(), x.contiguous(), self.scale)\n"),
    "compile_error": ("The fused kernel, compiled with fast math for extra speed.", ('extra_cflags=["-O3"]', 'extra_cflags=["-O3", "--use_fast_math"]'), None),
    "crash": ("The fused kernel in half precision, to halve the memory traffic.", None,
              "        return fused_ext.bias_silu_scale_residual(x.half().contiguous(), self.bias.contiguous(), residual.contiguous(), self.scale)\n"),
    "cheat": ("The fused kernel, with the PyTorch path kept for robustness.", None,
              "        fused_ext.bias_silu_scale_residual(x[:1].contiguous(), self.bias.contiguous(), residual[:1].contiguous(), self.scale)\n"
              "        y = x + self.bias\n"
              "        return y * torch.sigmoid(y) * self.scale + residual\n"),
}


def level2_completions() -> list[dict]:
    """The six variants for the level-2 task, written the way a model answers (a sentence, then code)."""
    code = FAST_CPP.read_text()
    assert FORWARD in code
    rows = []
    for variant, (sentence, flags, forward) in LEVEL2_VARIANTS.items():
        text = code if flags is None else code.replace(*flags)
        text = text if forward is None else text.replace(FORWARD, forward)
        completion = f"{sentence}\n\n```python\n{text}```\n"
        rows.append({"task": LEVEL2, "backend": "cpp", "variant": variant, "completion": completion,
                     "tokens": len(completion) // 4})
    return rows


def with_cost(row: dict, factor: float) -> dict:
    tokens = int(round(row["tokens"] * factor))
    return {"task": row["task"], "variant": row["variant"], "completion": row["completion"], "tokens": tokens,
            "generation_s": round(tokens / TOKENS_PER_S, 3)}


def zero_shot_file(path: Path, rows: list[dict], mix: dict[str, int], factor: float) -> None:
    by = {(r["task"], r["variant"]): r for r in rows}
    lines = [with_cost(by[(t, v)], factor) for t in TASKS for v, count in mix.items() for _ in range(count)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def refine_file(path: Path, rows: list[dict], seed: int = 0) -> None:
    """16 lines a task, line i being what sample number i (round r, chain c: i = r * CHAINS + c) draws
    under the replay's seeded order: round r is fast with FAST_BY_ROUND[r], slow with SLOW_BY_ROUND[r],
    otherwise one of the failures."""
    by = {(r["task"], r["variant"]): r for r in rows}
    rng = random.Random(seed)
    planned: dict[str, list[str]] = {}
    for t in TASKS:
        variants = []
        for number in range(CHAINS * ROUNDS):
            rnd = number // CHAINS
            u = rng.random()
            variants.append("fast" if u < FAST_BY_ROUND[rnd] else "slow" if u < FAST_BY_ROUND[rnd] + SLOW_BY_ROUND[rnd]
                            else rng.choice(FAILURES))
        planned[t] = variants
    # place them where the replay's order will look for them
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.jsonl"
        probe.write_text("".join(json.dumps({"task": t, "completion": str(i)}) + "\n" for t in TASKS
                                 for i in range(CHAINS * ROUNDS)))
        orders = {t: ReplayGenerator(probe, seed=0).order(t) for t in TASKS}
    lines = []
    for t in TASKS:
        slots: list[dict | None] = [None] * (CHAINS * ROUNDS)
        for number, variant in enumerate(planned[t]):
            slots[orders[t][number]] = with_cost(by[(t, variant)], 1.0)
        lines += slots
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def kernelsearch(*args: str) -> None:
    cmd = [sys.executable, "-m", "search.cli", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stdout.write(res.stdout[-3000:] + res.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(args[:2])}")
    print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs") / time.strftime("budget-%Y%m%d-%H%M%S"))
    parser.add_argument("--plot", type=Path, default=None, help="the figure (by generated tokens) to this PNG")
    parser.add_argument("--report-only", action="store_true", help="the runs in --out exist: only report")
    args = parser.parse_args(argv)
    out = args.out
    runs = {name: out / name for name in ("zero-shot-terse", "zero-shot-careful", "refine")}
    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)
        rows = demo_completions("cpu", DEMO_TASKS) + level2_completions()
        zero_shot_file(out / "terse.jsonl", rows, TERSE, 1.0)
        zero_shot_file(out / "careful.jsonl", rows, CAREFUL, CAREFUL_COST)
        refine_file(out / "refine.jsonl", rows)
        common = ["--tasks", ",".join(TASKS), "--device", "cpu", "--kernel-backend", "cpp", "--no-early-stop"]
        t0 = time.perf_counter()
        kernelsearch("run", "--generator", f"replay:{out / 'terse.jsonl'}", "-n", "10", *common,
                     "--out", str(runs["zero-shot-terse"]))
        kernelsearch("run", "--generator", f"replay:{out / 'careful.jsonl'}", "-n", "10", *common,
                     "--out", str(runs["zero-shot-careful"]))
        kernelsearch("run", "--generator", f"replay:{out / 'refine.jsonl'}", "--strategy", "refine", "-n", str(CHAINS),
                     "--rounds", str(ROUNDS), *common, "--out", str(runs["refine"]))
        print(f"three runs in {time.perf_counter() - t0:.0f} s", flush=True)
    dirs = [str(p) for p in runs.values()]
    for by in ("tokens", "gpu-seconds", "samples"):
        plot = ["--plot", str(args.plot)] if args.plot and by == "tokens" else []
        subprocess.run([sys.executable, "-m", "search.cli", "report", *dirs, "--by", by, "--compare", *plot,
                        "--json"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "150"}, check=True,
                       stdout=open(out / f"report-{by}.txt", "w"))
        text = (out / f"report-{by}.txt").read_text()
        start = text.find(f"pass at budget [95% CI] · by {by}")
        start = text.rfind("\n", 0, max(start, 0)) + 1
        print("\n".join(line for line in text[start:].splitlines() if not line.startswith("{")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
