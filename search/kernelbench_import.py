"""KernelBench generations as a replay file: re-judge a KernelBench run folder with this oracle.

KernelBench's generation scripts write one file a kernel, `level_{L}_problem_{P}_sample_{S}_kernel.py`, in a
run folder. `import_run` finds them, resolves level L and problem P against a task source (a KernelBench
checkout or dataset file) to a task id, and `write_replay` writes one JSONL line a kernel (`task`,
`completion`, `sample`, where it came from), which `kernelsearch run --generator replay:FILE` judges with
pass@k over the samples.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tasks.loaders import read_source

KERNEL_FILE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")


@dataclass(frozen=True)
class ImportedKernel:
    task: str
    sample: int
    completion: str
    origin: str  # the file it came from


@dataclass
class ImportResult:
    kernels: list[ImportedKernel] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why)

    @property
    def tasks(self) -> list[str]:
        return sorted({k.task for k in self.kernels})


def import_run(run_dir: Path, source: str) -> ImportResult:
    """Every kernel file of a KernelBench run folder (searched recursively), with its task id in `source`."""
    raws, _ = read_source(source)
    by_problem = {(r.level, r.problem_id): r.id for r in raws if r.level is not None and r.problem_id is not None}
    result = ImportResult()
    for path in sorted(Path(run_dir).rglob("*.py")):
        match = KERNEL_FILE.match(path.name)
        if not match:
            continue
        level, problem, sample = (int(g) for g in match.groups())
        task = by_problem.get((level, problem))
        if task is None:
            result.skipped.append((str(path), f"level {level} problem {problem} is not in {source}"))
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            result.skipped.append((str(path), f"unreadable: {exc.strerror}"))
            continue
        result.kernels.append(ImportedKernel(task, sample, text, str(path)))
    result.kernels.sort(key=lambda k: (k.task, k.sample))
    return result


def write_replay(result: ImportResult, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for kernel in result.kernels:
            f.write(json.dumps(asdict(kernel)) + "\n")
