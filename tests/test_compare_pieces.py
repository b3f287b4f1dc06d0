"""The exact comparison walks outputs in pieces: its verdicts, messages and figures are the same whether a
tensor is one piece or many (a wrong gigabyte output compared whole took 27 GB of device memory)."""

from __future__ import annotations

import math

import pytest
import torch

from oracle import compare as compare_module
from oracle.compare import compare
from oracle.tolerance import POLICIES, Float64Scale


def _cases() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(37, 101, generator=g)
    with_nan = ref.clone()
    with_nan[1, 1], with_nan[3, 3] = float("nan"), float("inf")
    correction = torch.randn(37, 101, generator=g) * 1e-8
    scale = Float64Scale(rel_l2=1e-7, rel_max=1e-6)
    few = ref.clone()
    few[2, 3] += 1.0
    few[30, 7] -= 2
    few[36, 100] = 5
    holes = ref.clone()
    holes[5:9] = float("nan")
    near_nan = with_nan.clone()
    near_nan[0, 0] += 1e-3
    flipped = with_nan.clone()
    flipped[3, 3] = float("-inf")
    one_off = ref.clone()
    one_off[4, 4] += 1e-3
    ints = torch.randint(0, 10, (50, 3), generator=g)
    wrong_ints = ints.clone()
    wrong_ints[7, 1] += 3
    wrong_ints[40, 2] -= 1
    return {
        "within tolerance": (ref + 1e-6, ref, None, None),
        "three wrong, spread over pieces": (few, ref, None, None),
        "unwritten rows": (holes, ref, None, None),
        "NaN in both, one wrong": (near_nan, with_nan, None, None),
        "inf of the wrong sign": (flipped, with_nan, None, None),
        "on the relative bound": (ref * (1 + 2e-4), ref, None, None),
        "tiny values, all zero": (torch.zeros(4000), torch.full((4000,), 2.5e-6), None, None),
        "numeric, within": (ref + 1e-7, ref, correction, scale),
        "numeric, one element off": (one_off, ref, correction, scale),
        "numeric, half precision": (ref.half().float(), ref, correction, scale),
        "numeric, misplaced inf": (torch.where(torch.isinf(with_nan), 0.0, with_nan), with_nan, correction, scale),
        "integers": (wrong_ints, ints, None, None),
        "half": ((ref + 0.05).half(), ref.half(), None, None),
    }


def _same(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-5)


@pytest.mark.parametrize("name", list(_cases()))
def test_the_exact_path_in_pieces_says_what_it_says_over_whole_tensors(name, monkeypatch):
    out, ref, correction, scale = _cases()[name]
    for policy in POLICIES:
        monkeypatch.setattr(compare_module, "EXACT_CHUNK_ELEMENTS", 1 << 30)
        whole = compare(out, ref, "output", policy, correction, scale)
        monkeypatch.setattr(compare_module, "EXACT_CHUNK_ELEMENTS", 7)  # many pieces, a mismatch's neighbours apart
        pieces = compare(out, ref, "output", policy, correction, scale)
        assert (pieces.ok, pieces.message, pieces.passes) == (whole.ok, whole.message, whole.passes), policy
        assert _same(pieces.max_abs_diff, whole.max_abs_diff)
        a, b = whole.figures, pieces.figures
        assert _same(a.max_abs, b.max_abs) and _same(a.max_rel, b.max_rel) and _same(a.rel_l2_64, b.rel_l2_64)
        assert a.over_bound.keys() == b.over_bound.keys()
        assert all(_same(a.over_bound[k], b.over_bound[k]) for k in a.over_bound), (a.over_bound, b.over_bound)


def test_a_wrong_output_names_its_first_wrong_elements_and_counts_all_of_them(monkeypatch):
    monkeypatch.setattr(compare_module, "EXACT_CHUNK_ELEMENTS", 5)
    ref = torch.zeros(4, 10)
    out = ref.clone()
    out[0, 9], out[2, 0], out[2, 1], out[3, 9] = 1.0, 2.0, 3.0, 4.0
    message = compare(out, ref).message
    assert message.startswith("output: 4 of 40 elements wrong (10%")
    assert "at [0, 9] expected 0, got 1; at [2, 0] expected 0, got 2; at [2, 1] expected 0, got 3;" in message
    assert "[3, 9]" not in message and "max abs diff 4" in message
    out[1] = float("nan")
    assert "; 10 NaN in the output (unwritten elements?)" in compare(out, ref).message
