"""Strategies: how prompts are made and how a verdict feeds the next round."""

from __future__ import annotations

from typing import Any

from strategies.agents import Agents
from strategies.base import Attempt, Strategy, Tools
from strategies.profiling import Profiling
from strategies.refine import Refine
from strategies.zero_shot import ZeroShot

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (ZeroShot, Profiling, Refine, Agents)}


def make_strategy(name: str, backend: str = "cuda", **options: Any) -> Strategy:
    """The strategy `name` for a kernel backend, with its options (e.g. agents: ambition="full")."""
    if name not in STRATEGIES:
        raise KeyError(f"unknown strategy '{name}' (known: {', '.join(STRATEGIES)})")
    if backend not in ("cuda", "cpp", "triton"):
        raise KeyError(f"strategies write cuda, cpp or triton kernels, not '{backend}'")
    options = {k: v for k, v in options.items() if k != "backend"}
    try:
        return STRATEGIES[name](backend, **options)
    except TypeError:
        raise KeyError(f"strategy '{name}' takes no option among {', '.join(sorted(options))}") from None
    except ValueError as exc:
        raise KeyError(str(exc)) from None


__all__ = ["Attempt", "STRATEGIES", "Strategy", "Tools", "make_strategy"]
