"""The CPU-runnable parts of benchmarks/verify_kernelbench.py and its candidate corpus."""

from __future__ import annotations

import ast
import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.kernelbench_corpus import LABELS, PROBLEMS, candidates
from benchmarks.kernelbench_corpus.__main__ import batch_rows
from benchmarks.verify_kernelbench import (
    agreement,
    device_tag,
    expected,
    kb_subset,
    markdown,
    memory_deaths,
    problem_sizes,
    summarize,
)

ROOT = Path(__file__).parents[2]
GELU = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x):
        return torch.nn.functional.gelu(x)

batch_size = 4096
dim = 393216

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
'''


def _load_inline_call(tree: ast.Module) -> ast.Call:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "load_inline"]
    assert len(calls) == 1
    return calls[0]


def test_corpus_covers_levels_labels_and_is_load_inline_form() -> None:
    cands = list(candidates())
    assert len({c.candidate_id for c in cands}) == len(cands) >= 150
    assert set(collections.Counter(c.label for c in cands)) == set(LABELS)
    assert {c.problem.split("/")[0] for c in cands} == {"level1", "level2", "level3"}
    assert 30 <= len(PROBLEMS) <= 60
    sources = set()
    for c in cands:
        tree = ast.parse(c.source)
        assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
        call = _load_inline_call(tree)
        kw = {k.arg for k in call.keywords}
        assert {"cpp_sources", "cuda_sources", "functions"} <= kw, c.candidate_id
        cuda = re.search(r'r"""(.*?)"""', c.source, re.S).group(1)
        declared = re.search(r'cpp_source_\w+ = """(.*?)"""', c.source, re.S).group(1)
        for fn in re.findall(r'functions=\["(\w+)"\]', c.source):
            assert f"torch::Tensor {fn}(" in cuda and f"{fn}(" in declared, c.candidate_id
        sources.add(cuda)
    assert len(sources) == len(cands)  # no two candidates share a build


def test_batch_rows_read_problem_files_and_name_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "26_GELU_.py").write_text(GELU)
    gelu = [c for c in candidates((1,)) if c.problem == "level1/26_GELU_.py"]
    rows = batch_rows(tmp_path, gelu)
    assert len(rows) == len(gelu) >= 4
    assert all(r["task_source"] == GELU and r["backend"] == "cuda" for r in rows)
    relu = [c for c in candidates((1,)) if c.problem == "level1/19_ReLU.py"]
    with pytest.raises(SystemExit, match="19_ReLU.py"):
        batch_rows(tmp_path, relu)


def test_corpus_cli_writes_a_verifier_batch(tmp_path: Path) -> None:
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "26_GELU_.py").write_text(GELU)
    out = tmp_path / "rows.jsonl"
    p = subprocess.run([sys.executable, "-m", "benchmarks.kernelbench_corpus", "--kb-dir",
                        str(tmp_path / "missing"), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "cannot read the problem file" in p.stderr


def test_problem_sizes_are_computed_without_allocating(tmp_path: Path) -> None:
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "26_GELU_.py").write_text(GELU)
    (tmp_path / "level1" / "bad.py").write_text("def get_inputs(:\n")
    sizes = problem_sizes(tmp_path, ["level1/26_GELU_.py", "level1/bad.py"])
    assert sizes["level1/26_GELU_.py"]["inputs"] == [[[4096, 393216], 4096 * 393216 * 4]]
    assert sizes["level1/26_GELU_.py"]["outputs"][0][1] == 6442450944
    assert "SyntaxError" in sizes["level1/bad.py"]["error"]


def _v(cid: str, status: str, error: str = "") -> dict:
    return {"candidate_id": cid, "status": status, "error": error}


def test_memory_deaths_statuses_and_agreement() -> None:
    vs = [_v("a", "runtime_error", "worker died with SIGKILL"),
          _v("b", "runtime_error", "CUDA error: an illegal memory access was encountered"),
          _v("c", "runtime_error", "CUDA out of memory. Tried to allocate 12 GiB"),
          _v("d", "runtime_error", "ValueError: shapes"), _v("e", "incorrect", "memory")]
    # an illegal memory access is the kernel's crash, not the verifier's memory
    assert memory_deaths(vs) == ["a", "c"]
    assert expected("correct_fast", "correct") and not expected("correct_fast", "fallback")
    assert expected("correct_slow", "fallback", strict=False)
    assert expected("timeout", "hanging") and not expected("incorrect", "crashing")
    both, agree, diff = agreement([_v("a", "correct_fast"), _v("b", "incorrect"),
                                   _v("x", "timeout")],
                                  [_v("a", "correct_slow"), _v("b", "runtime_error")])
    assert (both, agree) == (2, 1) and diff == ["b: incorrect vs runtime_error"]


def test_summary_and_markdown_of_a_partial_run() -> None:
    labels = {"a": "correct", "b": "wrong", "c": "hanging", "d": "fallback"}
    settled = dict(_v("a", "correct_slow"), findings=[{"rule": "timing_settled"}])
    hung = dict(_v("c", "timeout"), error="correctness stage passed its hang deadline: ...",
                findings=[{"rule": "confirmed_fresh"}])
    s = summarize({"wall_s": 36.0, "cut": True, "verdicts": [settled, hung]}, labels, 4)
    assert (s["settled"], s["hang_deadline"], s["confirmed_fresh"]) == (1, 1, 1)
    run = {"wall_s": 36.0, "cut": True, "verdicts": [
        _v("a", "correct_fast"), _v("b", "incorrect"), _v("d", "static_reject")]}
    s = summarize(run, labels, 4)
    assert s["decided"] == 3 and s["ran"] == 2 and s["ran_per_gpu_hour"] == 200
    assert (s["settled"], s["hang_deadline"]) == (0, 0)
    assert s["as_labelled"] == 3 and s["memory_deaths"] == []
    report = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cpus": 16, "n": 4,
              "problems": 2, "labels": collections.Counter(labels.values()),
              "command": "python -m benchmarks.verify_kernelbench --kb-dir K",
              "sizes": {"level1/26_GELU_.py": {"inputs": [[[4096, 393216], 6442450944]],
                                               "outputs": [[[4096, 393216], 6442450944]]}}}
    md = markdown(report)
    assert "| level1/26_GELU_.py | 6144 | 6144 |" in md and "ours cold" not in md
    report["ours1"] = s
    report["kb"] = {"precompile_s": 20.0, "evaluated": 2, "of": 3, "wall_s": 72.0,
                    "per_gpu_hour": 100, "agree": 2, "compared": 2, "differ": []}
    md = markdown(report)
    assert "**200 per GPU-hour**" in md and "(cut at budget)" in md
    assert "**3.0x**" in md  # 300 decided per GPU-hour vs 100
    assert "| timing settled after one window / timeouts at a hang deadline | 0 / 0 |" in md
    assert "| runs confirmed in a fresh worker (failures after earlier jobs) | 0 |" in md
    two = summarize(dict(run, gpus=2, wall_s=20.0), labels, 4)
    assert two["ran_per_gpu_hour"] == 180  # 2 ran in 40 GPU-seconds
    report["multi"] = {"gpus": 2, "both": 3, "agree": 3, "differ": [], "speedup": 1.8,
                       "summary": two}
    md = markdown(report)
    assert "**1.80x**" in md and "| agreement, 1 vs 2 GPUs | 3/3 |" in md
    json.dumps(report)


def test_device_tag_and_kb_subset_leave_hangs_out() -> None:
    assert device_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert device_tag("NVIDIA H200") == "h200"
    cands = list(candidates((1,)))
    sub = kb_subset(cands, 10)
    assert len(sub) == 10 and all(c.label != "hanging" for c in sub)
    assert len({c.problem for c in sub}) >= 5  # spread over the corpus, not its head


def test_main_writes_partial_results_when_the_batch_decides_nothing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU node the batch runs for real")
    kb = tmp_path / "KernelBench"
    (kb / "level1").mkdir(parents=True)
    (kb / "level1" / "26_GELU_.py").write_text(GELU)
    out, res = tmp_path / "out", tmp_path / "results"
    from benchmarks.verify_kernelbench import main

    gelu_only = ["--kb-dir", str(kb), "--out", str(out), "--results-dir", str(res),
                 "--levels", "1", "--limit", "195", "--budget-s", "60", "--kb-limit", "0",
                 "--device-tag", "cpu", "--cores-per-gpu", "1"]
    with pytest.raises(SystemExit, match="19_ReLU.py"):  # the corpus needs every problem file
        main(gelu_only)
    for name in {c.problem for c in candidates((1,))} - {"level1/26_GELU_.py"}:
        (kb / name).write_text(GELU.replace("4096", "8"))
    assert main(gelu_only) == 0
    report = json.loads((out / "results.json").read_text())
    assert report["ours1"]["decided"] == 0 and "cuda" in report["ours1_stderr_tail"]
    assert report["ours1"]["cores"] == 1  # the batch held to one core per GPU
    md = (res / "verify_kernelbench_cpu.md").read_text()
    assert "| level1/26_GELU_.py | 6144 | 6144 |" in md and "0/156" in md
