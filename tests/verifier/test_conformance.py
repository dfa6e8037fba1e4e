"""Conformance corpus (tests/verifier/conformance): candidates in the forms real models write.

CPU cases run through one verify_batch per fallback policy (builds shared through the cache);
every verdict must be the manifest's. CUDA cases are compiled with nvcc (--compile-only, slow)
and run on a GPU by benchmarks/conformance_gpu.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.protocol import VerifyOptions, VerifyRequest

sys.path.insert(0, str(Path(__file__).parent / "conformance"))
import corpus  # noqa: E402

BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "conformance-builds"


def _options(tmp: Path, policy: str, **kw: object) -> VerifyOptions:
    return VerifyOptions(backend="cpu", workers=2, compile_workers=2, compile_batch=40,
                         run_timeout_s=30.0, trials=3, perf_trials=5, perf_warmup=1,
                         perf_budget_s=0.5, build_cache_dir=str(BUILD_CACHE),
                         baseline_cache_dir=str(tmp / "baselines"), fallback=policy, **kw)


def test_manifest_is_complete() -> None:
    rows = corpus.load()
    assert len(rows) >= 120
    for r in rows:
        assert r["why"] and r["strict"] and r["partial"] and r["code"], r["name"]
        assert r["strict"] in (*corpus.CORRECT, "correct", "static_reject", "compile_error",
                               "runtime_error", "incorrect", "cheat", "timeout"), r["name"]
    kb = {r["name"]: r for r in rows}
    for name in ("cpu_kb_idiom", "cuda_kb_idiom"):  # KernelBench's empty-flag idiom
        assert 'extra_cflags=[""]' in kb[name]["code"] and 'extra_ldflags=[""]' in kb[name][
            "code"]
        assert kb[name]["strict"] == kb[name]["partial"] == "correct"


@pytest.fixture(scope="module")
def cpu_verdicts(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], dict]:
    tmp = tmp_path_factory.mktemp("conf")
    rows = corpus.load("cpu")
    out = {}
    for policy in corpus.POLICIES:
        reqs = [VerifyRequest(r["name"], r["task"], r["task_source"], r["code"], "cpu")
                for r in rows]
        out[policy] = {v.candidate_id: v.to_dict() for v in
                       verify_batch(reqs, _options(tmp, policy))}
    return rows, out


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_cpu_cases_get_their_expected_verdicts(cpu_verdicts: tuple[list[dict], dict]) -> None:
    rows, verdicts = cpu_verdicts
    report = corpus.table(rows, verdicts)
    bad = [r["name"] for p in corpus.POLICIES for r in rows
           if not corpus.matches(r[p], verdicts[p][r["name"]]["status"])]
    assert not bad, report


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_no_flag_or_view_op_is_a_finding(cpu_verdicts: tuple[list[dict], dict]) -> None:
    rows, verdicts = cpu_verdicts
    for r in rows:
        if r["strict"] != "correct":
            continue
        for f in verdicts["strict"][r["name"]]["findings"]:
            assert f["severity"] != "error", (r["name"], f)


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_fallback_feedback_names_op_line_and_fix(cpu_verdicts: tuple[list[dict], dict]) -> None:
    _, verdicts = cpu_verdicts
    v = verdicts["strict"]["cpu_hidden_partial"]
    assert v["status"] == "cheat"
    f = next(f for f in v["findings"] if f["rule"] == "aten_fallback")
    assert "aten.abs" in f["message"] and f["line"] and "own kernel" in f["message"]
    assert "aten.abs" in v["feedback"]
    partial = verdicts["partial"]["cpu_hidden_partial"]
    assert '"fallback": "partial"' in partial["reward_components"]
    assert '"own_calls": ' in partial["reward_components"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_cases_compile_as_expected(tmp_path: Path) -> None:
    from verifier.backends.cuda import cuda_home

    # ATen/cuda/CUDAContext.h includes the toolkit's cuSPARSE/cuBLAS headers (torch too)
    has_libs = (Path(cuda_home() or "/nonexistent") / "include" / "cusparse.h").is_file()
    rows = [r for r in corpus.load("cuda")
            if has_libs or "ATen/cuda/CUDAContext.h" not in r["code"]]
    out = {}
    for policy in corpus.POLICIES:
        reqs = [VerifyRequest(r["name"], r["task"], r["task_source"], r["code"], "cuda")
                for r in rows]
        opts = _options(tmp_path, policy)
        opts.backend, opts.compile_only = "cuda", True
        out[policy] = {v.candidate_id: v.to_dict() for v in verify_batch(reqs, opts)}
    bad = [r["name"] for p in corpus.POLICIES for r in rows
           if not corpus.matches(r[p], out[p][r["name"]]["status"], compile_only=True)]
    assert not bad, corpus.table(rows, out, compile_only=True)
