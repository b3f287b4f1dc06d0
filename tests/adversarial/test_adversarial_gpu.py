"""The oracle against the GPU-only cheats and faults (run on a GPU machine: `pytest -m gpu`).

Every `gpu/adv_*.py` is a CUDA candidate for builtin/1_LeakyReLU_Scale whose first line says the verdicts it
may get (`# expect: STATUS[/STATUS] - what it does`): a side stream the timer misses, an illegal address, a
kernel that never ends, running out of GPU memory, a cache keyed by the input's pointer, a stale output from
a freed block, half an output. None may come out `correct` with an inflated speed, and after all of them the
same oracle still finds the honest CUDA candidate (`gpu/honest_cuda.py`) `correct`. All of them embed the same
CUDA source (the cheat is picked by an argument), so the extension is built once for the module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest
import torch

from oracle import Oracle, OracleConfig
from tasks import Selection, load_tasks

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HERE = Path(__file__).parent / "gpu"
HONEST = HERE / "honest_cuda.py"
CASES = sorted(HERE.glob("adv_*.py"))
TASK_ID = "builtin/1_LeakyReLU_Scale"


def expected(path: Path) -> set[str]:
    match = re.match(r"# expect: ([a-z_/]+) - .+", path.read_text().splitlines()[0])
    assert match, f"{path.name}: first line must be '# expect: STATUS[/STATUS] - what it does'"
    return set(match.group(1).split("/"))


@pytest.fixture(scope="module")
def task():
    return load_tasks("builtin", Selection(task_ids=frozenset({TASK_ID})), 256).tasks[0]


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    o = Oracle(OracleConfig(device="cuda", call_timeout_s=20))
    yield o
    o.close()  # its standby workers hold a CUDA context each


@pytest.fixture(scope="module")
def honest(oracle, task):
    """An honest evaluation first: it builds the shared extension and gives the honest speed."""
    v = oracle.evaluate(task, HONEST.read_text())
    assert v.status == "correct", v.message
    assert v.backend == "cuda" and v.device == "cuda"
    return v


def test_catalogue_is_complete():
    assert expected(HONEST) == {"correct"}
    assert len(CASES) >= 7
    for path in CASES:
        assert expected(path), path.name


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem.removeprefix("adv_"))
def test_gpu_cheat_is_caught(oracle, task, honest, path):
    allowed = expected(path)
    v = oracle.evaluate(task, path.read_text())
    assert v.status in allowed, f"{path.name}: got {v.status}: {v.message}"
    if v.status == "correct":  # allowed only where the cheat is harmless: then the speed must be honest
        honest_ms = min(honest.time_ms, oracle.evaluate(task, HONEST.read_text()).time_ms or honest.time_ms)
        assert v.time_ms >= 0.2 * honest_ms, f"{path.name}: inflated speed {v.time_ms} ms vs honest {honest_ms} ms"
        assert v.sol_ms is None or v.time_ms >= v.sol_ms


def test_oracle_still_judges_the_honest_candidate(oracle, task, honest):
    v = oracle.evaluate(task, HONEST.read_text())
    assert v.status == "correct", v.message
    assert v.build_cached
