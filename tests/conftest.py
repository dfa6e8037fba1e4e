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

TEST_CACHE = Path.home() / ".cache" / "kernelsynth-tests"  # the build caches tests share
# One extension build cache for the whole test session, so identical sources compile once.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(TEST_CACHE / "torch_extensions"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Bound the shared test build caches together (KS_TEST_CACHE_GB, default 8; 0: none),
    least recently used first; what another session used in the last hour stays."""
    from verifier.compile.cache_bound import trim

    gb = float(os.environ.get("KS_TEST_CACHE_GB", "8"))
    if gb > 0 and TEST_CACHE.is_dir():
        trim([d for d in TEST_CACHE.iterdir() if d.is_dir()], int(gb * 2**30), grace_s=3600)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")


@pytest.fixture
def relu_task_source() -> str:
    return RELU_TASK


@pytest.fixture
def linear_task_source() -> str:
    return LINEAR_TASK
