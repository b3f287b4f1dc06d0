"""Strategies: how prompts are made and how a verdict feeds the next round."""

from __future__ import annotations

from strategies.base import Attempt, Strategy
from strategies.zero_shot import ZeroShot

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (ZeroShot,)}


def make_strategy(name: str, backend: str = "cuda") -> Strategy:
    if name not in STRATEGIES:
        raise KeyError(f"unknown strategy '{name}' (known: {', '.join(STRATEGIES)})")
    if backend not in ("cuda", "cpp", "triton"):
        raise KeyError(f"strategies write cuda, cpp or triton kernels, not '{backend}'")
    return STRATEGIES[name](backend)


__all__ = ["Attempt", "STRATEGIES", "Strategy", "make_strategy"]
