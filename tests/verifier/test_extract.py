"""Stage 1: code extraction from responses and the ModelNew interface check."""

from __future__ import annotations

import pytest

from verifier.checks.extract import FormatError, check_candidate, extract_code

TASK = """import torch.nn as nn
class Model(nn.Module):
    def __init__(self, a, b=2):
        super().__init__()
    def forward(self, x, y):
        return x + y
"""
GOOD = """import torch.nn as nn
class ModelNew(nn.Module):
    def __init__(self, a, b=2):
        super().__init__()
    def forward(self, x, y):
        return x
"""


def test_takes_the_last_fenced_block_with_modelnew() -> None:
    resp = f"Plan:\n```python\nprint('draft')\n```\nFinal:\n```python\n{GOOD}```\nDone."
    assert extract_code(resp).strip() == GOOD.strip()


def test_plain_code_is_used_whole() -> None:
    assert extract_code(GOOD) == GOOD


def test_unterminated_fence_still_extracts() -> None:
    assert "class ModelNew" in extract_code("```python\n" + GOOD)


def test_good_candidate_passes() -> None:
    check_candidate(GOOD, TASK)


@pytest.mark.parametrize("code,needle", [
    ("", "no code"),
    ("class ModelNew(:\n", "syntax error at line 1"),
    ("import torch\nclass Other: pass\n", "no top-level `class ModelNew`"),
    (GOOD.replace("self, a, b=2", "self"), "signatures must match"),
    (GOOD.replace("self, x, y", "self, x"), "forward"),
])
def test_format_errors_say_why(code: str, needle: str) -> None:
    with pytest.raises(FormatError, match=None) as err:
        check_candidate(code, TASK)
    assert needle in str(err.value)


def test_code_nested_past_the_parser_limit_is_a_format_error() -> None:
    code = GOOD + "x = " + "+".join(["'a'"] * 5000) + "\n"
    with pytest.raises(FormatError, match="nests too deeply"):
        check_candidate(code, TASK)
