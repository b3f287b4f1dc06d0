"""Tasks: the problems whose PyTorch operators a candidate kernel must replace."""

from tasks.fitting import CPU_BUDGET_MB, FitError
from tasks.loaders import LoadResult, Selected, SourceError, fit_selected, load_tasks, read_selected
from tasks.model import Task, TaskError
from tasks.runtime import TaskCodeError, TaskModule, exec_task_code
from tasks.selection import Selection, SelectionError

__all__ = [
    "CPU_BUDGET_MB",
    "FitError",
    "LoadResult",
    "Selected",
    "Selection",
    "SelectionError",
    "SourceError",
    "Task",
    "TaskCodeError",
    "TaskError",
    "TaskModule",
    "exec_task_code",
    "fit_selected",
    "load_tasks",
    "read_selected",
]
