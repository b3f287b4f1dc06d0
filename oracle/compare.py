"""Compare a candidate's outputs with the reference's, on the trusted side, and say how they differ.

docs/oracle.md, "Correctness": elementwise |out - ref| <= atol + rtol * |ref| with per-dtype tolerances, and
NaN / inf exactly where the reference has them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    ok: bool
    message: str  # empty when ok
    max_abs_diff: float = 0.0


def _fmt_index(flat: int, shape: torch.Size) -> str:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim)
        flat //= dim
    return "[" + ", ".join(map(str, reversed(idx))) + "]"


def compare(out: object, ref: torch.Tensor, label: str = "output") -> Comparison:
    """Check one output tensor against the reference tensor."""
    if type(out) is not torch.Tensor:
        return Comparison(False, f"{label} is a {type(out).__name__}, expected a plain torch.Tensor")
    if out.shape != ref.shape:
        return Comparison(False, f"{label} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Comparison(False, f"{label} has dtype {out.dtype}, expected {ref.dtype}")
    if not ref.is_floating_point():
        bad = (out != ref).flatten()
        if not bad.any():
            return Comparison(True, "")
        return _mismatch_message(out, ref, bad, label, "exact match required")
    atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    # isclose is |out - ref| <= atol + rtol * |ref|, with NaN only where NaN and inf only where the same inf.
    good = torch.isclose(out, ref, rtol=rtol, atol=atol, equal_nan=True)
    bad = ~good.flatten()
    finite = torch.isfinite(ref) & torch.isfinite(out)
    diff = (out.float() - ref.float()).abs()[finite]
    max_diff = float(diff.max()) if diff.numel() else 0.0
    if bad.any():
        return _mismatch_message(out, ref, bad, label, f"atol={atol:g}, rtol={rtol:g}", max_diff)
    ref_norm = float(torch.linalg.vector_norm(ref.float()[finite]))
    if ref_norm > 0:
        rel = float(torch.linalg.vector_norm(diff)) / ref_norm
        if rel > MAX_RELATIVE_L2:
            return Comparison(False, f"{label}: relative L2 error {rel:.3g} > {MAX_RELATIVE_L2:g} (each element is "
                              "within atol only because the values are tiny)", max_diff)
    return Comparison(True, "", max_diff)


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
