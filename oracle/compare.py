"""Compare a candidate's outputs with the reference's, on the trusted side, and say how they differ.

docs/oracle.md, "Correctness" and "Tolerance policies": every policy of `oracle.tolerance` is decided from one
difference tensor, so a verdict can say which policies its outputs pass; NaN / inf must be exactly where the
reference has them under every policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import torch

from oracle.protocol import ErrorFigures
from oracle.tolerance import (DEFAULT_POLICY, FALLBACK_POLICY, NUMERIC_FACTOR, NUMERIC_FLOOR, POLICIES, UNBOUNDED,
                              V0_1_TOLERANCE, Float64Scale, numeric_bounds, ratio)

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # dtype -> (atol, rtol)
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-6, 1e-6),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (1e-2, 1e-2),
}
SHOWN_MISMATCHES = 3
# Whole-tensor relative error bound, beside the elementwise test: when every reference value is far below
# atol (a softmax over 400k columns is ~2.5e-6 everywhere), an all-zero output would pass elementwise.
MAX_RELATIVE_L2 = 1e-2


@dataclass
class Comparison:
    ok: bool  # under the asked policy
    message: str  # empty when ok
    max_abs_diff: float = 0.0
    passes: list[str] = field(default_factory=list)  # every policy these outputs pass
    figures: ErrorFigures | None = None


@dataclass
class _Outcome:
    """One policy's answer for one output: passed, its worst error over its bound, and why not."""

    ok: bool
    over_bound: float
    message: str = ""


def _fmt_index(flat: int, shape: torch.Size) -> str:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim)
        flat //= dim
    return "[" + ", ".join(map(str, reversed(idx))) + "]"


