"""The reference tracer's child: the templates folder is not importable from it, and torch's
lazy tracer imports happen once before any reference (a failure is reported as itself, not as
the "already registered in mega-cache" error of a retried half-import)."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeline.candidates.templates as templates
from pipeline.candidates.templates.analysis import NoTemplate, trace_source

TEMPLATES = str(Path(templates.__file__).resolve().parent)

SOURCE = f'''import sys
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    from pathlib import Path
    assert {TEMPLATES!r} not in [str(Path(p).resolve()) for p in sys.path if p], "shadowing"
    assert "torch._dynamo" in sys.modules, "the tracer was not imported before the reference"
    return []
'''


def test_probe_child_imports_the_tracer_first_and_not_the_templates_folder() -> None:
    graph = trace_source(SOURCE)
    assert any(n.base == "relu" for n in graph.nodes)


def test_a_reference_that_fails_names_its_own_error() -> None:
    with pytest.raises(NoTemplate, match="ZeroDivisionError"):
        trace_source(SOURCE.replace("return []", "return [1 // 0]"))
