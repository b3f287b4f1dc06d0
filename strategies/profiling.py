"""Profiling-guided prompting: the zero-shot prompt plus where the reference's time goes on the device.

Before round 0 the oracle profiles the task's reference on its device (`oracle.profile`, through the pool):
each operator's share of the time, its FLOPs and bytes, and whether it is memory- or compute-bound. The
prompt lists that and says what is worth replacing: the memory-bound work, fused into as few passes as
possible (around a library GEMM or convolution, as its epilogue); library GEMM and convolution stay with
cuBLAS/cuDNN unless `replace_library` asks otherwise. Every sample shares the prompt.
"""

from __future__ import annotations

from typing import Any

from strategies.base import Attempt, Strategy, Tools
from strategies.prompts import RULES, SYSTEM, example_block, task_block
from tasks.model import Task

MAX_ROWS = 12


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else "<1%"


def profile_table(profile: dict[str, Any]) -> str:
    """The profile as a small text table, most expensive operator first."""
    lines = ["| operator | share of time | ms a call | GFLOP | MB moved | FLOP/byte | bound |",
             "|---|---|---|---|---|---|---|"]
    for op in profile.get("ops", [])[:MAX_ROWS]:
        kind = f"{op['bound']}-bound" + (", library" if op.get("library") else "")
        lines.append(f"| {op['op']} | {_pct(op['share'])} | {op['time_ms']:.3g} | {op['flops'] / 1e9:.3g} | "
                     f"{op['bytes'] / 1e6:.3g} | {op['intensity']:.3g} | {kind} |")
    hidden = len(profile.get("ops", [])) - MAX_ROWS
    if hidden > 0:
        lines.append(f"| ... {hidden} more | | | | | | |")
    return "\n".join(lines)


def profile_advice(profile: dict[str, Any], replace_library: bool = False) -> str:
    """Where the time goes and what is worth replacing, in words, from a profile."""
    ops = profile.get("ops", [])
    if profile.get("error") or not ops:
        why = profile.get("error") or "no operators were seen"
        return (f"(The reference could not be profiled: {why}.) Replace the elementwise, reduction and "
                "normalisation work with fused kernels; keep library GEMM and convolution.")
    library = [o for o in ops if o.get("library")]
    memory = [o for o in ops if not o.get("library") and o["bound"] == "memory"]
    compute = [o for o in ops if not o.get("library") and o["bound"] == "compute"]
    parts = [f"Profile of the reference on the target device ({profile.get('device', '?')}), measured with "
             f"torch.profiler: {profile.get('total_ms', 0):.3g} ms a call. An operator is memory-bound when its "
             f"FLOPs per byte moved are below the device's ridge point ({profile.get('ridge', 0):g}).",
             profile_table(profile)]
    advice = []
    if memory:
        names = ", ".join(f"{o['op']} ({_pct(o['share'])})" for o in memory)
        share = sum(o["share"] for o in memory)
        advice.append(f"- Worth replacing: the memory-bound operators {names}, {_pct(share)} of the time together. "
                      "Fuse them into one kernel that reads each input once and writes the output once; "
                      "their cost is memory traffic, so every pass you remove is time saved.")
    if library and not replace_library:
        names = ", ".join(f"{o['op']} ({_pct(o['share'])})" for o in library)
        advice.append(f"- Leave the library GEMM/convolution {names} to cuBLAS/cuDNN (call it through PyTorch), and "
                      "fuse the memory-bound work after it into its epilogue: one kernel over its output.")
    elif library:
        names = ", ".join(o["op"] for o in library)
        advice.append(f"- You are asked to replace the library operators too ({names}): write a tiled kernel that "
                      "does the epilogue in registers before the single store.")
    if compute:
        names = ", ".join(f"{o['op']} ({_pct(o['share'])})" for o in compute)
        advice.append(f"- Compute-bound work outside a library: {names}; keep its data in registers or shared memory "
                      "and reuse it.")
    parts.append("What is worth replacing:\n" + "\n".join(advice))
    return "\n\n".join(parts)


class Profiling(Strategy):
    name = "profiling"
    summary = "zero-shot plus the reference's profile on the device: where the time goes, what is memory-bound and worth fusing"

    def __init__(self, backend: str = "cuda", replace_library: bool = False) -> None:
        super().__init__(backend)
        self.replace_library = bool(replace_library)
        self.profiles: dict[str, dict[str, Any]] = {}

    async def prepare(self, task: Task, tools: Tools) -> None:
        self.profiles[task.id] = await tools.profile(task)

    def messages(self, task: Task, round: int, history: list[Attempt]) -> list[dict[str, str]]:
        profile = self.profiles.get(task.id) or {"error": "no profile was made for this task"}
        user = "\n\n".join([
            RULES[self.backend],
            example_block(self.backend),
            f"Now the task. Replace the operators of this `Model` with custom kernels:\n{task_block(task.code)}",
            profile_advice(profile, self.replace_library),
            "Answer with the complete module defining ModelNew in one ```python block.",
        ])
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

    def shares_prompt(self, round: int) -> bool:
        return True

    def options(self) -> dict[str, Any]:
        return {"backend": self.backend, "replace_library": self.replace_library}
