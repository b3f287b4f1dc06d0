"""Task loading, selection and size fitting, on real KernelBench data and on malformed input."""

from __future__ import annotations

import json
import time

import pytest
import torch

from tasks import Selection, SelectionError, SourceError, load_tasks
from tasks.fitting import FitError, fit, rewrite_sizes, shrink_once, size_constants
from tasks.loaders import read_source
from tasks.runtime import exec_task_code
from tasks.selection import parse_ids

from conftest import GOOD_TASK


def write_checkout(root, files: dict[str, str]):
    for rel, code in files.items():
        path = root / "KernelBench" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return root


def test_jsonl_lists_all_250_with_ids_and_levels(kernelbench_jsonl):
    raws, errors = read_source(kernelbench_jsonl)
    assert len(raws) == 250 and not errors
    ids = {r.id for r in raws}
    assert "level1/19_ReLU" in ids and "level2/1_Conv2D_ReLU_BiasAdd" in ids
    assert sorted({r.level for r in raws}) == [1, 2, 3]


def test_selection_level_and_ids(kernelbench_jsonl):
    result = load_tasks(kernelbench_jsonl, Selection.from_flags(2, "1-10", None), 256)
    assert [t.problem_id for t in result.tasks] == list(range(1, 11))
    assert all(t.id.startswith("level2/") for t in result.tasks) and not result.errors


def test_selection_by_task_id(kernelbench_jsonl):
    result = load_tasks(kernelbench_jsonl, Selection.from_flags(None, None, "level1/19_ReLU,level3/1_MLP"), 256)
    assert sorted(t.id for t in result.tasks) == ["level1/19_ReLU", "level3/1_MLP"]


def test_parse_ids():
    assert parse_ids("1-3,7") == {1, 2, 3, 7}
    assert parse_ids(None) is None
    for bad in ("a", "3-1", "1-b"):
        with pytest.raises(SelectionError):
            parse_ids(bad)


@pytest.mark.slow
def test_first_ten_of_each_level_fit_and_run_on_cpu(kernelbench_jsonl):
    """The study's 30 tasks instantiate at their fitted size and their reference runs on the CPU."""
    result = load_tasks(kernelbench_jsonl, Selection.from_flags(None, "1-10", None), 256)
    assert len(result.tasks) == 30 and not result.errors
    for task in result.tasks:
        assert task.input_mb <= 256
        module = exec_task_code(task.code, task.id)
        torch.manual_seed(0)
        with torch.no_grad():
            out = module.make_model()(*module.get_inputs())
        assert isinstance(out, torch.Tensor), task.id
        # the outputs' size, measured on the meta device when the task was loaded, is the real one
        assert task.output_mb == pytest.approx(out.numel() * out.element_size() / 2**20), task.id
    # A level-1 task several GB big shrinks, and the rewritten sizes are recorded with it.
    big = next(t for t in result.tasks if t.id == "level1/4_Matrix_vector_multiplication_")
    assert big.original_input_mb > 1000 and big.original_sizes == {"K": 1048576}
    assert big.sizes["K"] < 1048576 and f"K = {big.sizes['K']}" in big.code


def test_builtin_tasks_load():
    result = load_tasks("builtin", None, 256)
    assert len(result.tasks) >= 8 and not result.errors
    assert all(t.id.startswith("builtin/") for t in result.tasks)
    assert {t.level for t in result.tasks} == {1, 2, 3}


def test_checkout_layout(tmp_path):
    write_checkout(tmp_path, {"level1/19_Good.py": GOOD_TASK, "level2/3_Other.py": GOOD_TASK})
    result = load_tasks(tmp_path, None, 256)
    assert [t.id for t in result.tasks] == ["level1/19_Good", "level2/3_Other"]
    assert result.tasks[0].problem_id == 19 and result.tasks[0].level == 1


@pytest.mark.parametrize(
    "code, reason",
    [
        ("def broken(:\n", "syntax error at line 1"),
        (GOOD_TASK.replace("def get_inputs", "def other_name"), "defines no get_inputs"),
        (GOOD_TASK.replace("self.scale = scale", "raise ValueError('bad config')"), "ValueError: bad config"),
        ("import nonexistent_module_xyz\n", "ModuleNotFoundError"),
        (GOOD_TASK.replace("return torch.relu(x) * self.scale", "return x @ torch.ones(3, 3)"), "forward"),
    ],
)
def test_malformed_task_is_reported_and_others_load(tmp_path, code, reason):
    write_checkout(tmp_path, {"level1/1_Bad.py": code, "level1/2_Good.py": GOOD_TASK})
    result = load_tasks(tmp_path, None, 256)
    assert [t.id for t in result.tasks] == ["level1/2_Good"]
    assert len(result.errors) == 1 and result.errors[0].id == "level1/1_Bad"
    assert reason in result.errors[0].reason


