"""Run a harness entry point in a fresh worker process with phase watchdogs (docs/oracle.md, "Isolation").

Workers are forked from a multiprocessing fork server that has imported torch and what workers use of it
(`oracle.preload`: seconds a process otherwise) but never touched CUDA, so each candidate still gets a
clean process and CUDA context.
Each worker starts its own process group; when a phase overruns its deadline, the worker dies, or the
evaluation ends, the whole group is killed, compiler and stray children included.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import multiprocessing
import multiprocessing.spawn as mp_spawn
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from oracle.cores import Placement
from oracle.protocol import receive, send

ENV_ALLOWED = (
    "PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "SHELL", "PYTHONPATH", "VIRTUAL_ENV",
    "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH",
    "CC", "CXX", "TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "OMP_NUM_THREADS",
    "TRITON_INTERPRET", "TRITON_CACHE_DIR", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "KERNELSEARCH_CACHE",
    "PYTHONPYCACHEPREFIX",
)

# What the fork server imports before it forks a worker (each module once, however many workers follow).
FORK_SERVER_PRELOAD = ["torch", "oracle.preload", "oracle.harness"]

_context_lock = threading.Lock()
_start_lock = threading.Lock()
_context: Any = None


def _worker_context() -> Any:
    """The fork-server context, started once per process with torch, `oracle.preload` and the harness imported."""
    global _context
    with _context_lock:
        if _context is None:
            sweep_orphans()
            _scrub_fork_server_environment()
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(FORK_SERVER_PRELOAD)
            _context = ctx
        return _context


def start_fork_server() -> None:
    """Start the fork server now rather than with the first worker: its imports (torch, seconds on a host
    whose torch has no bytecode) then run beside the caller's own start, not before the first build."""
    from multiprocessing import forkserver

    _worker_context()
    with _without_main_module():
        forkserver.ensure_running()


def _scrub_fork_server_environment() -> None:
    """Start the fork server (and any restart of it) with the allow-listed environment only.

    A worker's `os.environ` is replaced, but `/proc/self/environ` still shows the environment its process
    image was started with, which for a forked worker is the fork server's: so the fork server itself must
    be started without secrets. It is started through `env -i`, which needs no change to this process's
    environment (other threads keep theirs)."""
    import multiprocessing.util as mp_util

    original = mp_util.spawnv_passfds
    if getattr(original, "_kernelsearch_scrubbed", False):
        return
    env_tool = shutil.which("env")

    def spawnv_passfds(path, args, passfds):
        if env_tool and any("forkserver" in str(a) for a in args):
            assignments = [f"{k}={v}" for k, v in scrubbed_environment().items()]
            return original(os.fsencode(env_tool), [env_tool, "-i", *assignments, path, *args[1:]], passfds)
        return original(path, args, passfds)

    spawnv_passfds._kernelsearch_scrubbed = True  # type: ignore[attr-defined]
    mp_util.spawnv_passfds = spawnv_passfds


@contextlib.contextmanager
def _without_main_module() -> Iterator[None]:
    """Start workers without re-running the caller's `__main__` in them (multiprocessing would, for a
    script or a stdin program): they need only `oracle.harness`, and a script's top level is not theirs."""
    original = mp_spawn.get_preparation_data

    def preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _start_lock:
        mp_spawn.get_preparation_data = preparation_data
        try:
            yield
        finally:
            mp_spawn.get_preparation_data = original


def scrubbed_environment() -> dict[str, str]:
    """The environment a worker may see: an allow-list, so no tokens or keys reach candidate code."""
    return {k: v for k, v in os.environ.items() if k in ENV_ALLOWED}


@dataclass
class WorkerOutcome:
    """How a worker ended: its final result, or why there is none."""

    result: dict[str, Any] | None = None
    timed_out_phase: str | None = None
    crashed: str | None = None  # exit description when it died without a result
    stderr_tail: str = ""
    elapsed_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds spent
    clocks: dict[str, float] = field(default_factory=dict)  # clock mark -> this process's perf_counter at receipt