def compare(out: object, ref: torch.Tensor, label: str = "output", policy: str = DEFAULT_POLICY,
            correction: torch.Tensor | None = None, scale: Float64Scale | None = None) -> Comparison:
    """Check one output tensor against the reference tensor under every policy at once (the figures come
    from one difference tensor); `ok` and `message` are the asked `policy`'s. `correction` (ref64 - ref, in
    float32) and `scale` come from the float64 reference; without them `numeric` falls back to kernelbench."""
    if type(out) is not torch.Tensor:
        return Comparison(False, f"{label} is a {type(out).__name__}, expected a plain torch.Tensor")
    if out.shape != ref.shape:
        return Comparison(False, f"{label} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Comparison(False, f"{label} has dtype {out.dtype}, expected {ref.dtype}")
    if not ref.is_floating_point():
        return _exact_integers(out, ref, label)
    quick = _clear_pass(out, ref, correction, scale)
    if quick is not None:
        return quick
    return _exact(out, ref, label, policy, correction, scale)


# The quick path decides a policy only with this much room under its bound: `torch.isclose` computes the
# bound in the output's own dtype, so a figure within a rounding error of 1 is left to the exact path.
CLEAR_MARGIN = 0.99


# The quick path walks large outputs in pieces of this many elements (256 MB of float32): its temporaries
# then stay a few pieces' size, not several times a gigabyte output's, in the process that keeps references.
CHUNK_ELEMENTS = 64 * 1024**2


@dataclass
class _ClearSums:
    """What `_clear_pass` gathers piece by piece: peaks, and norms kept as Python floats (combined exactly
    as sqrt of summed squares, in double precision)."""

    max_diff: float = 0.0
    max_rel: float = 0.0
    worst_ratio: float = 0.0  # max |d| / (1 + |ref|)
    ref_sq: float = 0.0  # of |ref|
    diff_sq: float = 0.0
    err_sq: float = 0.0  # numeric: of the error against float64
    ref64_sq: float = 0.0
    err_peak: float = 0.0
    ref64_peak: float = 0.0

    def add(self, out: torch.Tensor, ref: torch.Tensor, correction: torch.Tensor | None) -> bool:
        """One piece; False when it holds a value that is not finite (the exact path decides)."""
        wide = torch.promote_types(ref.dtype, torch.float32)
        signed = out.to(wide) - ref.to(wide)
        if not bool(torch.isfinite(signed).all()):  # NaN or inf in either (inf - inf, NaN - x are not finite)
            return False
        if correction is not None:
            err = signed - correction.to(wide)
            ref64 = ref.to(wide) + correction.to(wide)
            if not (bool(torch.isfinite(err).all()) and bool(torch.isfinite(ref64).all())):
                return False
            self.ref64_sq += float(torch.linalg.vector_norm(ref64)) ** 2
            self.ref64_peak = max(self.ref64_peak, float(ref64.abs().max()))
            self.err_sq += float(torch.linalg.vector_norm(err)) ** 2
            self.err_peak = max(self.err_peak, float(err.abs().max()))
            del err, ref64
        diff = signed.abs_()
        abs_ref = ref.to(wide).abs()
        self.max_diff = max(self.max_diff, float(diff.max()))
        nonzero = abs_ref > 0
        rel = diff / abs_ref  # inf or NaN where ref is 0: those are left out
        self.max_rel = max(self.max_rel, float(rel.masked_fill_(~nonzero, 0).max()))
        del rel, nonzero
        self.ref_sq += float(torch.linalg.vector_norm(abs_ref)) ** 2
        self.diff_sq += float(torch.linalg.vector_norm(diff)) ** 2
        self.worst_ratio = max(self.worst_ratio, float(diff.div_(abs_ref.add_(1)).max()))  # in place: nothing kept
        return True


def _clear_pass(out: torch.Tensor, ref: torch.Tensor, correction: torch.Tensor | None = None,
                scale: Float64Scale | None = None) -> Comparison | None:
    """The figures and verdicts of `compare` in a fraction of its passes over the tensors, for the common case
    of an output that is finite and clearly within every policy's bound: atol = rtol for every dtype and
    kernelbench policy, so |d| <= atol + rtol |ref| is |d| / (1 + |ref|) <= atol, one ratio tensor for both;
    `numeric`'s error against float64 is (out - ref) - correction, in float32 (both terms are tiny, so it is
    exact to float32's rounding of the error itself). None (the exact path decides) when anything is
    non-finite, near a bound, or over one; a large output then costs the full comparison only when it fails."""
    atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    if atol != rtol or not out.numel():
        return None
    numeric = correction is not None and scale is not None
    sums = _ClearSums()
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    flat_corr = correction.reshape(-1) if numeric else None
    for start in range(0, flat_ref.numel(), CHUNK_ELEMENTS):
        piece = slice(start, start + CHUNK_ELEMENTS)
        if not sums.add(flat_out[piece], flat_ref[piece], flat_corr[piece] if flat_corr is not None else None):
            return None
    figures = ErrorFigures()
    over: dict[str, float] = {}
    if numeric:
        ref_norm, err_norm = math.sqrt(sums.ref64_sq), math.sqrt(sums.err_sq)
        l2_bound, elem_bound = numeric_bounds(scale, ref_norm, sums.ref64_peak)
        over["numeric"] = max(ratio(err_norm, l2_bound), ratio(sums.err_peak, elem_bound))
        figures.rel_l2_64 = _bounded(err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else UNBOUNDED))
        figures.ref32_rel_l2_64 = scale.rel_l2
    over["kernelbench"] = sums.worst_ratio / atol
    over["kernelbench-v0.1"] = sums.worst_ratio / V0_1_TOLERANCE
    ref_norm32 = math.sqrt(sums.ref_sq)
    if ref_norm32 > 0:
        over["kernelbench"] = max(over["kernelbench"], math.sqrt(sums.diff_sq) / ref_norm32 / MAX_RELATIVE_L2)
    over.setdefault("numeric", over[FALLBACK_POLICY])  # no float64 reference: numeric judges as kernelbench
    if max(over.values()) > CLEAR_MARGIN:
        return None
    figures.max_abs, figures.max_rel = _bounded(sums.max_diff), _bounded(sums.max_rel)
    figures.over_bound = {name: _bounded(over[name]) for name in POLICIES}
    return Comparison(True, "", sums.max_diff, list(POLICIES), figures)


def _bounded(x: float) -> float:
    """A figure JSON can carry: overflowed or undefined ones (inf, NaN) as UNBOUNDED."""
    return x if math.isfinite(x) and x < UNBOUNDED else UNBOUNDED


# The exact path walks outputs in smaller pieces (16M elements: 128 MB of float64): it keeps a few float64
# temporaries of a piece at once, where over whole tensors a 1 GB wrong output took 27 GB of device memory.
EXACT_CHUNK_ELEMENTS = 16 * 1024**2


def _pieces(*tensors: torch.Tensor | None, size: int | None = None) -> Iterator[tuple[int, list]]:
    """(offset, [the same flat slice of each tensor]) over tensors of one shape; None stays None."""
    size = size or EXACT_CHUNK_ELEMENTS
    flat = [t.reshape(-1) if t is not None else None for t in tensors]
    total = next(f for f in flat if f is not None).numel()
    for start in range(0, total, size):
        yield start, [f[start:start + size] if f is not None else None for f in flat]


@dataclass
class _Mismatches:
    """Wrong elements gathered piece by piece: how many, and the first few flat positions."""

    count: int = 0
    first: list[int] = field(default_factory=list)

    def add(self, bad: torch.Tensor, offset: int) -> None:
        n = int(bad.sum())
        if not n:
            return
        self.count += n
        if len(self.first) < SHOWN_MISMATCHES:
            positions = bad.nonzero().flatten()[:SHOWN_MISMATCHES - len(self.first)]
            self.first.extend(int(p) + offset for p in positions.tolist())