def test_malformed_data_file_rows(tmp_path):
    good = {"level": 1, "problem_id": 1, "name": "1_Good", "code": GOOD_TASK}
    path = tmp_path / "data.jsonl"
    path.write_text(
        json.dumps(good) + "\n{not json\n" + json.dumps({"level": 1, "name": "x", "code": ""}) + "\n"
    )
    result = load_tasks(path, None, 256)
    assert [t.id for t in result.tasks] == ["level1/1_Good"]
    reasons = [e.reason for e in result.errors]
    assert any("not JSON" in r for r in reasons) and any("problem_id" in r for r in reasons)


def test_parquet(tmp_path, kernelbench_jsonl):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in kernelbench_jsonl.read_text().splitlines()[:5]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "kb.parquet")
    result = load_tasks(tmp_path / "kb.parquet", None, 256)
    assert len(result.tasks) == 5 and result.tasks[0].id == "level1/" + rows[0]["name"]


def test_bad_sources(tmp_path):
    with pytest.raises(SourceError):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(SourceError):
        load_tasks(tmp_path / "x.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError):
        load_tasks(tmp_path / "empty")


def test_fit_halves_largest_constant_and_keeps_small_ones():
    code = GOOD_TASK.replace("batch_size = 64", "batch_size = 4096").replace("dim = 1024", "dim = 65536\nkernel_size = 4096\naxis = 1")
    result = fit(code, 64)
    assert result.input_bytes <= 64 * 2**20
    assert result.sizes["kernel_size"] == 4096 and result.sizes["axis"] == 1
    assert result.original_sizes == {"dim": 65536} or "batch_size" in result.original_sizes
    assert result.sizes["dim"] * result.sizes["batch_size"] * 4 == result.input_bytes


def test_fit_chained_and_tuple_constants():
    code = GOOD_TASK.replace("batch_size = 64\ndim = 1024", "batch_size = 32768\nshape = (32768,)\nh = w = 8").replace(
        "torch.randn(batch_size, dim)", "torch.randn(batch_size, *shape) * h * w"
    ).replace("return torch.relu(x) * self.scale", "return x * torch.ones(x.shape[0])")
    # forward broadcasts (B, S) * (B,) so B and S must shrink together (S == B).
    result = fit(code, 16)
    assert result.sizes["batch_size"] == result.sizes["shape"][0] < 32768
    assert result.sizes["h"] == 8 and result.sizes["w"] == 8
    names = {c.name for c in size_constants(rewrite_sizes(code, {"h": 4}))}
    assert {"h", "w"} <= names


def test_fit_impossible_says_why():
    code = GOOD_TASK.replace("batch_size = 64\ndim = 1024", "batch_size = 4\ndim = 4")
    code = code.replace("torch.randn(batch_size, dim)", "torch.randn(4096, 4096)")
    with pytest.raises(FitError, match="no size constant left"):
        fit(code, 1)


def test_shrink_once_gives_a_smaller_valid_task():
    smaller = shrink_once(GOOD_TASK)
    assert smaller is not None and "dim = 512" in smaller


def test_loading_all_250_is_quick(kernelbench_jsonl):
    start = time.perf_counter()
    result = load_tasks(kernelbench_jsonl, None, 256)
    assert len(result.tasks) == 250, [e for e in result.errors]
    assert time.perf_counter() - start < 120


def test_task_constants_are_the_plain_module_level_values():
    from tasks.runtime import exec_task_code, task_constants

    code = ("import torch\nimport torch.nn as nn\nbatch_size = 16\nhardtanh_min = -0.5\nname = 'x'\nflag = True\n"
            "kernel = (3, 3)\nweights = [1, 2]\n_private = 1\nclass Model(nn.Module):\n    def forward(self, x):\n"
            "        return x\ndef get_inputs():\n    return [torch.randn(batch_size)]\ndef get_init_inputs():\n    return []\n")
    constants = task_constants(exec_task_code(code).namespace)
    assert constants == {"batch_size": 16, "hardtanh_min": -0.5, "name": "x", "flag": True, "kernel": (3, 3)}
