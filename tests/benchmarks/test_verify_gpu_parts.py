"""The parts of benchmarks/verify_gpu.py that need no GPU: its corpus, the KB-style subset and
the report lines (the GPU run itself is the lead's: see the module's docstring)."""

from __future__ import annotations

import collections

from benchmarks.kernel_corpus import as_expected, corpus
from benchmarks.verify_gpu import kb_lines, kb_subset, ours_lines, same_verdicts
from verifier.checks.extspec import specs_from_source

LABELS = {"correct", "incorrect", "compile_error", "runtime_error", "timeout", "cheat",
          "static_reject"}


def test_corpus_is_large_varied_and_unique() -> None:
    ks = corpus()
    assert len(ks) >= 150
    assert len({k.candidate_id for k in ks}) == len(ks)
    gen = [k.source for k in ks if k.origin != "conformance"]
    assert len(set(gen)) == len(gen)  # no two share a build (the conformance corpus runs one
    assert len({(k.task_id, k.source) for k in ks}) == len(ks)  # fp16 kernel on two tasks)
    assert {k.expected for k in ks} <= LABELS
    origins = collections.Counter(k.origin for k in ks)
    assert origins["conformance"] >= 48 and origins["generated"] >= 60
    labels = collections.Counter(k.expected for k in ks)
    assert labels["correct"] > len(ks) / 2 and labels["compile_error"] >= 5
    assert labels["incorrect"] >= 10 and labels["cheat"] >= 5 and labels["runtime_error"] >= 2
    assert len({k.task_id for k in ks}) >= 30


def test_generated_kernels_use_the_kernelbench_idiom() -> None:
    gen = [k for k in corpus() if k.origin == "generated"]
    for k in gen:
        assert 'extra_cflags=[""]' in k.source and "verbose=True" in k.source
        specs = specs_from_source(k.source)  # literal arguments: no collect run needed
        assert specs and specs[0].cuda_sources and specs[0].functions, k.candidate_id
        assert "def get_inputs" in k.task_source and "class Model" in k.task_source


def test_kb_subset_keeps_the_mix_and_drops_hangs() -> None:
    ks = corpus()
    sub = kb_subset(ks, 16)
    assert len(sub) == 16 and len({k.candidate_id for k in sub}) == 16
    assert all(k.expected != "timeout" for k in sub)
    assert len({k.origin for k in sub}) == 3
    assert len(kb_subset(ks, -1)) == sum(k.expected != "timeout" for k in ks)


def _run(ks: list, status: dict, wall: float, gpus: int = 1) -> dict:
    return {"label": "ours cold, 1 GPU", "gpus": gpus, "wall_s": wall, "n": len(ks),
            "ran": sum(s != "compile_error" for s in status.values()), "status": status,
            "error": {c: "" for c in status}, "nvsmi_util_mean": 40.0,
            "timings": {c: {"compile_s": 2.0, "exec_s": 0.3} for c in status},
            "stats": {"wall_s": wall, "phases": {"compile": {
                "n": 3, "sum_s": 90.0, "covered_s": 30.0, "first_s": 0.0, "last_s": 30.0}},
                "lanes": {"cuda:0": {"busy_s": 20.0, "busy_frac": 0.33,
                                     "idle_while_compiling_s": 12.0, "jobs": 10}},
                "counters": {"baselines_prefetched": 4}}}


def test_report_lines_count_throughput_labels_and_agreement() -> None:
    ks = corpus()[:10]
    status = {k.candidate_id: ("correct_slow" if k.expected == "correct" else
                               "static_reject" if k.expected == "cheat" else k.expected)
              for k in ks}
    run = _run(ks, status, 60.0)
    lines = "\n".join(ours_lines(run, ks))
    ran = run["ran"]
    assert f"{ran / 60 * 3600:.0f} compiled-and-run per GPU-hour" in lines
    assert f"verdicts as labelled: {len(ks)}/{len(ks)}" in lines
    assert "idle while candidates compiled 12.0s" in lines
    assert all(as_expected(status[k.candidate_id], k.expected) for k in ks)
    kb = {k.candidate_id: {"verdict": "correct" if k.expected == "correct" else k.expected}
          for k in ks}
    first = ks[0].candidate_id
    kb[first]["verdict"] = "runtime_error" if kb[first]["verdict"] != "runtime_error" else "x"
    text = "\n".join(kb_lines(ks, kb, {}, (30.0, 90.0), run, None))
    compared = sum(k.expected not in ("cheat", "static_reject") for k in ks)
    assert f"verdict agreement with KB-style (non-cheat labels): {compared - 1}/{compared}" in text
    assert f"{(10 / 60) / (10 / 120):.1f}x" in text and f"differs: {first}" in text
    other = _run(ks, dict(status, **{first: "incorrect"}), 30.0, gpus=2)
    assert same_verdicts(run, other) == (len(ks) - 1, [first])