class Worker:
    """One worker process, driven message by message by the trusted side."""

    def __init__(self, entry: Callable[[Connection, str], None], job: dict[str, Any] | None,
                 files: dict[str, str] | None = None, env: dict[str, str] | None = None,
                 placement: Placement | None = None) -> None:
        """`placement`: the cores and niceness the worker runs with (`oracle.cores`), set in it before the
        entry runs; everything it starts (ninja, nvcc, cc1plus) inherits them. `job` None: the worker starts
        ahead of its job, which `assign` gives it (an entry that supports it: `oracle.standby`)."""
        # named for this (trusted) process: a later one removes it if this one died unable to (`sweep_orphans`)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        os.chmod(self.dir, 0o700)
        self._write(job, files)
        ctx = _worker_context()
        self.conn, child_conn = ctx.Pipe(duplex=True)
        # A marker that the worker's children inherit: close() finds and kills those that left its process group.
        self.marker = secrets.token_hex(8)
        worker_env = {**scrubbed_environment(), **(env or {}), MARKER_VARIABLE: self.marker}
        self.process = ctx.Process(target=_run_entry, args=(entry, child_conn, str(self.dir), worker_env, placement),
                                   daemon=True)
        self.started = time.perf_counter()
        with _without_main_module():
            self.process.start()
        child_conn.close()
        # A worker never closed (an oracle not closed, a run interrupted) is killed and its folder removed
        # when it is collected, or at the latest when this interpreter exits: no job files left in /tmp.
        self._abandoned = weakref.finalize(self, _abandon, self.process, self.dir)
        self.phase = "start"
        self.deadline = time.monotonic() + 120.0  # until the worker names its first phase
        self.phases: dict[str, float] = {}
        self.clocks: dict[str, float] = {}
        self._phase_started = time.perf_counter()

    def _write(self, job: dict[str, Any] | None, files: dict[str, str] | None) -> None:
        for name, text in (files or {}).items():
            (self.dir / name).write_text(text)
        if job is not None:
            (self.dir / "job.json").write_text(json.dumps(job))

    def assign(self, job: dict[str, Any], files: dict[str, str] | None = None) -> None:
        """Give a worker started without its job the job and its files; its clocks and its first phase's
        deadline start now, as a worker's do when it starts."""
        self._write(job, files)
        send(self.conn, cmd="job")
        self.started = time.perf_counter()
        self.phase = "start"
        self.phases = {}
        self.deadline = time.monotonic() + 120.0
        self._phase_started = time.perf_counter()

    def messages(self) -> Iterator[dict[str, Any]]:
        """Yield the worker's non-phase messages; phase messages only move the watchdog."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise PhaseTimeout(self.phase)
            try:
                ready = self.conn.poll(min(remaining, 1.0))
            except (EOFError, OSError):
                raise WorkerDied(self._exit_description()) from None
            if not ready:
                if not self.process.is_alive() and not self.conn.poll(0):
                    raise WorkerDied(self._exit_description())
                continue
            try:
                message = receive(self.conn)
            except (EOFError, OSError):
                raise WorkerDied(self._exit_description()) from None
            except ValueError as exc:
                raise WorkerDied(f"sent a malformed message ({exc})") from None
            if "clock" in message:  # a mark timed by this (trusted) process's own clock
                self.clocks[str(message["clock"])] = time.perf_counter()
                continue
            now = time.perf_counter()
            self.phases[self.phase] = self.phases.get(self.phase, 0.0) + now - self._phase_started
            self._phase_started = now  # the phase goes on after this message, but not while we handle it
            if "phase" in message:
                self.phase = str(message["phase"])
                self.deadline = time.monotonic() + float(message.get("deadline_s", 60))
                continue
            yield message

    def send(self, **message: Any) -> None:
        """Send a command; the worker gets a fresh minute to name its next phase (our own work
        between its last message and this one is not its time)."""
        send(self.conn, **message)
        self.deadline = time.monotonic() + 60.0
        self._phase_started = time.perf_counter()

    def _exit_description(self) -> str:
        self.process.join(timeout=2)
        code = self.process.exitcode
        if code is None:
            return "stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with code {code}"

    def stderr_tail(self, limit: int = 1500) -> str:
        try:
            with open(self.dir / "stderr.txt", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """Send a signal to the worker and everything it started (SIGSTOP/SIGCONT while another candidate
        is timed)."""
        if self.process.pid:
            signal_trees([self.process.pid], sig)

    def close(self) -> None:
        """Kill the worker, everything it started, and remove its folder.

        Descendants are killed while the worker still lives, so a child caught between `fork` and `exec`
        (not yet carrying the marker, maybe already out of the folder and the process group) is still
        found as the worker's child; the marker scan runs again after the worker is gone, for those that
        were exec-ing at that moment."""
        pid = self.process.pid
        if pid:
            for _ in range(3):
                left = _descendants(pid) | _marked(self.marker, self.dir)
                if not left:
                    break
                _kill_all(left)
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError):
                    pass
        self.process.join(timeout=5)
        for _ in range(3):  # marked ones still exec-ing when the worker died; scan again while any are found
            left = _marked(self.marker, self.dir)
            if not left:
                break
            _kill_all(left)
            time.sleep(0.05)
        self.conn.close()
        self._abandoned()  # the folder, once


def _abandon(process: multiprocessing.process.BaseProcess, folder: Path) -> None:
    """A worker's last cleanup: its process group killed if it still runs, its folder removed."""
    pid = process.pid
    if pid and process.exitcode is None:  # still running: its pid is not anybody else's yet
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


