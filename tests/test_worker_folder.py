"""A worker's folder (its job and the candidate's files) does not outlive it, even when nobody closes it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

from oracle.harness import build_entry
from oracle.sandbox import Worker

ROOT = Path(__file__).resolve().parent.parent
SLEEPER = "import time\ntime.sleep(60)\n"


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return True


def _until(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_closed_worker_leaves_nothing(tmp_path):
    job = {"cache": str(tmp_path), "candidate_path": "wait.py", "build_timeout_s": 60}
    worker = Worker(build_entry, job, files={"wait.py": SLEEPER})
    folder, pid = worker.dir, worker.process.pid
    worker.close()
    assert not folder.exists() and _until(lambda: _gone(pid))
    worker.close()  # twice is harmless


def test_a_worker_dropped_without_close_is_killed_and_its_folder_removed(tmp_path):
    job = {"cache": str(tmp_path), "candidate_path": "wait.py", "build_timeout_s": 60}
    worker = Worker(build_entry, job, files={"wait.py": SLEEPER})
    folder, pid = worker.dir, worker.process.pid
    assert folder.is_dir() and (folder / "wait.py").exists()
    del worker
    gc.collect()
    assert not folder.exists()
    assert _until(lambda: _gone(pid)), f"worker {pid} still runs"


def test_workers_never_closed_leave_no_folder_when_the_interpreter_exits(tmp_path):
    """An interrupted run or an oracle that was never closed: its workers' folders go at exit."""
    script = (
        "import sys\n"
        "from oracle.harness import build_entry\n"
        "from oracle.sandbox import Worker\n"
        f"job = {{'cache': {str(tmp_path)!r}, 'candidate_path': 'wait.py', 'build_timeout_s': 60}}\n"
        f"workers = [Worker(build_entry, job, files={{'wait.py': {SLEEPER!r}}}) for _ in range(2)]\n"
        "print(' '.join(f'{w.dir}:{w.process.pid}' for w in workers), flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    left = [item.rsplit(":", 1) for item in done.stdout.split()]
    assert len(left) == 2
    for folder, pid in left:
        assert not Path(folder).exists(), folder
        assert _until(lambda: _gone(int(pid))), f"worker {pid} still runs"


def test_folders_of_a_trusted_process_that_died_are_swept_by_the_next(tmp_path):
    """A trusted process killed outright (a Ray actor killed) runs no finalizer: the next process to start
    workers in the same temporary folder removes its workers' folders, and none of a live process."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)}
    start_one = (
        "import os, signal\n"
        "from oracle.harness import build_entry\n"
        "from oracle.sandbox import Worker\n"
        f"job = {{'cache': {str(tmp_path)!r}, 'candidate_path': 'c.py', 'build_timeout_s': 60}}\n"
        "w = Worker(build_entry, job, files={'c.py': 'x = 1\\n'})\n"
        "print(w.dir, flush=True)\n"
    )
    killed = subprocess.run([sys.executable, "-c", start_one + "os.kill(os.getpid(), signal.SIGKILL)\n"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=env)
    orphan = Path(killed.stdout.split()[0])
    assert killed.returncode == -9 and orphan.is_dir() and orphan.parent == scratch
    live = scratch / f"ks-worker-{os.getpid()}-live"  # this process's, as far as the sweep can tell
    unnamed = scratch / "ks-worker-unnamed"  # no owner in its name: left alone
    live.mkdir()
    unnamed.mkdir()
    after = subprocess.run([sys.executable, "-c", start_one + "w.close()\n"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env=env)
    assert after.returncode == 0, after.stderr[-2000:]
    assert not orphan.exists()
    assert live.is_dir() and unnamed.is_dir()
    assert sorted(p.name for p in scratch.glob("ks-worker-*")) == sorted([live.name, unnamed.name])
