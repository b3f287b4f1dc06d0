"""Consoles for the command line: rich at a terminal's width, and at a width no table reaches elsewhere.

rich draws at 80 columns when its output is not a terminal (a pipe, a log file, CI), which cuts task ids,
headers and numbers to fit. Output that is not a terminal is read by programs or pasted from, so there it
is drawn at its natural width instead: nothing is cut, and tables are as wide as their contents.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.table import Table

NATURAL_WIDTH = 1000  # wider than any table the project draws; rich never pads a table out to it


def make_console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = NATURAL_WIDTH
    return console


def add_id_column(table: Table, header: str, ids: Iterable[str], room: int, max_width: int | None = None) -> None:
    """A column of task ids that never cuts one: ids that fit in `room` (the columns the table can spare
    for them) stay on one line, never squeezed by the columns beside them; longer ones fold onto more lines.
    (rich's collapsing of a too-wide table ignores a column's min_width, so no_wrap is what keeps it whole.)"""
    widest = max((len(i) for i in ids), default=len(header))
    fits = widest <= min(room, max_width or widest)
    table.add_column(header, no_wrap=fits, overflow="fold", max_width=None if fits else max_width)
