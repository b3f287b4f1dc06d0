"""What the processes started by tests/test_gpu_lock.py run: hold a machine-wide lock and say so in files.

The lock module is loaded from its file, not through the `oracle` package, so that these processes start
in a tenth of a second instead of importing torch."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "oracle" / "gpu_lock.py"


def gpu_lock():
    """oracle/gpu_lock.py as a module of its own (no torch)."""
    if "ks_gpu_lock" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ks_gpu_lock", _PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["ks_gpu_lock"] = module
        spec.loader.exec_module(module)
    return sys.modules["ks_gpu_lock"]


def _side(lock, side: str):
    return lock.held() if side == "timing" else lock.checking()


def hold_until(root: str, key: str, side: str, folder: str, name: str) -> None:
    """Take the lock (`side`: "timing" or "checking"), write `<name>.in` with the monotonic time, wait for
    `<name>.release` to appear (`<name>.waited`: the seconds it waited), write `<name>.out`, release."""
    lock = gpu_lock().timing_lock(key, Path(root))
    out = Path(folder)
    (out / f"{name}.trying").write_text(str(time.monotonic()))
    with _side(lock, side) as hold:
        (out / f"{name}.in").write_text(str(time.monotonic()))
        (out / f"{name}.waited").write_text(str(hold.waited_s))
        while not (out / f"{name}.release").exists():
            time.sleep(0.01)
        (out / f"{name}.out").write_text(str(time.monotonic()))


def probe(root: str, key: str, side: str, folder: str, name: str) -> None:
    """Try the lock (`side`) without waiting; write `<name>.json`: "free" or "busy"."""
    module = gpu_lock()
    lock = module.timing_lock(key, Path(root))
    try:
        with lock.held(wait=False) if side == "timing" else lock.checking(wait=False):
            pass
        answer = "free"
    except module.TimingLockBusy:
        answer = "busy"
    (Path(folder) / f"{name}.json").write_text(json.dumps(answer))
