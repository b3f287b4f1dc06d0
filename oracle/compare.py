"""Compare a candidate's outputs with the reference's, on the trusted side, and say how they differ.

docs/oracle.md, "Correctness" and "Tolerance policies": every policy of `oracle.tolerance` is decided from one
difference tensor, so a verdict can say which policies its outputs pass; NaN / inf must be exactly where the
reference has them under every policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
        bad = (out != ref).flatten()
        if not bad.any():
            return Comparison(True, "", passes=list(POLICIES), figures=ErrorFigures())
        wrong = _mismatch_message(out, ref, bad, label, "exact match required")
        return Comparison(False, wrong.message, figures=ErrorFigures(
            max_abs=float((out.double() - ref.double()).abs().max()), max_rel=UNBOUNDED,
            over_bound={p: UNBOUNDED for p in POLICIES}))
    quick = _clear_pass(out, ref, correction, scale)
    if quick is not None:
        return quick
    wide = torch.promote_types(ref.dtype, torch.float32)
    finite = torch.isfinite(ref) & torch.isfinite(out)
    diff = torch.where(finite, (out.to(wide) - ref.to(wide)).abs(), 0)
    abs_ref = torch.where(finite, ref.to(wide).abs(), 0)  # once, for every policy's bound
    max_diff = float(diff.max()) if diff.numel() else 0.0
    nonzero = abs_ref > 0
    max_rel = float(torch.where(nonzero, diff / abs_ref, 0).max()) if nonzero.any() else 0.0
    atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    outcomes = {"kernelbench": _elementwise(out, ref, diff, abs_ref, atol, rtol, label, l2_guard=True),
                "kernelbench-v0.1": _elementwise(out, ref, diff, abs_ref, V0_1_TOLERANCE, V0_1_TOLERANCE, label,
                                                 l2_guard=False)}
    figures = ErrorFigures(max_abs=_bounded(max_diff), max_rel=_bounded(max_rel))
    if correction is not None and scale is not None:
        outcomes["numeric"], rel = _numeric(out, ref, correction, scale, finite, label)
        figures.rel_l2_64 = _bounded(rel)
        figures.ref32_rel_l2_64 = scale.rel_l2
    else:
        outcomes["numeric"] = outcomes[FALLBACK_POLICY]
    figures.over_bound = {name: _bounded(o.over_bound) for name, o in outcomes.items()}
    passes = [name for name in POLICIES if outcomes[name].ok]
    chosen = outcomes[policy]
    return Comparison(chosen.ok, chosen.message, max_diff, passes, figures)


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


def _elementwise(out, ref, diff, abs_ref, atol: float, rtol: float, label: str, l2_guard: bool) -> _Outcome:
    """|out - ref| <= atol + rtol * |ref| (torch.isclose, in the output's dtype: the decision KernelBench
    makes), NaN and inf where the reference has them, and optionally the relative L2 guard."""
    good = torch.isclose(out, ref, rtol=rtol, atol=atol, equal_nan=True)
    bad = ~good.flatten()
    bound = atol + rtol * abs_ref
    worst = float((diff / bound).max()) if diff.numel() else 0.0
    if bad.any():
        wrong = _mismatch_message(out, ref, bad, label, f"atol={atol:g}, rtol={rtol:g}", float(diff.max()))
        over = UNBOUNDED if _misplaced(out, ref) else max(worst, math.nextafter(1.0, 2.0))
        return _Outcome(False, over, wrong.message)
    if not l2_guard:
        return _Outcome(True, worst)
    ref_norm = float(torch.linalg.vector_norm(abs_ref))
    if ref_norm > 0:
        rel = float(torch.linalg.vector_norm(diff)) / ref_norm
        worst = max(worst, rel / MAX_RELATIVE_L2)
        if rel > MAX_RELATIVE_L2:
            return _Outcome(False, worst, f"{label}: relative L2 error {rel:.3g} > {MAX_RELATIVE_L2:g} (each element "
                            "is within atol only because the values are tiny)")
    return _Outcome(True, worst)


def _misplaced(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Some NaN or inf is not where the reference has it (no tolerance makes that right)."""
    same = torch.where(torch.isfinite(ref), torch.isfinite(out), (out == ref) | (torch.isnan(out) & torch.isnan(ref)))
    return not bool(same.all())


def _numeric(out, ref, correction, scale: Float64Scale, finite, label: str) -> tuple[_Outcome, float]:
    """The `numeric` policy (oracle.tolerance): the error against float64, over the float32 reference's own."""
    if _misplaced(out, ref):
        bad = ~torch.isclose(out, ref, rtol=0, atol=float("inf"), equal_nan=True).flatten()
        return _Outcome(False, UNBOUNDED, _mismatch_message(out, ref, bad, label, "NaN and inf where the reference "
                                                            "has them").message), UNBOUNDED
    ref64 = torch.where(finite, ref.double() + correction.double(), 0)
    err = torch.where(finite, out.double() - ref64, 0)
    ref_norm = float(torch.linalg.vector_norm(ref64))
    ref_peak = float(ref64.abs().max()) if ref64.numel() else 0.0
    err_norm = float(torch.linalg.vector_norm(err))
    l2_bound, elem_bound = numeric_bounds(scale, ref_norm, ref_peak)
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else UNBOUNDED)
    elem = err.abs().flatten()
    worst = max(ratio(err_norm, l2_bound), ratio(float(elem.max()) if elem.numel() else 0.0, elem_bound))
    bad = elem > elem_bound
    if bad.any():
        return _Outcome(False, worst, _mismatch_message(
            out, ref, bad, label, f"numeric: more than {elem_bound:.3g} from the float64 reference, {NUMERIC_FACTOR:g}x "
            f"the float32 reference's own largest error").message), rel
    if err_norm > l2_bound:
        return _Outcome(False, worst, f"{label}: relative L2 error against a float64 reference {rel:.3g}, over "
                        f"{NUMERIC_FACTOR:g}x the float32 reference's own ({scale.rel_l2:.3g}, at least "
                        f"{NUMERIC_FLOOR:.3g}): the kernel computes in lower precision than float32?"), rel
    return _Outcome(True, worst), rel


def _mismatch_message(out, ref, bad, label, tol, max_diff: float = 0.0) -> Comparison:
    positions = bad.nonzero().flatten()
    n_bad, total = positions.numel(), bad.numel()
    shown = []
    flat_o, flat_r = out.flatten(), ref.flatten()
    for p in positions[:SHOWN_MISMATCHES].tolist():
        shown.append(f"at {_fmt_index(p, out.shape)} expected {flat_r[p].item():.6g}, got {flat_o[p].item():.6g}")
    nan_count = int(torch.isnan(out).sum()) if out.is_floating_point() else 0
    extra = f"; {nan_count} NaN in the output (unwritten elements?)" if nan_count and not torch.isnan(ref).any() else ""
    message = (
        f"{label}: {n_bad} of {total} elements wrong ({100 * n_bad / total:.3g}%, {tol}); "
        + "; ".join(shown)
        + (f"; max abs diff {max_diff:.3g}" if max_diff else "")
        + extra
    )
    return Comparison(False, message, max_diff)
