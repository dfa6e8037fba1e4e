"""Shared fixtures: sample KernelBench sources and a workspace in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.workspace import Workspace

# One extension build cache for the whole test session, so identical sources compile once.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "kernelsynth-tests"
                                                  / "torch_extensions"))

RELU_TASK = '''import torch
import torch.nn as nn

batch_size = 16
dim = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

LINEAR_TASK = '''import torch
import torch.nn as nn

batch_size = 8
in_features = 64
out_features = 32


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")


@pytest.fixture
def relu_task_source() -> str:
    return RELU_TASK


@pytest.fixture
def linear_task_source() -> str:
    return LINEAR_TASK