@dataclass
class _ExactSums:
    """What the exact path gathers over the pieces of one floating-point output (every figure `compare`
    reports, for every policy); the `numeric` policy's elementwise count needs its bound, which needs the
    norms, so it takes a second walk (`numeric_mismatches`)."""

    atol: float
    rtol: float
    max_diff: float = 0.0
    max_rel: float = 0.0
    diff_sq: float = 0.0
    ref_sq: float = 0.0
    worst: dict[str, float] = field(default_factory=lambda: {"kernelbench": 0.0, "kernelbench-v0.1": 0.0})
    wrong: dict[str, _Mismatches] = field(default_factory=lambda: {"kernelbench": _Mismatches(),
                                                                    "kernelbench-v0.1": _Mismatches()})
    misplaced: _Mismatches = field(default_factory=_Mismatches)  # NaN / inf not where the reference has them
    nan_out: int = 0
    nan_ref: bool = False
    ref64_sq: float = 0.0
    ref64_peak: float = 0.0
    err_sq: float = 0.0
    err_peak: float = 0.0

    def tolerances(self) -> dict[str, tuple[float, float]]:
        return {"kernelbench": (self.atol, self.rtol), "kernelbench-v0.1": (V0_1_TOLERANCE, V0_1_TOLERANCE)}

    def add(self, offset: int, out: torch.Tensor, ref: torch.Tensor, correction: torch.Tensor | None) -> None:
        wide = torch.promote_types(ref.dtype, torch.float32)
        finite = torch.isfinite(ref) & torch.isfinite(out)
        diff = torch.where(finite, (out.to(wide) - ref.to(wide)).abs(), 0)
        abs_ref = torch.where(finite, ref.to(wide).abs(), 0)
        if diff.numel():
            self.max_diff = max(self.max_diff, float(diff.max()))
        nonzero = abs_ref > 0
        if nonzero.any():
            self.max_rel = max(self.max_rel, float(torch.where(nonzero, diff / abs_ref, 0).max()))
        del nonzero
        self.diff_sq += float(torch.linalg.vector_norm(diff)) ** 2
        self.ref_sq += float(torch.linalg.vector_norm(abs_ref)) ** 2
        for name, (atol, rtol) in self.tolerances().items():
            self.wrong[name].add(~torch.isclose(out, ref, rtol=rtol, atol=atol, equal_nan=True), offset)
            if diff.numel():
                self.worst[name] = max(self.worst[name], float((diff / (atol + rtol * abs_ref)).max()))
        del diff, abs_ref
        same = torch.where(torch.isfinite(ref), torch.isfinite(out), (out == ref) | (torch.isnan(out) & torch.isnan(ref)))
        self.misplaced.add(~same, offset)
        del same
        self.nan_out += int(torch.isnan(out).sum())
        self.nan_ref = self.nan_ref or bool(torch.isnan(ref).any())
        if correction is not None:
            ref64 = torch.where(finite, ref.double() + correction.double(), 0)
            err = torch.where(finite, out.double() - ref64, 0)
            self.ref64_sq += float(torch.linalg.vector_norm(ref64)) ** 2
            self.err_sq += float(torch.linalg.vector_norm(err)) ** 2
            if err.numel():
                self.ref64_peak = max(self.ref64_peak, float(ref64.abs().max()))
                self.err_peak = max(self.err_peak, float(err.abs().max()))


def _exact(out: torch.Tensor, ref: torch.Tensor, label: str, policy: str, correction: torch.Tensor | None,
           scale: Float64Scale | None) -> Comparison:
    """Every policy's verdict and figures for a floating-point output the quick path left undecided."""
    atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    sums = _ExactSums(atol, rtol)
    for offset, (o, r, c) in _pieces(out, ref, correction if scale is not None else None):
        sums.add(offset, o, r, c)
    outcomes = {name: _elementwise(sums, name, out, ref, label) for name in sums.tolerances()}
    figures = ErrorFigures(max_abs=_bounded(sums.max_diff), max_rel=_bounded(sums.max_rel))
    if correction is not None and scale is not None:
        outcomes["numeric"], rel = _numeric(sums, out, ref, correction, scale, label)
        figures.rel_l2_64 = _bounded(rel)
        figures.ref32_rel_l2_64 = scale.rel_l2
    else:
        outcomes["numeric"] = outcomes[FALLBACK_POLICY]
    figures.over_bound = {name: _bounded(o.over_bound) for name, o in outcomes.items()}
    passes = [name for name in POLICIES if outcomes[name].ok]
    chosen = outcomes[policy]
    return Comparison(chosen.ok, chosen.message, sums.max_diff, passes, figures)


