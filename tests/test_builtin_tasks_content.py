"""Content checks for the built-in KernelBench-style tasks under tasks/builtin/level{1,2,3}/.

Each task file is exec'd in a fresh namespace (no package import needed), its Model is built from
get_init_inputs() and run once under torch.no_grad() on the CPU. The suite as a whole must cover the
kinds of operator the project promises (elementwise, reduction, softmax, normalisation, GEMM with an
epilogue, convolution with an activation, a multi-layer block).
"""
import ast
import re
import time
from pathlib import Path

import pytest
import torch

BUILTIN = Path(__file__).resolve().parents[1] / "tasks" / "builtin"
LEVELS = (1, 2, 3)
NAME_RE = re.compile(r"^(\d+)_[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*\.py$")
MAX_SECONDS = 1.0
MIN_INPUT_BYTES = 1 << 20          # 1 MiB: large enough that a GPU kernel matters
MAX_INPUT_BYTES = 32 << 20         # ~30 MB: keeps CPU reference runs cheap
MIN_ELEMENTWISE_ELEMS = 1 << 20    # memory-bound tasks need at least ~1M elements


def _task_files():
    files = []
    for level in LEVELS:
        files += sorted((BUILTIN / f"level{level}").glob("*.py"), key=_number)
    return files


def _level(path: Path) -> int:
    return int(path.parent.name[len("level"):])


def _number(path: Path) -> int:
    head = path.name.split("_", 1)[0]
    return int(head) if head.isdigit() else 10**9  # badly named files sort last; the layout test flags them


TASK_FILES = _task_files()


