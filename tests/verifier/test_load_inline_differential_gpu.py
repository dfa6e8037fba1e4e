"""CUDA differential with outputs, on a GPU host (issue 15): torch's real `load_inline` and our
builder agree on every CUDA conformance case in what a user sees: built or not, the bound
names, and `ModelNew`'s outputs on the same inputs. The work is
`benchmarks/load_inline_differential_gpu.py` (its H100 table:
benchmarks/results/load_inline_differential_h100.md); this test runs it on the cases whose
load_inline forms differ most. Skipped without a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.load_inline_differential_gpu import run

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU and a CUDA torch")]
CASES = ["cuda_kb_idiom", "cuda_nvcc_one_string", "cuda_functions_dict", "cuda_pybind_module",
         "cuda_in_init", "cuda_two_extensions", "cuda_compile_error", "cuda_wrong_index",
         "cuda_softmax_warp"]


def test_torch_and_our_builder_agree_on_outcome_names_and_outputs(tmp_path: Path) -> None:
    rows = run(CASES, jobs=4, work_root=tmp_path, timeout=600)
    assert [r["case"] for r in rows] == CASES
    by = {r["case"]: r for r in rows}
    assert not by["cuda_compile_error"]["torch"]["built"]
    assert by["cuda_kb_idiom"]["outputs"] == "equal"
    assert by["cuda_wrong_index"]["outputs"] == "equal"  # the same wrong answer on both sides
    bad = [(r["case"], r["torch"]["error"][:200], r["ours"]["error"][:200])
           for r in rows if not r["agree"]]
    assert not bad, bad
