"""The oracle against a catalogue of cheats and faults (issue 4, the CPU-expressible cases).

Every `adv_*.py` here is a candidate for builtin/1_LeakyReLU_Scale whose first line says the verdicts it
may get (`# expect: STATUS[/STATUS] - what it does`). None may come out `correct` with an inflated speed,
and after all of them the same oracle still finds an honest candidate `correct`. All candidates embed the
same C++ source as tests/candidates/leaky_correct.py, so the extension is built once for the module.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import pytest

from oracle import Oracle, OracleConfig
from oracle.timing import TimingParams
from tasks import Selection, load_tasks

HERE = Path(__file__).parent
CORRECT = HERE.parent / "candidates" / "leaky_correct.py"
CASES = sorted(HERE.glob("adv_*.py"))
TASK_ID = "builtin/1_LeakyReLU_Scale"
SECRET = "KS_ADV_SECRET_TOKEN"
ORPHAN_FILE = "/tmp/ks-adv-orphan.pids"  # where adv_orphan_child.py writes its children's pids
pytestmark = pytest.mark.slow


def expected(path: Path) -> set[str]:
    match = re.match(r"# expect: ([a-z_/]+) - .+", path.read_text().splitlines()[0])
    assert match, f"{path.name}: first line must be '# expect: STATUS[/STATUS] - what it does'"
    return set(match.group(1).split("/"))


@pytest.fixture(scope="module")
def secret_env():
    """A token-like variable in the oracle's environment: no worker may see it (adv_reads_secrets)."""
    old = os.environ.get(SECRET)
    os.environ[SECRET] = "hunter2-not-a-real-token"
    yield
    if old is None:
        os.environ.pop(SECRET, None)
    else:
        os.environ[SECRET] = old


@pytest.fixture(scope="module")
def task():
    return load_tasks("builtin", Selection(task_ids=frozenset({TASK_ID})), 256).tasks[0]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, secret_env) -> Iterator[Oracle]:
    fast = TimingParams(warmup_calls=2, min_calls=5, max_calls=20, target_s=0.2, wall_calls=5)
    o = Oracle(OracleConfig(device="cpu", cache_dir=tmp_path_factory.mktemp("ks-adv-cache"), timing=fast, call_timeout_s=10))
    yield o
    o.close()


@pytest.fixture(scope="module")
def honest(oracle, task):
    """An honest evaluation first: it builds the shared extension and gives the honest speed."""
    v = oracle.evaluate(task, CORRECT.read_text())
    assert v.status == "correct", v.message
    return v


def test_catalogue_is_complete():
    assert len(CASES) >= 20
    for path in CASES:
        assert expected(path), path.name


def test_honest_candidate_carries_the_floor(honest):
    assert honest.sol_ms and honest.sol_ms > 0
    assert honest.sol_fraction == pytest.approx(honest.sol_ms / honest.time_ms)
    assert honest.timing["sol_ms"] == honest.sol_ms and honest.timing["floor"]["bytes"] == 2 * 4096 * 1024 * 4  # input and output, fp32
    assert honest.timing["candidate"]["external_ms"] > 0  # the block the oracle clocked itself


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def orphan_pids(tmp_path_factory) -> Path:
    """This test run's own file in place of ORPHAN_FILE: two test runs on one machine must not read each
    other's children (a folder of pytest's, removed with its others)."""
    return tmp_path_factory.mktemp("ks-adv-orphan") / "pids"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem.removeprefix("adv_"))
def test_cheat_is_caught(oracle, task, honest, path, orphan_pids):
    allowed = expected(path)
    v = oracle.evaluate(task, path.read_text().replace(ORPHAN_FILE, str(orphan_pids)))
    assert v.status in allowed, f"{path.name}: got {v.status}: {v.message}"
    if v.status == "correct":  # allowed only where the cheat is harmless: then the speed must be honest
        # (cheats that beat the clock gain 10x-1000x; a shared 2-core machine varies by ~3x between runs)
        # The honest time is taken as the faster of the module's first measurement and one made just now, so a
        # burst of load during either does not pass for a cheat.
        honest_ms = min(honest.time_ms, oracle.evaluate(task, CORRECT.read_text()).time_ms or honest.time_ms)
        assert v.time_ms >= 0.2 * honest_ms, f"{path.name}: inflated speed {v.time_ms} ms vs honest {honest_ms} ms"
        assert v.sol_ms and v.time_ms >= v.sol_ms
    if path.stem == "adv_orphan_child":
        pids = [int(p) for p in orphan_pids.read_text().split()]
        assert pids and not [p for p in pids if _alive(p)], "a child the candidate started outlived its worker"


def test_oracle_still_judges_a_correct_candidate(oracle, task, honest):
    v = oracle.evaluate(task, CORRECT.read_text())
    assert v.status == "correct", v.message
    assert v.build_cached
