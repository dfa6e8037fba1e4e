"""libcst discovery of nn.Module subclasses."""

from __future__ import annotations

import pytest

from sources.scan import ScanError, find_module_classes

CODE = '''import torch
from torch import nn
from torch.nn import Module


class Helper:
    pass


class Block(LocalBase):
    def forward(self, x):
        return x


class LocalBase(nn.Module):
    class Inner(nn.Module):
        pass

    def forward(self, x):
        return x


class Bare(Module):
    pass


class Full(torch.nn.Module):
    pass


class Seq(nn.Sequential):
    pass


class Pretrained(BertPreTrainedModel):
    pass


class Model(PreTrainedModel):
    pass


def factory():
    class Hidden(nn.Module):
        pass
    return Hidden
'''


def test_finds_direct_local_and_framework_subclasses():
    found = {c.name: c for c in find_module_classes(CODE)}
    assert list(found) == ["Block", "LocalBase", "Bare", "Full", "Seq", "Model"]
    assert found["LocalBase"].direct and not found["Block"].direct
    assert not found["Model"].direct
    assert (found["LocalBase"].line_start, found["LocalBase"].line_end) == (15, 20)
    lines = CODE.splitlines()
    assert lines[found["Full"].line_start - 1] == "class Full(torch.nn.Module):"


def test_other_module_attribute_is_not_nn():
    code = "import foo\n\nclass A(foo.Module):\n    pass\n\nclass B(nn.Linear):\n    pass\n"
    assert find_module_classes(code) == []


def test_python2_source_raises_scan_error():
    with pytest.raises(ScanError, match="x.py: syntax error"):
        find_module_classes('print "hello"\n', "x.py")


DECORATED = '''"""Module docstring."""
# a comment

import torch.nn as nn


@register
@other(
    arg=1,
)
class Decorated(nn.Module):
    # trailing comment inside
    def forward(self, x):
        return x

    # comment at the end of the body


# comment before
class After(Decorated):
    pass
'''


def test_line_spans_match_the_stdlib_ast():
    import ast

    from sources.seed import seed_files

    sources = [CODE, DECORATED] + [p.read_text() for p in seed_files()[:10]]
    for code in sources:
        spans = {c.name: (c.line_start, c.line_end) for c in find_module_classes(code)}
        expected = {n.name: (n.lineno, n.end_lineno) for n in ast.parse(code).body
                    if isinstance(n, ast.ClassDef) and n.name in spans}
        assert spans == expected
    assert [c.name for c in find_module_classes(DECORATED)] == ["Decorated", "After"]