def _load(path: Path) -> dict:
    ns = {"__name__": f"builtin_task_{path.stem}", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


def _build_and_inputs(ns: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = ns["Model"](*ns["get_init_inputs"]())
    model.eval()
    inputs = ns["get_inputs"]()
    return model, inputs


def _ids(files):
    return [f"level{_level(p)}/{p.stem}" for p in files]


# --------------------------------------------------------------------------- suite-level checks

def test_layout_and_numbering():
    assert len(TASK_FILES) >= 9, f"expected at least 9 built-in tasks, found {len(TASK_FILES)}"
    for level in LEVELS:
        assert any(_level(p) == level for p in TASK_FILES), f"no task in level{level}"
    for p in TASK_FILES:
        assert NAME_RE.match(p.name), f"bad task file name: {p.name}"
    numbers = [_number(p) for p in TASK_FILES]
    assert len(numbers) == len(set(numbers)), f"task numbers not unique: {sorted(numbers)}"
    assert min(numbers) == 1


_REDUCTION_CALL = re.compile(r"\b(sum|amax|amin|max|min|mean|norm|vector_norm|softmax|logsumexp)\(")
_ACT_CALL = re.compile(r"relu|leaky_relu|gelu|GELU|silu|sigmoid|tanh|ReLU|SiLU")


def _forward_source(src: str) -> str:
    """Source text of Model.forward, or '' if it cannot be found."""
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return ast.get_source_segment(src, item) or ""
    return ""


# Each required kind: predicate over (level, file stem, full source, forward source).
REQUIRED_KINDS = {
    "elementwise": lambda lvl, stem, src, fwd: lvl == 1 and _ACT_CALL.search(fwd) is not None
    and _REDUCTION_CALL.search(fwd) is None,
    "reduction": lambda lvl, stem, src, fwd: lvl == 1
    and re.search(r"\b(torch\.)?(sum|amax|max|mean|amin|min)\(", fwd) is not None
    and "softmax" not in fwd,
    "softmax": lambda lvl, stem, src, fwd: "softmax" in fwd and "Softmax" in stem,
    "normalization": lambda lvl, stem, src, fwd: re.search(
        r"LayerNorm|layer_norm|RMSNorm|rms_norm|rsqrt", src) is not None,
    "gemm_epilogue": lambda lvl, stem, src, fwd: lvl == 2
    and re.search(r"nn\.Linear|matmul|torch\.mm|@", src) is not None
    and _ACT_CALL.search(src) is not None,
    "conv_activation": lambda lvl, stem, src, fwd: "nn.Conv2d" in src and _ACT_CALL.search(fwd) is not None,
    "multi_layer_block": lambda lvl, stem, src, fwd: lvl == 3
    and len(re.findall(r"nn\.(Linear|Conv2d|LayerNorm)\(", src)) >= 2,
}


def test_required_kinds_covered():
    covered = {kind: [] for kind in REQUIRED_KINDS}
    for p in TASK_FILES:
        src = p.read_text()
        fwd = _forward_source(src)
        for kind, pred in REQUIRED_KINDS.items():
            if pred(_level(p), p.stem, src, fwd):
                covered[kind].append(p.name)
    missing = [kind for kind, names in covered.items() if not names]
    assert not missing, f"required task kinds not covered: {missing} (coverage: {covered})"


# --------------------------------------------------------------------------- per-file checks

@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_file_structure(path: Path):
    src = path.read_text()
    tree = ast.parse(src)
    assert ast.get_docstring(tree), "module docstring missing"

    imports = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imports |= {(a.name, a.asname) for a in node.names}
    assert ("torch", None) in imports, "missing `import torch`"
    assert ("torch.nn", "nn") in imports, "missing `import torch.nn as nn`"

    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "Model" in classes, "class Model missing"
    assert ast.get_docstring(classes["Model"]), "Model docstring missing"

    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"get_inputs", "get_init_inputs"} <= funcs

    int_constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            assert len(node.targets) == 1 and isinstance(node.targets[0], ast.Name), (
                f"line {node.lineno}: module-level assignments must be `name = literal` (no chains)")
            value = node.value
            if isinstance(value, ast.Constant) and type(value.value) is int:
                int_constants[node.targets[0].id] = value.value
    assert int_constants, "no module-level int size constants"
    assert all(v > 0 for v in int_constants.values())


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_builds_and_runs_fast(path: Path):
    ns = _load(path)
    model, inputs = _build_and_inputs(ns)

    assert isinstance(inputs, list) and inputs
    total_bytes = 0
    for x in inputs:
        assert isinstance(x, torch.Tensor)
        assert x.dtype == torch.float32 and x.device.type == "cpu"
        assert bool(torch.any(x != 0)), "an input is all zeros"
        total_bytes += x.numel() * x.element_size()
    assert MIN_INPUT_BYTES <= total_bytes <= MAX_INPUT_BYTES, f"inputs total {total_bytes / 2**20:.1f} MiB"
    for prm in model.parameters():
        assert prm.dtype == torch.float32

    src = path.read_text()
    compute_bound = re.search(r"nn\.(Linear|Conv\dd)|matmul", src) is not None
    if not compute_bound:
        assert max(x.numel() for x in inputs) >= MIN_ELEMENTWISE_ELEMS

    with torch.no_grad():
        elapsed = float("inf")
        for _ in range(3):  # the quickest of up to three: the task's own cost, not a moment of load on 2 cores
            t0 = time.perf_counter()
            out = model(*inputs)
            elapsed = min(elapsed, time.perf_counter() - t0)
            if elapsed < MAX_SECONDS:
                break
    assert isinstance(out, torch.Tensor), "forward must return a single tensor"
    assert out.dtype == torch.float32
    assert out.numel() > 0
    assert bool(torch.isfinite(out).all()), "output has NaN/Inf"
    assert elapsed < MAX_SECONDS, f"forward took {elapsed:.3f}s on CPU"


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_deterministic_given_seed(path: Path):
    ns = _load(path)
    outs = []
    for _ in range(2):
        model, inputs = _build_and_inputs(ns, seed=1234)
        with torch.no_grad():
            outs.append(model(*inputs))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
