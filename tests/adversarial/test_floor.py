"""The physical floor (docs/oracle.md, Timing): arithmetic and the trusted measurement, on the CPU."""

from __future__ import annotations

import pytest
import torch

from oracle.floor import floor_ms, measure


def test_memory_bound_floor_is_bytes_over_bandwidth():
    assert floor_ms(0, 4.3e9, "cuda") == pytest.approx(1.0)  # 4.3 GB at 4.3 TB/s: 1 ms
    assert floor_ms(0, 200e6, "cpu") == pytest.approx(1.0)


def test_compute_bound_floor_uses_the_dtype_peak():
    assert floor_ms(67e9, 0, "cuda", torch.float32) == pytest.approx(1.0)
    assert floor_ms(989e9, 0, "cuda", torch.bfloat16) == pytest.approx(1.0)


def test_measure_counts_matmul_flops_and_bytes():
    model = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    f = measure(model, [x], "cpu")
    assert f.flops == 2 * 16 * 64 * 32
    assert f.bytes == (16 * 64 + 64 * 32 + 16 * 32) * 4
    assert f.dtype == "float32" and f.sol_ms == pytest.approx(max(f.bytes / 200e9, f.flops / 2e12) * 1e3)
