"""MUSA backend: availability, clear errors without torch_musa, auto-selection order."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verifier.backends import BackendUnavailable, BuildUnit, get_backend, select_backend
from verifier.backends.musa import MusaBackend, require_torch_musa, torch_musa_installed

ROOT = Path(__file__).resolve().parents[2]

needs_no_torch_musa = pytest.mark.skipif(torch_musa_installed(),
                                         reason="torch_musa is installed here")


@needs_no_torch_musa
def test_without_torch_musa_the_backend_is_unavailable_and_says_why() -> None:
    assert MusaBackend.is_available() is False
    reason = MusaBackend.unavailable_reason()
    assert "torch_musa" in reason and "mcc" in reason
    with pytest.raises(BackendUnavailable, match="torch_musa is not installed"):
        select_backend("musa")
    with pytest.raises(BackendUnavailable, match="torch_musa"):
        require_torch_musa()


@needs_no_torch_musa
def test_musa_device_unit_compile_needs_the_toolkit(tmp_path: Path) -> None:
    unit = tmp_path / "k.cu"
    unit.write_text("#include <cuda_runtime.h>\n__global__ void k(float* y) { y[0] = 1.f; }\n")
    backend = get_backend("musa")
    assert backend.device_suffix == ".mu" and backend.sandbox_memory_mb(8192) == 0
    with pytest.raises((FileNotFoundError, BackendUnavailable), match="mcc|torch_musa"):
        backend.compile_unit(BuildUnit(unit, "device"), tmp_path / "k.o", [], None, [], 60)


def _fake_torch_musa(root: Path, available: bool) -> None:
    """A tiny torch_musa package exposing torch.musa (device queries only), for selection."""
    pkg = root / "torch_musa"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        import types
        import torch
        musa = types.ModuleType("torch.musa")
        musa.is_available = lambda: {available}
        musa.device_count = lambda: {1 if available else 0}
        musa.get_arch_list = lambda: ["mp_31"]
        torch.musa = musa
    """))


def _select_in_subprocess(tmp_path: Path, requested: str, env_extra: dict[str, str]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "CUDA_VISIBLE_DEVICES": "", **env_extra}
    code = ("from verifier.backends import select_backend, BackendUnavailable\n"
            f"try:\n    print(select_backend({requested!r}))\n"
            "except BackendUnavailable as e:\n    print('unavailable:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_auto_selects_musa_when_torch_musa_reports_a_device(tmp_path: Path) -> None:
    _fake_torch_musa(tmp_path, available=True)
    assert _select_in_subprocess(tmp_path, "auto", {}) == "musa"
    assert _select_in_subprocess(tmp_path, "cpu", {}) == "cpu"  # an explicit choice wins


def test_auto_falls_back_to_cpu_when_torch_musa_has_no_device(tmp_path: Path) -> None:
    _fake_torch_musa(tmp_path, available=False)
    assert _select_in_subprocess(tmp_path, "auto", {}) == "cpu"
    line = _select_in_subprocess(tmp_path, "musa", {})
    assert line.startswith("unavailable:") and "no MUSA device" in line


def test_musa_arch_and_slots_follow_the_environment(tmp_path: Path) -> None:
    _fake_torch_musa(tmp_path, available=True)
    code = ("from verifier.backends.musa import musa_arch, MusaBackend\n"
            "print(musa_arch()); print([s.env for s in MusaBackend().execution_slots(1)])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "MUSA_VISIBLE_DEVICES": "2,3"}
    env.pop("MUSA_ARCH", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    arch, slots = out.stdout.strip().splitlines()[-2:]
    assert arch == "mp_31"
    assert slots == "[{'MUSA_VISIBLE_DEVICES': '2'}, {'MUSA_VISIBLE_DEVICES': '3'}]"
