"""tasks.ast_parse: ast.parse that the oracle's threads may call at once (CPython 3.11's AST constructor can
raise "recursion depth mismatch" for valid code when two threads build trees together)."""

from __future__ import annotations

import ast
import threading

import pytest

from tasks import ast_parse


def test_parses_run_one_at_a_time():
    done = threading.Event()
    with ast_parse._LOCK:  # another thread's parse under way
        t = threading.Thread(target=lambda: (ast_parse.parse("x = 1"), done.set()))
        t.start()
        assert not done.wait(0.2)  # waits for it
    t.join(10)
    assert done.is_set()


def test_the_interpreters_mismatch_error_is_parsed_again(monkeypatch):
    real, calls = ast.parse, []

    def once_mismatched(code, *args, **kwargs):
        calls.append(code)
        if len(calls) == 1:  # what another thread's tree, built at the same time, can leave behind
            raise SystemError("AST constructor recursion depth mismatch (before=48, after=32)")
        return real(code, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", once_mismatched)
    assert isinstance(ast_parse.parse("y = 2").body[0], ast.Assign) and len(calls) == 2


def test_other_errors_are_the_codes_own(monkeypatch):
    with pytest.raises(SyntaxError):
        ast_parse.parse("def (")

    def broken(code, *args, **kwargs):
        raise SystemError("something else")

    monkeypatch.setattr(ast, "parse", broken)
    with pytest.raises(SystemError, match="something else"):
        ast_parse.parse("z = 3")
