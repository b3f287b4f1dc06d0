"""Fit a task's problem size to a memory budget by rewriting its module-level size constants.

KernelBench level-1 inputs reach several GB, more than a CPU test or a small GPU should hold.

The rule (recorded with every result through `Task.sizes` and `Task.original_sizes`):
1. The size constants are the module-level assignments of an integer expression made only of literals
   (`N = 2048 * 2`, `batch_size = 16`, `height = width = 128`), or of a tuple of such expressions
   (`input_shape = (4096, 32)`; its largest element counts as its size and is the one halved).
2. A constant may shrink only if it is at least 8 and its name does not mark a shape parameter whose
   change would alter the operator itself (kernel, stride, padding, dilation, groups, heads, pool).
   Smaller constants are usually axes (`dim = 1`), channel counts or kernel sizes, and stay.
3. While the inputs of `get_inputs()` exceed the budget: halve the largest shrinkable constant (the
   earliest on a tie). If the halved task no longer builds or runs on the meta device (a divisibility
   constraint, say), restore it and try the next largest instead. If no single constant can be halved,
   halve all shrinkable constants of one value together, largest value first (`batch_size = 32768`
   with `input_shape = (32768,)` broadcast against each other, so they only shrink as a pair).
4. If nothing can shrink and the inputs still exceed the budget, the task cannot be fitted: the error
   says how large its inputs remain.
Halving keeps powers of two and most divisibility between sizes, and the shapes stay in proportion.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from tasks.ast_parse import parse
from tasks.runtime import ShapeProbe, TaskCodeError, exec_task_code, probe

MIB = 1024 * 1024
MIN_SHRINKABLE = 8
PROTECTED = re.compile(r"kernel|stride|padding|dilation|group|head|pool", re.IGNORECASE)
CPU_BUDGET_MB = 256.0
GPU_BUDGET_FRACTION = 1 / 32  # inputs are held in several rotating sets, beside outputs and references


class FitError(Exception):
    """The task cannot be fitted to the budget; the message says why."""


Size = int | tuple[int, ...]


@dataclass
class SizeConstant:
    name: str
    value: Size
    lineno: int  # first line of the assignment statement
    end_lineno: int

    @property
    def magnitude(self) -> int:
        return max(self.value, default=0) if isinstance(self.value, tuple) else self.value

    def halved(self) -> Size:
        if isinstance(self.value, tuple):
            i = self.value.index(self.magnitude)
            return self.value[:i] + (self.value[i] // 2,) + self.value[i + 1 :]
        return self.value // 2


def _int_expr(node: ast.AST) -> int | None:
    """The value of an integer expression made only of literals, or None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _int_expr(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp):
        a, b = _int_expr(node.left), _int_expr(node.right)
        if a is None or b is None:
            return None
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
        if type(node.op) in ops:
            return ops[type(node.op)]
        if isinstance(node.op, ast.FloorDiv) and b:
            return a // b
        if isinstance(node.op, ast.Pow) and 0 <= b <= 64:
            return a**b
    return None


def size_constants(code: str) -> list[SizeConstant]:
    """Module-level integer constants, in source order (rule 1)."""
    found = []
    for stmt in parse(code).body:
        if not isinstance(stmt, ast.Assign):
            continue
        value: Size | None = _int_expr(stmt.value)
        if value is None and isinstance(stmt.value, ast.Tuple) and stmt.value.elts:
            elements = [_int_expr(e) for e in stmt.value.elts]
            value = None if None in elements else tuple(elements)  # type: ignore[arg-type]
        if value is None:
            continue
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                found.append(SizeConstant(target.id, value, stmt.lineno, stmt.end_lineno or stmt.lineno))
    return found


def shrinkable(const: SizeConstant) -> bool:
    return const.magnitude >= MIN_SHRINKABLE and not PROTECTED.search(const.name)


