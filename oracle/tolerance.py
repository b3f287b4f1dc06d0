"""Tolerance policies: when a candidate's floating-point output counts as the reference's (docs/oracle.md,
"Tolerance policies").

Two policies are KernelBench's rules, so that a kernel gets the verdict KernelBench would give it; the third
asks how far the candidate is from the exact answer, measured against how far PyTorch's own float32
reference is from it:

- `kernelbench` (the default): |out - ref| <= atol + rtol * |ref| elementwise with per-dtype tolerances
  (fp32 1e-4, fp16/bf16 1e-2), plus a whole-tensor relative L2 guard (`oracle.compare.MAX_RELATIVE_L2`).
- `kernelbench-v0.1`: the first KernelBench release's rule, atol = rtol = 1e-2 for every dtype, no L2 guard.
- `numeric`: the trusted side also runs the reference in float64. With e = out - ref64 and d = ref32 - ref64
  (PyTorch's own rounding error on this task), a candidate passes when
      ||e||_2 <= K * max(s_l2, FLOOR) * ||ref64||_2   and   max|e| <= K * max(s_max, FLOOR) * max|ref64|,
  where s_l2 = ||d|| / ||ref64|| and s_max = max|d| / max|ref64|, each the largest over the task's checks.

Why these choices: the norm test is the main one, because the sum of many squared errors is stable where a
single element's error is luck (an element the float32 reference happens to get exactly right would
otherwise demand an exact answer there). The elementwise test against a whole-tensor scale catches what a
norm hides: one wrong element among millions. Taking the scales over every check (six seeds and two sizes)
steadies them where one check has few elements, such as a scalar loss. FLOOR = 2**-20 (eight float32 ulps
at 1.0) covers tasks whose float32 reference is exact (a ReLU: d = 0), where only the floor is left.
K = 32 leaves room for a different summation order (a sequential float32 loop over K = 4096 to 65536
against a library GEMM comes to 0.1 to 0.3 of the bound), while output rounded to bfloat16 (relative error
about 1e-3) or fp16 (about 3e-4) is 15 to 100 times over it. Where the float32 reference is far more
accurate than FLOOR (a pairwise sum), the floor sets the bound: a sequential sum of a million [0, 1)
values comes to about 0.1 of it.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("kernelbench", "kernelbench-v0.1", "numeric")
DEFAULT_POLICY = "kernelbench"
# Where the float64 reference cannot be made (an operator without a float64 kernel, out of memory), `numeric`
# falls back to this one, and the verdict carries FALLBACK_FLAG.
FALLBACK_POLICY = "kernelbench"
FALLBACK_FLAG = "numeric_fell_back_to_kernelbench"

V0_1_TOLERANCE = 1e-2  # kernelbench-v0.1: atol = rtol, every dtype
NUMERIC_FACTOR = 32.0  # K: how many times the float32 reference's own error a candidate may make
NUMERIC_FLOOR = 2.0 ** -20  # the smallest relative scale, for tasks whose float32 reference is exact

# An error over a zero bound (or a misplaced NaN) has no finite ratio; JSON records carry this instead.
UNBOUNDED = 1e30


def check_policy(name: str) -> str:
    """The policy's name, or a ValueError that lists the known ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown tolerance policy {name!r} (known: {', '.join(POLICIES)})")
    return name


@dataclass
class Float64Scale:
    """How far the float32 reference is from the float64 one, for one output of a task: the largest over
    the task's checks of the relative L2 error and of the largest error over the largest value."""

    rel_l2: float
    rel_max: float

    def merged(self, other: "Float64Scale") -> "Float64Scale":
        return Float64Scale(max(self.rel_l2, other.rel_l2), max(self.rel_max, other.rel_max))


def ratio(error: float, bound: float) -> float:
    """error / bound, 0 for no error, UNBOUNDED for an error over a zero bound."""
    if error <= 0:
        return 0.0
    if bound <= 0:
        return UNBOUNDED
    return min(error / bound, UNBOUNDED)


def numeric_bounds(scale: Float64Scale, ref64_norm: float, ref64_peak: float) -> tuple[float, float]:
    """The `numeric` policy's (L2 bound, elementwise bound) for one output with these float64 figures."""
    return (NUMERIC_FACTOR * max(scale.rel_l2, NUMERIC_FLOOR) * ref64_norm,
            NUMERIC_FACTOR * max(scale.rel_max, NUMERIC_FLOOR) * ref64_peak)
