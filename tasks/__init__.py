"""Tasks: the problems whose PyTorch operators a candidate kernel must replace."""

from tasks.fitting import CPU_BUDGET_MB, FitError
from tasks.loaders import LoadResult, SourceError, load_tasks
from tasks.model import Task, TaskError
from tasks.runtime import TaskCodeError, TaskModule, exec_task_code
from tasks.selection import Selection, SelectionError

__all__ = [
    "CPU_BUDGET_MB",
    "FitError",
    "LoadResult",
    "Selection",
    "SelectionError",
    "SourceError",
    "Task",
    "TaskCodeError",
    "TaskError",
    "TaskModule",
    "exec_task_code",
    "load_tasks",
]
