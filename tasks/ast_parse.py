"""`ast.parse` that threads may call at once.

CPython 3.11's AST constructor keeps its recursion depth in state shared by the interpreter's threads; two
threads building trees at once can leave it unbalanced, and `ast.parse` then raises "SystemError: AST
constructor recursion depth mismatch" for valid code (python/cpython#106905). The oracle extracts and
shrinks candidates' and tasks' code in several threads, so every parse here goes through one lock, and a
parse that still meets the error (another library parsing outside the lock) is made once more.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()
MISMATCH = "recursion depth mismatch"


def parse(code: str) -> ast.Module:
    """`ast.parse(code)`, one thread at a time; raises what `ast.parse` raises for the code itself."""
    with _LOCK:
        try:
            return ast.parse(code)
        except SystemError as exc:
            if MISMATCH not in str(exc):
                raise
            return ast.parse(code)