FOLDER_PREFIX = "ks-worker-"


def sweep_orphans(folder: Path | None = None) -> list[Path]:
    """Remove the worker folders whose trusted process is gone (`FOLDER_PREFIX` + its pid): one killed
    outright (a Ray actor killed, a SIGKILL) runs no finalizer, and its workers' job files would stay in the
    temporary folder for good. Folders of a live process, or of another user, are left alone. Returns those removed."""
    removed = []
    for path in (folder or Path(tempfile.gettempdir())).glob(f"{FOLDER_PREFIX}*-*"):
        owner = path.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not owner.isdigit() or _alive(int(owner)):
            continue
        with contextlib.suppress(OSError):
            if path.is_dir() and path.stat().st_uid == os.getuid():
                shutil.rmtree(path)
                removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


MARKER_VARIABLE = "KERNELSEARCH_WORKER"


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _descendants(*roots: int) -> set[int]:
    """Every process below the `roots` in the process tree, from one scan of /proc (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def signal_trees(pids: Iterable[int], sig: int) -> None:
    """Signal processes, the groups they lead, and every process below them, also those in groups of their
    own (ninja starts each compiler command in a new process group); one scan of /proc per pass. A SIGSTOP
    is sent to the descendants twice: a child forked between the first scan and its parent's stop is caught
    by the second."""
    alive = []
    for pid in pids:
        try:
            os.killpg(pid, sig) if os.getpgid(pid) == pid else os.kill(pid, sig)
            alive.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    if not alive:
        return
    for _ in range(2 if sig == signal.SIGSTOP else 1):
        for child in _descendants(*alive):
            try:
                os.kill(child, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _marked(marker: str, job_dir: Path) -> set[int]:
    """Processes a worker left behind outside its process tree (a child that called setsid, a daemon whose
    parent exited): those that carry its marker in their environment or still work in its folder. Linux
    only; a process that cleared its environment and left the folder escapes this (see the threat model)."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    me = os.getpid()
    found: set[int] = set()
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                hit = needle in f.read().split(b"\0")
            if not hit:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                hit = cwd == str(job_dir) or cwd.startswith(str(job_dir) + os.sep)
        except OSError:
            continue
        if hit:
            found.add(pid)
    return found


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class PhaseTimeout(Exception):
    """A phase of the worker overran its deadline; the message names the phase."""


class WorkerDied(Exception):
    """The worker ended without sending its result; the message says how."""


# How the last `_drop_root_privileges` went in this process (a worker): "" when it did not run, "dropped",
# "not root", or what failed. The drop never stops a worker; this note is only for whoever wants to know.
PRIVILEGE_DROP_NOTE = ""

