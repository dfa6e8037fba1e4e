"""CUDA template text compiled with nvcc once per (translation unit, nvcc, torch): a unit this
nvcc and these torch headers compiled before is not compiled again (~70 s here); any change to
a template's code changes the key."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import torch

from pipeline.candidates.templates.selfcheck import cuda_translation_unit, nvcc_compile

MARKERS = Path.home() / ".cache" / "kernelsynth-tests" / "nvcc-templates"


def assert_nvcc_compiles(codes: list[str], workdir: Path) -> None:
    """Assert `codes` compile as one nvcc translation unit (skipped where it did before)."""
    nvcc_id = subprocess.run([shutil.which("nvcc") or "nvcc", "--version"], capture_output=True,
                             text=True).stdout
    key = hashlib.sha256("\0".join([cuda_translation_unit(codes), nvcc_id,
                                    torch.__version__]).encode()).hexdigest()[:24]
    marker = MARKERS / f"{key}.ok"
    if marker.is_file():
        return
    ok, log = nvcc_compile(codes, workdir)
    assert ok, log
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("compiled\n")
