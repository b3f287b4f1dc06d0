"""The run store: everything a run produced, in a folder a person (and `kernelsearch report`) can read back.

- `config.json`: everything needed to repeat the run (tasks with their fitted code and sizes, generator,
  strategy and options, n, rounds, seeds, versions, hardware).
- `samples.jsonl`: one record a sample, appended and flushed (fsync) as it completes. A crash can only
  tear the last line, which `RunStore.open` drops, so a resumed run records no sample twice and loses none.
- `best/`: the best kernel of each task (`<task>.py`) and its re-timed verdict (`<task>.json`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any


class StoreError(Exception):
    """The run folder cannot be used (exists when it should not, or lacks config.json)."""


def task_slug(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "__", task_id)


class RunStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.samples_path = root / "samples.jsonl"
        self.best_dir = root / "best"
        self._lock = threading.Lock()

    @classmethod
    def create(cls, root: Path, config: dict[str, Any]) -> "RunStore":
        if (root / "samples.jsonl").exists() or (root / "config.json").exists():
            raise StoreError(f"{root} already holds a run: use --resume {root}, or another --out")
        root.mkdir(parents=True, exist_ok=True)
        store = cls(root)
        store.best_dir.mkdir(exist_ok=True)
        (root / "config.json").write_text(json.dumps(config, indent=1))
        store.samples_path.touch()
        return store

    @classmethod
    def open(cls, root: Path) -> "RunStore":
        if not (root / "config.json").is_file():
            raise StoreError(f"{root} is not a run folder (no config.json)")
        store = cls(root)
        store.best_dir.mkdir(exist_ok=True)
        store._drop_torn_tail()
        return store

    def config(self) -> dict[str, Any]:
        return json.loads((self.root / "config.json").read_text())

    def update_config(self, **fields: Any) -> None:
        config = self.config()
        config.update(fields)
        (self.root / "config.json").write_text(json.dumps(config, indent=1))

    def _drop_torn_tail(self) -> None:
        """Cut a last line that a crash left without its newline (it never counted as recorded)."""
        if not self.samples_path.exists():
            self.samples_path.touch()
            return
        data = self.samples_path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(self.samples_path, "r+b") as f:
                f.truncate(keep)

    def samples(self) -> list[dict[str, Any]]:
        rows = []
        if self.samples_path.exists():
            for line in self.samples_path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
        return rows

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str) + "\n"
        with self._lock, open(self.samples_path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def write_best(self, task_id: str, source: str, verdict: dict[str, Any]) -> None:
        slug = task_slug(task_id)
        (self.best_dir / f"{slug}.py").write_text(source)
        (self.best_dir / f"{slug}.json").write_text(json.dumps(verdict, indent=1, default=str))

    def best(self, task_id: str) -> dict[str, Any] | None:
        path = self.best_dir / f"{task_slug(task_id)}.json"
        return json.loads(path.read_text()) if path.exists() else None
