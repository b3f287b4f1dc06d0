"""Counted nouns for messages: "1 task", "2 tasks"."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`count` and the noun, singular for exactly one (`nouns`: an irregular plural)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
