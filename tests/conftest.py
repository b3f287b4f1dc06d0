"""Shared test fixtures: paths to the real KernelBench data and helpers to write small task files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Precompiled headers depend only on the toolchain: every test's oracle, and the runs tests start in
# subprocesses with their own KERNELSEARCH_CACHE, share one folder of them (each is several hundred MB).
os.environ.setdefault("KERNELSEARCH_PCH", str(Path.home() / ".cache" / "kernelsearch" / "pch"))
KERNELBENCH_JSONL = Path(
    os.environ.get("KERNELSEARCH_KERNELBENCH", ROOT.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl")
)


@pytest.fixture(scope="session", autouse=True)
def lite_binding_header_made() -> None:
    """The shared folder's lite binding header, made before the first test: otherwise the first C++ build
    asks for it and a background compiler takes a core for ~20 s beside whichever tests come next (on a
    2-core machine, enough to slow a timed one past its limit). Tests of the headers use folders of their own."""
    from oracle.build import with_build_flags
    from oracle.pch import LITE_BINDING, default_root, make_header, spec_for

    spec = spec_for(with_build_flags({})["extra_cflags"], None, with_cuda=False, header=LITE_BINDING)
    if spec is not None:
        make_header(default_root(), spec)


@pytest.fixture
def kernelbench_jsonl() -> Path:
    if not KERNELBENCH_JSONL.exists():
        pytest.skip(f"KernelBench data not found at {KERNELBENCH_JSONL}")
    return KERNELBENCH_JSONL


GOOD_TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale

batch_size = 64
dim = 1024

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [2.0]
'''