_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _drop_root_privileges() -> str:
    """A worker running as root keeps uid 0 (the interpreter and venv may live under a 0700 /root) but
    loses every capability: no new privileges through exec (setuid binaries, file capabilities), an empty
    bounding set, no ambient capabilities, and empty effective, permitted and inheritable sets. Without
    them uid 0 is an ordinary owner: it cannot read or signal other users' processes, override file
    modes, change owners, load modules or raise resource limits. Linux only; any failure is recorded in
    `PRIVILEGE_DROP_NOTE` and otherwise ignored (a worker must never fail because of this)."""
    global PRIVILEGE_DROP_NOTE
    import sys

    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        PRIVILEGE_DROP_NOTE = "not root"
        return PRIVILEGE_DROP_NOTE
    failed: list[str] = []
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        prctl.restype = ctypes.c_int

        def call(what: str, *args: int) -> None:
            if prctl(*args, *([0] * (5 - len(args)))) != 0:
                failed.append(f"{what}: {os.strerror(ctypes.get_errno())}")

        call("no_new_privs", _PR_SET_NO_NEW_PRIVS, 1)
        try:
            with open("/proc/sys/kernel/cap_last_cap") as f:
                last_cap = int(f.read().strip())
        except (OSError, ValueError):
            last_cap = 40  # CAP_CHECKPOINT_RESTORE, the last one as of Linux 5.9
        # The bounding set first: dropping from it needs CAP_SETPCAP, which capset below takes away.
        for cap in range(last_cap + 1):
            if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: unknown to this kernel
                failed.append(f"bounding cap {cap}: {os.strerror(ctypes.get_errno())}")
        call("ambient", _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

        header = Header(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (Data * 2)()  # version 3: two 32-bit words per set, all zero
        if libc.capset(ctypes.byref(header), data) != 0:
            failed.append(f"capset: {os.strerror(ctypes.get_errno())}")
    except Exception as exc:  # noqa: BLE001 - no libc, no prctl: run as before
        failed.append(f"{type(exc).__name__}: {exc}")
    PRIVILEGE_DROP_NOTE = "; ".join(failed) if failed else "dropped"
    return PRIVILEGE_DROP_NOTE


# What the last `Placement.apply_here` in this process (a worker) could not do; empty when it did all or did
# not run. As with the privilege drop, a worker never fails because of it.
PLACEMENT_NOTE = ""


def _run_entry(entry: Callable[[Connection, str], None], conn: Connection, job_dir: str, env: dict[str, str],
               placement: Placement | None = None) -> None:
    global PLACEMENT_NOTE
    os.environ.clear()
    os.environ.update(env)
    if placement is not None:  # first, while this process has one thread and no children
        try:
            PLACEMENT_NOTE = "; ".join(placement.apply_here())
        except BaseException as exc:  # noqa: BLE001 - never let the placement stop a worker
            PLACEMENT_NOTE = f"{type(exc).__name__}: {exc}"
    try:
        _drop_root_privileges()
    except BaseException:  # noqa: BLE001 - never let the drop stop a worker
        pass
    _become_subreaper()
    _stacks_on_request()
    entry(conn, job_dir)
    conn.close()
    # Wait to be killed (`Worker.close`) rather than exit: while this process lives, everything the candidate
    # started is below it in the process tree, and `close` finds it there. A child that is between its fork
    # and an exec shows neither the marker (its /proc environ is the fork server's) nor, once it left the
    # folder, the folder: had this worker exited, such a child would escape to init unseen.
    while True:
        signal.pause()  # no interpreter teardown either: a candidate's atexit hooks never run


def _stacks_on_request() -> None:
    """`kill -USR1 PID` writes every thread's Python stack to the worker's stderr (its folder's stderr.txt
    once the entry redirected it): what a worker that stopped answering is waiting for."""
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def _become_subreaper() -> None:
    """Linux: processes orphaned below this worker (a daemon's double fork) are re-parented to it, not to
    init, so they stay in its tree for `Worker.close` to find."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def run_to_result(worker: Worker, close: bool = True) -> WorkerOutcome:
    """Drive a worker that sends only phases and one final `result`; closes it unless told not to
    (the caller still needs the files it wrote)."""
    outcome = WorkerOutcome()
    try:
        for message in worker.messages():
            if "result" in message:
                outcome.result = message["result"]
                break
    except PhaseTimeout as exc:
        outcome.timed_out_phase = str(exc)
    except WorkerDied as exc:
        outcome.crashed = str(exc)
    finally:
        outcome.elapsed_s = time.perf_counter() - worker.started
        outcome.stderr_tail = worker.stderr_tail()
        outcome.phases = dict(worker.phases)
        outcome.clocks = dict(worker.clocks)
        if close:
            worker.close()
    return outcome