def _elementwise(sums: _ExactSums, name: str, out: torch.Tensor, ref: torch.Tensor, label: str) -> _Outcome:
    """|out - ref| <= atol + rtol * |ref| (torch.isclose, in the output's dtype: the decision KernelBench
    makes), NaN and inf where the reference has them, and for `kernelbench` the relative L2 guard."""
    atol, rtol = sums.tolerances()[name]
    worst = sums.worst[name]
    wrong = sums.wrong[name]
    if wrong.count:
        message = _mismatch_message(out, ref, wrong, sums, label, f"atol={atol:g}, rtol={rtol:g}", sums.max_diff)
        over = UNBOUNDED if sums.misplaced.count else max(worst, math.nextafter(1.0, 2.0))
        return _Outcome(False, over, message)
    if name != "kernelbench":
        return _Outcome(True, worst)
    ref_norm = math.sqrt(sums.ref_sq)
    if ref_norm > 0:
        rel = math.sqrt(sums.diff_sq) / ref_norm
        worst = max(worst, rel / MAX_RELATIVE_L2)
        if rel > MAX_RELATIVE_L2:
            return _Outcome(False, worst, f"{label}: relative L2 error {rel:.3g} > {MAX_RELATIVE_L2:g} (each element "
                            "is within atol only because the values are tiny)")
    return _Outcome(True, worst)


def _numeric(sums: _ExactSums, out: torch.Tensor, ref: torch.Tensor, correction: torch.Tensor, scale: Float64Scale,
             label: str) -> tuple[_Outcome, float]:
    """The `numeric` policy (oracle.tolerance): the error against float64, over the float32 reference's own."""
    if sums.misplaced.count:
        return _Outcome(False, UNBOUNDED, _mismatch_message(out, ref, sums.misplaced, sums, label,
                                                            "NaN and inf where the reference has them")), UNBOUNDED
    ref_norm, err_norm = math.sqrt(sums.ref64_sq), math.sqrt(sums.err_sq)
    l2_bound, elem_bound = numeric_bounds(scale, ref_norm, sums.ref64_peak)
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else UNBOUNDED)
    worst = max(ratio(err_norm, l2_bound), ratio(sums.err_peak, elem_bound))
    wrong = _Mismatches()
    if sums.err_peak > elem_bound:  # some element is over: a second walk finds which
        for offset, (o, r, c) in _pieces(out, ref, correction):
            finite = torch.isfinite(r) & torch.isfinite(o)
            err = torch.where(finite, o.double() - (r.double() + c.double()), 0)
            wrong.add(err.abs() > elem_bound, offset)
    if wrong.count:
        return _Outcome(False, worst, _mismatch_message(
            out, ref, wrong, sums, label, f"numeric: more than {elem_bound:.3g} from the float64 reference, "
            f"{NUMERIC_FACTOR:g}x the float32 reference's own largest error")), rel
    if err_norm > l2_bound:
        return _Outcome(False, worst, f"{label}: relative L2 error against a float64 reference {rel:.3g}, over "
                        f"{NUMERIC_FACTOR:g}x the float32 reference's own ({scale.rel_l2:.3g}, at least "
                        f"{NUMERIC_FLOOR:.3g}): the kernel computes in lower precision than float32?"), rel
    return _Outcome(True, worst), rel


def _exact_integers(out: torch.Tensor, ref: torch.Tensor, label: str) -> Comparison:
    """An integer (or bool) output must be equal everywhere."""
    wrong = _Mismatches()
    max_abs = 0.0
    for offset, (o, r) in _pieces(out, ref):
        bad = o != r
        wrong.add(bad, offset)
        if bad.any():
            max_abs = max(max_abs, float((o.double() - r.double()).abs().max()))
    if not wrong.count:
        return Comparison(True, "", passes=list(POLICIES), figures=ErrorFigures())
    message = _mismatch_message(out, ref, wrong, None, label, "exact match required")
    return Comparison(False, message, figures=ErrorFigures(max_abs=max_abs, max_rel=UNBOUNDED,
                                                           over_bound={p: UNBOUNDED for p in POLICIES}))


def _mismatch_message(out: torch.Tensor, ref: torch.Tensor, wrong: _Mismatches, sums: _ExactSums | None, label: str,
                      tol: str, max_diff: float = 0.0) -> str:
    total = out.numel()
    flat_o, flat_r = out.reshape(-1), ref.reshape(-1)
    shown = [f"at {_fmt_index(p, out.shape)} expected {flat_r[p].item():.6g}, got {flat_o[p].item():.6g}"
             for p in wrong.first]
    unwritten = sums is not None and sums.nan_out and not sums.nan_ref
    extra = f"; {sums.nan_out} NaN in the output (unwritten elements?)" if unwritten else ""
    return (f"{label}: {wrong.count} of {total} elements wrong ({100 * wrong.count / total:.3g}%, {tol}); "
            + "; ".join(shown) + (f"; max abs diff {max_diff:.3g}" if max_diff else "") + extra)
