"""Consoles for the command line: rich at a terminal's width, and at a width no table reaches elsewhere.

rich draws at 80 columns when its output is not a terminal (a pipe, a log file, CI), which cuts task ids,
headers and numbers to fit. Output that is not a terminal is read by programs or pasted from, so there it
is drawn at its natural width instead: nothing is cut, and tables are as wide as their contents.
"""

from __future__ import annotations

from rich.console import Console

NATURAL_WIDTH = 1000  # wider than any table the project draws; rich never pads a table out to it


def make_console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = NATURAL_WIDTH
    return console
