"""Typer option definitions shared by every command that takes tasks, so their flags read the same."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Source = Annotated[
    str,
    typer.Option("--source", help="'builtin', a KernelBench checkout, or a data file (.jsonl/.json/.parquet)."),
]
Level = Annotated[Optional[int], typer.Option("--level", min=1, help="Only tasks of this level.")]
Ids = Annotated[Optional[str], typer.Option("--ids", help="Problem ids, e.g. 1-10,15.")]
TaskIds = Annotated[Optional[str], typer.Option("--tasks", help="Task ids, e.g. level1/19_ReLU,builtin/3_Softmax_Rows.")]
MaxInputMb = Annotated[
    Optional[float],
    typer.Option("--max-input-mb", min=0.001, help="Shrink size constants until inputs fit (default: 256 on a CPU, 1/32 of GPU memory on a GPU)."),
]
Device = Annotated[str, typer.Option("--device", help="cpu or cuda (default: cuda when a GPU is visible).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Tolerance = Annotated[
    str,
    typer.Option("--tolerance", help="Tolerance policy: kernelbench (fp32 1e-4, fp16/bf16 1e-2), kernelbench-v0.1 "
                 "(1e-2 for every dtype) or numeric (against a float64 reference; see docs/oracle.md)."),
]
