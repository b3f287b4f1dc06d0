"""The physical floor of a task (docs/oracle.md, Timing): no kernel can be faster than moving the bytes its
inputs, parameters and outputs must move at the memory's bandwidth, or than doing the reference's FLOPs
at the device's peak. A time below the floor is impossible, so a candidate that reports one is cheating
the clock (or skipping work the check did not see) and is rejected.

FLOPs are counted by trusted code (the reference worker) with `torch.utils.flop_counter.FlopCounterMode`,
which counts matmuls and convolutions only: elementwise work adds nothing, so the floor stays a lower bound.
The figures are deliberately generous (high) so that an honest kernel is never rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Bytes per second a kernel can move at most, and FLOP/s per dtype at most.
# H200: ~4.3e12 B/s measured device-to-device copy bandwidth (4.8e12 on paper); fp32 without tensor cores
# (TF32 is off in the oracle) ~67e12; fp16/bf16 dense tensor cores ~989e12; fp64 tensor cores ~67e12.
# CPU: a bound no CPU reaches (so CPU candidates are never falsely rejected).
DEVICE_LIMITS: dict[str, dict[str, Any]] = {
    "cuda": {"bytes_per_s": 4.3e12, "flops_per_s": {torch.float32: 67e12, torch.float16: 989e12,
                                                     torch.bfloat16: 989e12, torch.float64: 67e12}},
    "cpu": {"bytes_per_s": 200e9, "flops_per_s": {torch.float32: 2e12, torch.float16: 4e12,
                                                   torch.bfloat16: 4e12, torch.float64: 1e12}},
}


@dataclass
class Floor:
    flops: float
    bytes: float
    dtype: str
    sol_ms: float  # max(bytes / bandwidth, flops / peak), in ms


def tensor_bytes(values: Any) -> int:
    """Bytes of the distinct storages among the tensors in values (lists/tuples nested)."""
    seen: dict[tuple[int, int], int] = {}

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            if v.numel():
                key = (v.untyped_storage().data_ptr(), v.untyped_storage().nbytes())
                seen[key] = min(v.untyped_storage().nbytes(), v.numel() * v.element_size())
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(values)
    return sum(seen.values())


def count_flops(fn: Any, inputs: list[Any]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn(*inputs)
    return float(counter.get_total_flops())


def main_dtype(values: Any) -> torch.dtype:
    """The floating dtype holding most bytes among the tensors (fp32 when none)."""
    sizes: dict[torch.dtype, int] = {}

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            sizes[v.dtype] = sizes.get(v.dtype, 0) + v.numel() * v.element_size()
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(values)
    return max(sizes, key=sizes.get) if sizes else torch.float32


def floor_ms(flops: float, nbytes: float, device: str, dtype: torch.dtype = torch.float32) -> float:
    limits = DEVICE_LIMITS["cuda" if device == "cuda" else "cpu"]
    peak = limits["flops_per_s"].get(dtype, max(limits["flops_per_s"].values()))
    return max(nbytes / limits["bytes_per_s"], flops / peak) * 1e3


def measure(model: torch.nn.Module, inputs: list[Any], device: str) -> Floor:
    """Run by trusted code only: one call of the reference under the FLOP counter."""
    with torch.no_grad():
        flops = count_flops(model, inputs)
        out = model(*inputs)
    params = [p for p in model.state_dict().values()]
    nbytes = tensor_bytes(list(inputs)) + tensor_bytes(params) + tensor_bytes(out)
    dtype = main_dtype(list(inputs) + params)
    return Floor(flops, float(nbytes), str(dtype).replace("torch.", ""), floor_ms(flops, nbytes, device, dtype))


def dtype_named(name: str) -> torch.dtype:
    return getattr(torch, name, torch.float32)
