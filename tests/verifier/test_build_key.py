"""The build cache key names the toolchain: compiler identity (`--version`), torch build, arch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from verifier.backends import tool_identity
from verifier.backends.cpu import CpuBackend
from verifier.backends.cuda import CudaBackend
from verifier.compile.builder import BuildContext, toolchain_key


def _fake_tool(path: Path, version: str) -> str:
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    os.chmod(path, 0o755)
    return str(path)


@pytest.fixture(autouse=True)
def _fresh_identity_cache():
    tool_identity.cache_clear()
    yield
    tool_identity.cache_clear()


def test_host_compiler_version_changes_key(tmp_path: Path, monkeypatch) -> None:
    cxx = _fake_tool(tmp_path / "c++", "g++ (Fake) 13.2.0")
    monkeypatch.setenv("CXX", cxx)
    before = toolchain_key(CpuBackend())
    assert toolchain_key(CpuBackend()) == before  # stable within a process
    _fake_tool(tmp_path / "c++", "g++ (Fake) 14.1.0")
    assert toolchain_key(CpuBackend()) == before  # `--version` is read once per process
    tool_identity.cache_clear()  # a new process
    after = toolchain_key(CpuBackend())
    assert after != before
    ctx_a, ctx_b = BuildContext(CpuBackend(), tmp_path), BuildContext(CpuBackend(), tmp_path)
    assert ctx_a.root == ctx_b.root == tmp_path / f"cpu-{after}"


def test_other_compiler_path_changes_key(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("CXX", _fake_tool(tmp_path / "a" / "g++", "same"))
    a = toolchain_key(CpuBackend())
    monkeypatch.setenv("CXX", _fake_tool(tmp_path / "b" / "g++", "same"))
    assert toolchain_key(CpuBackend()) != a


def test_real_compiler_identity_is_its_version() -> None:
    ident = tool_identity("g++")
    assert "g++" in ident and any(ch.isdigit() for ch in ident.split("\n", 1)[1])


def test_missing_compiler_named_not_raised(tmp_path: Path) -> None:
    ident = tool_identity(str(tmp_path / "no-such-cc"))
    assert "unavailable" in ident and "no-such-cc" in ident


def test_torch_version_changes_key(monkeypatch) -> None:
    before = toolchain_key(CpuBackend())
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert toolchain_key(CpuBackend()) != before


def test_nvcc_version_and_arch_change_cuda_key(tmp_path: Path, monkeypatch) -> None:
    import verifier.backends.cuda as cuda

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    cuda.cuda_arch.cache_clear()
    nvcc = _fake_tool(tmp_path / "nvcc", "Cuda compilation tools, release 13.0, V13.0.48")
    monkeypatch.setattr(cuda, "nvcc_path", lambda: nvcc)
    k1 = toolchain_key(CudaBackend())
    assert k1 != toolchain_key(CpuBackend())
    _fake_tool(tmp_path / "nvcc", "Cuda compilation tools, release 13.1, V13.1.80")
    tool_identity.cache_clear()
    k2 = toolchain_key(CudaBackend())
    assert k2 != k1
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "10.0")
    cuda.cuda_arch.cache_clear()
    assert toolchain_key(CudaBackend()) != k2
    cuda.cuda_arch.cache_clear()
