"""pyast: a parse paused by a finalizer is not corrupted by another thread's parse (gh-106905)."""

from __future__ import annotations

import ast
import gc
import sys
import threading
from pathlib import Path

from verifier import pyast

SOURCE = (Path(__file__).resolve().parents[2] / "verifier" / "api.py").read_text()


def _parse_while_another_thread_parses(parse) -> tuple[object, bool]:
    """Parse SOURCE; at the first gc during it, let another thread parse and wait up to 0.3 s.

    Returns (what the first parse gave or raised, whether the other thread finished within the
    pause). A gc callback is Python code run mid-parse, as a finalizer is in a real run.
    """
    go, done = threading.Event(), threading.Event()
    armed = {"on": False, "other_done_in_pause": None}

    def other() -> None:
        go.wait()
        parse("def f(x):\n    return [x for _ in range(3)]\n")
        done.set()

    def callback(phase: str, info: dict) -> None:
        if phase == "start" and armed["on"]:
            armed["on"] = False
            go.set()
            armed["other_done_in_pause"] = done.wait(0.3)

    thread = threading.Thread(target=other)
    thread.start()
    old = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(5)

    def deep(n: int) -> object:  # a parse that starts a few frames down, as in a worker thread
        if n:
            return deep(n - 1)
        armed["on"] = True
        try:
            return parse(SOURCE)
        except SystemError as exc:
            return exc

    try:
        result = deep(25)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(callback)
        go.set()
        thread.join(10)
    assert done.is_set(), "the other thread's parse never finished"
    return result, armed["other_done_in_pause"]


def test_a_parse_paused_mid_tree_waits_out_another_thread_s_parse() -> None:
    result, other_ran_inside = _parse_while_another_thread_parses(pyast.parse)
    assert isinstance(result, ast.Module), result
    assert ast.dump(result) == ast.dump(ast.parse(SOURCE))
    assert other_ran_inside is False  # it waited for the lock until our parse was done


def test_plain_ast_parse_is_the_hazard_on_this_interpreter() -> None:
    """Differential: the same schedule with ast.parse lets the other parse run inside ours."""
    result, other_ran_inside = _parse_while_another_thread_parses(ast.parse)
    assert other_ran_inside is True
    if sys.version_info < (3, 12):  # the CI interpreter: the paused parse then fails
        assert isinstance(result, SystemError), result
        assert "recursion depth mismatch" in str(result)


def test_literal_eval_of_a_string_and_of_a_node() -> None:
    assert pyast.literal_eval("(1, [2.5, 'a'], None)") == (1, [2.5, "a"], None)
    assert pyast.literal_eval(ast.parse("{'k': -3}", mode="eval").body) == {"k": -3}
