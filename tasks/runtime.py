"""Run a task's code: each task gets its own namespace, so tasks never see each other's globals."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch


class TaskCodeError(Exception):
    """The task's code is malformed: the message is one line that names the fault."""


@dataclass
class TaskModule:
    """The three things a task's code must define, taken from its namespace."""

    model_cls: type
    get_inputs: Callable[[], list[Any]]
    get_init_inputs: Callable[[], list[Any]]
    namespace: dict[str, Any]

    def make_model(self) -> torch.nn.Module:
        return self.model_cls(*self.get_init_inputs())


def one_line(exc: BaseException) -> str:
    """`TypeError: msg` on a single line, for user-facing messages."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def exec_task_code(code: str, origin: str = "<task>") -> TaskModule:
    """Execute task code in a fresh namespace and check that it defines what a task must."""
    namespace: dict[str, Any] = {"__name__": "kernelsearch_task", "__file__": origin}
    try:
        compiled = compile(code, origin, "exec")
    except SyntaxError as exc:
        raise TaskCodeError(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a task's own deprecation noise is not the user's concern
            exec(compiled, namespace)
    except Exception as exc:  # noqa: BLE001 - any failure of foreign code is a task fault
        raise TaskCodeError(f"running the task's code raised {one_line(exc)}") from None
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not callable(namespace.get(n))]
    if missing:
        raise TaskCodeError(f"the code defines no {', '.join(missing)}")
    if not (isinstance(namespace["Model"], type) and issubclass(namespace["Model"], torch.nn.Module)):
        raise TaskCodeError("Model is not a torch.nn.Module subclass")
    return TaskModule(namespace["Model"], namespace["get_inputs"], namespace["get_init_inputs"], namespace)


def task_constants(namespace: dict[str, Any]) -> dict[str, Any]:
    """The task module's module-level constants: numbers, strings, booleans and tuples of them. KernelBench
    runs a candidate where the task's code ran, so model-written kernels lean on these names (`batch_size`,
    `hardtanh_min`); never `Model`, the task's functions, modules or other objects."""

    def plain(value: Any) -> bool:
        if isinstance(value, tuple):
            return all(plain(v) for v in value)
        return type(value) in (int, float, str, bool)

    return {k: v for k, v in namespace.items() if not k.startswith("_") and plain(v)}


def tensors_in(values: Any) -> list[torch.Tensor]:
    """The tensors in a (possibly nested) list or tuple of inputs or outputs."""
    if isinstance(values, torch.Tensor):
        return [values]
    if isinstance(values, (list, tuple)):
        return [t for v in values for t in tensors_in(v)]
    return []


def nbytes(values: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(values))


@dataclass
class ShapeProbe:
    """What a dry run on the meta device found: input bytes, and the error if the model did not run there."""

    input_bytes: int
    meta_error: str | None  # None: Model built and ran on `meta`; otherwise check it for real
    output_bytes: int = 0  # of one forward's outputs, from the meta run (0: it did not run there)


def probe(module: TaskModule, forward: bool = True) -> ShapeProbe:
    """Measure the inputs and try the model without allocating memory.

    Runs under the `meta` device, where tensors have shapes but no storage, so a level-1 task with
    several GB of inputs costs nothing to measure. Code the meta device cannot run (data-dependent ops)
    yields `meta_error`; the caller then checks the task for real once it is fitted to a small size.
    With `forward=False` only the model's construction is tried (a meta forward of a long RNN is slow).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _probe(module, forward)


def _has_recurrent_layers(model: torch.nn.Module) -> bool:
    """The meta device runs RNN/LSTM/GRU layers step by step in Python (seconds a task): skip their trial."""
    return any(isinstance(m, torch.nn.RNNBase) for m in model.modules())


def _probe(module: TaskModule, forward: bool) -> ShapeProbe:
    try:
        with torch.device("meta"), torch.no_grad():
            inputs = module.get_inputs()
    except Exception:  # noqa: BLE001 - measure for real instead
        with torch.no_grad():
            inputs = module.get_inputs()
    try:
        with torch.device("meta"), torch.no_grad():
            model = module.make_model()
            outputs = model(*inputs) if forward and not _has_recurrent_layers(model) else None
        error = None
    except Exception as exc:  # noqa: BLE001
        error, outputs = one_line(exc), None
    return ShapeProbe(nbytes(inputs), error, nbytes(outputs))


def check_runs(module: TaskModule) -> None:
    """Build the model and run it once for real (CPU); raise TaskCodeError with the reason if it fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check_runs(module)


def _check_runs(module: TaskModule) -> None:
    try:
        model = module.make_model()
    except Exception as exc:  # noqa: BLE001
        raise TaskCodeError(f"Model(*get_init_inputs()) raised {one_line(exc)}") from None
    try:
        inputs = module.get_inputs()
    except Exception as exc:  # noqa: BLE001
        raise TaskCodeError(f"get_inputs() raised {one_line(exc)}") from None
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as exc:  # noqa: BLE001
        raise TaskCodeError(f"Model.forward raised {one_line(exc)}") from None
