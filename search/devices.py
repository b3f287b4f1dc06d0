"""Which device a command runs on: `--device auto` resolved once, for every command and the demo."""

from __future__ import annotations

import shutil

from tasks.fitting import default_budget_mb

DEVICES = ("cpu", "cuda")


def resolve_device(device: str) -> str:
    """`auto`: cuda when a GPU is visible (nvidia-smi finds one and torch sees its memory), else cpu.
    ValueError, with a one-line message, for anything but auto, cpu or cuda."""
    if device == "auto":
        return "cuda" if shutil.which("nvidia-smi") and default_budget_mb("cuda") != default_budget_mb("cpu") else "cpu"
    if device not in DEVICES:
        raise ValueError(f"--device must be cpu or cuda, not '{device}'")
    return device
