"""Shared fixtures: sample KernelBench sources and a workspace in tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pipeline.workspace import Workspace

# One definition of the sample tasks, shared with the adversarial suite (conftest itself is not
# importable under --import-mode=importlib, so the tests import that module instead).
sys.path.insert(0, str(Path(__file__).parent / "verifier"))
from verifier_cases import LINEAR_TASK, RELU_TASK  # noqa: E402

# One extension build cache for the whole test session, so identical sources compile once.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "kernelsynth-tests"
                                                  / "torch_extensions"))


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")


@pytest.fixture
def relu_task_source() -> str:
    return RELU_TASK


@pytest.fixture
def linear_task_source() -> str:
    return LINEAR_TASK