def _literal(value: Size) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def rewrite_sizes(code: str, new_values: dict[str, Size]) -> str:
    """Return the code with the named module-level constants set to new literal values.

    Whole assignment statements are replaced by one line per name, so `h = w = 128` becomes two lines
    when only one of them changes; comments and the rest of the code stay as written.
    """
    lines = code.splitlines(keepends=True)
    consts = size_constants(code)
    by_stmt: dict[tuple[int, int], list[SizeConstant]] = {}
    for c in consts:
        by_stmt.setdefault((c.lineno, c.end_lineno), []).append(c)
    for (start, end), group in sorted(by_stmt.items(), reverse=True):
        if not any(c.name in new_values for c in group):
            continue
        new = "".join(f"{c.name} = {_literal(new_values.get(c.name, c.value))}\n" for c in group)
        lines[start - 1 : end] = [new]
    return "".join(lines)


@dataclass
class FitResult:
    code: str
    sizes: dict[str, Size]
    original_sizes: dict[str, Size]  # only those that changed, with their values as written
    input_bytes: int
    original_input_bytes: int
    meta_error: str | None  # the model did not build (or, if fitting shrank it, run) on the meta device
    output_bytes: int = 0  # of one forward's outputs at the fitted size (0: unknown, it did not run on meta)


def _probe_code(code: str, origin: str, forward: bool = True) -> ShapeProbe:
    return probe(exec_task_code(code, origin), forward)


def _halvings(code: str, origin: str, base: ShapeProbe) -> Iterator[tuple[list[SizeConstant], str, ShapeProbe]]:
    """Valid one-step shrinks of `code`: single constants largest first, then tied groups (rule 3)."""
    consts = sorted((c for c in size_constants(code) if shrinkable(c)), key=lambda c: -c.magnitude)
    groups = [[c] for c in consts]
    for value in sorted({c.magnitude for c in consts}, reverse=True):
        tied = [c for c in consts if c.magnitude == value]
        if len(tied) > 1:
            groups.append(tied)
    for group in groups:
        trial_code = rewrite_sizes(code, {c.name: c.halved() for c in group})
        try:
            trial = _probe_code(trial_code, origin)
        except TaskCodeError:
            continue
        # A halving that breaks the model on meta (where it ran before) violates a size constraint.
        if (trial.meta_error and not base.meta_error) or trial.input_bytes >= base.input_bytes:
            continue
        yield group, trial_code, trial


def fit(code: str, budget_mb: float | None, origin: str = "<task>") -> FitResult:
    """Shrink the task's size constants until its inputs fit `budget_mb` (None: no limit)."""
    first = _probe_code(code, origin)
    current, current_code = first, code
    if budget_mb is not None:
        while current.input_bytes > budget_mb * MIB:
            step = next(_halvings(current_code, origin, current), None)
            if step is None:
                raise FitError(
                    f"inputs stay at {current.input_bytes / MIB:.1f} MB > budget {budget_mb:g} MB: "
                    "no size constant left that can shrink them"
                )
            _, current_code, current = step
    original = {c.name: c.value for c in size_constants(code)}
    sizes = {c.name: c.value for c in size_constants(current_code)}
    return FitResult(
        code=current_code,
        sizes=sizes,
        original_sizes={k: v for k, v in original.items() if sizes.get(k) != v},
        input_bytes=current.input_bytes,
        original_input_bytes=first.input_bytes,
        meta_error=current.meta_error,
        output_bytes=current.output_bytes,
    )


def shrink_once(code: str, origin: str = "<task>") -> str | None:
    """The task at a second, smaller size (for checking that a kernel is size-generic), or None.

    Halves the largest shrinkable constant that keeps the model valid, by the same rule as `fit`.
    """
    step = next(_halvings(code, origin, _probe_code(code, origin)), None)
    return None if step is None else step[1]


def gpu_memory_mb() -> float | None:
    """Total memory of the first visible GPU, read by nvidia-smi (the caller must not touch CUDA)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def default_budget_mb(device: str) -> float:
    """256 MB of inputs on a CPU; on a GPU, 1/32 of its memory (about 4.4 GB on a 141 GB H200)."""
    if device == "cuda":
        total = gpu_memory_mb()
        if total:
            return round(total * GPU_BUDGET_FRACTION)
    return CPU_BUDGET_MB
