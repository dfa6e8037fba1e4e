"""benchmarks.rows_audit: issue 18's Done-when checks over a published version.

The unit tests feed each check a row with one defect and the same row without it; the slow
test runs `kernelsynth build` on a few seed tasks (cpu backend) and audits the version it
publishes: every check that applies passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import benchmarks.pair_audit as pair_audit
import benchmarks.rows_audit as rows_audit
from benchmarks.audit_table import Audit
from benchmarks.kernel_audit import check_switches, unused_fields
from benchmarks.pair_audit import check_reviews
from benchmarks.rows_audit import main
from benchmarks.size_audit import size_problems
from pipeline.datasets import analysis_rows
from schemas import Candidate, Verdict

BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "builds"

REF = '''import torch
import torch.nn as nn

batch_size = 8
dim = 64


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        # x: [8, 64]
        return x * self.scale


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [0.5]
'''
FACTS = {"ok": True, "init": [0.5], "inputs": [[8, 64]], "outputs": [[8, 64]], "dims": [8, 64]}


def _user(ref: str, init: str = "scale=0.5", shape: str = "8, 64") -> str:
    return (f"Reference:\n```python\n{ref}```\n- `x`: tensor float32 of shape ({shape})\n"
            f"Constructor arguments (from `get_init_inputs()`): {init}\n")


def test_size_problems_name_each_disagreeing_size() -> None:
    assert size_problems(_user(REF), "Plan: one pass over [8, 64].", FACTS) == []
    bad = size_problems(_user(REF.replace("# x: [8, 64]", "# x: [16, 256]"), "scale=0.7",
                              "32, 64"), "Plan: one pass over [8, 128].", FACTS)
    assert any("comment shape [16, 256]" in b for b in bad)
    assert any("constructor arguments scale=0.7" in b for b in bad)
    assert any("stated input shapes [[32, 64]]" in b for b in bad)
    assert any("reasoning shape [8, 128]" in b for b in bad)


def _candidate(body: str) -> str:
    return ('import torch\nfrom torch.utils.cpp_extension import load_inline\n'
            f'K = r"""\n{body}\n"""\n'
            '_ext = load_inline(name="k", cpp_sources=[K], functions=["f"])\n')


def test_switches_and_unused_macros_fail_clean_kernels_pass() -> None:
    audit = Audit()
    clean = "#include <torch/extension.h>\nvoid f(torch::Tensor x) { (void)x; }"
    dead = ("#include <torch/extension.h>\n#define HD inline\n#if 0\nint g() { return 1; }\n"
            "#endif\nvoid f(torch::Tensor x) { (void)x; }")
    check_switches(audit, [("clean", _candidate(clean)), ("dead", _candidate(dead))])
    assert audit.counts["no_switches"] == {"pass": 1, "fail": 1}
    assert "#if 0" in audit.examples["no_switches"][0]
    assert "unused macro HD" in audit.examples["no_switches"][0]
    assert audit.failed() and "| no_switches | 1 | 1 | 0 |" in audit.table()


def test_review_fixes_are_found_as_the_row_builder_finds_them() -> None:
    """The audit asks `analysis_rows.fix_source` (one definition) which program a mutant was
    made from: its parent, the candidate its metadata names, or the fix code it carries."""
    assert pair_audit.fix_source is analysis_rows.fix_source
    assert not hasattr(pair_audit, "_fix_of")
    good = "def f(x):\n    y = x + 1\n    return y\n"
    bad = good.replace("x + 1", "x - 1")
    fix = Candidate("fix", "t", "cpu", "template:a/b", good)
    named = Candidate("m1", "t", "cpu", "mutate:sign", bad,
                      meta=json.dumps({"fix_candidate_id": "fix"}))
    carried = Candidate("m2", "t", "cpu", "mutate:sign", bad, meta=json.dumps({"fix_code": good}))
    orphan = Candidate("m3", "t", "cpu", "mutate:sign", bad)
    by_id = {c.candidate_id: c for c in (fix, named, carried, orphan)}
    assert analysis_rows.fix_source(named, by_id) == good
    assert analysis_rows.fix_source(carried, by_id) == good
    assert analysis_rows.fix_source(orphan, by_id) is None
    verdicts = {c: Verdict(c, "t", s, "done", "cpu")
                for c, s in (("fix", "correct_slow"), ("m1", "incorrect"), ("m2", "incorrect"),
                             ("m3", "incorrect"))}
    audit = Audit()
    rows = {"review": [{"row_id": f"row{c}", "candidate_id": c, "bug_line": 2, "bug_kind": "sign"}
                       for c in ("m1", "m2", "m3")]}
    check_reviews(audit, rows, list(by_id.values()), verdicts)
    assert audit.counts["review_fix_verified"] == {"pass": 2, "fail": 1}


def test_struct_fields_no_code_reads_fail() -> None:
    audit = Audit()
    used = ("struct Geom {\n    int64_t D, H, W;\n    bool pad;\n};\n"
            "float f(const Geom& g) { return g.pad ? g.D * g.H * g.W : 0; }")
    # the max-pool geometry of old: the divisor fields travel along but no code reads them
    unread = ("struct Geom {\n    int64_t D, H, divisor;\n    bool include_pad;\n};\n"
              "float f(const Geom& g) { return g.D * g.H; }")
    assert unused_fields(used) == []
    assert unused_fields(unread) == ["unused field Geom.divisor", "unused field Geom.include_pad"]
    check_switches(audit, [("used", _candidate(used)), ("unread", _candidate(unread))])
    assert audit.counts["no_switches"] == {"pass": 1, "fail": 1}
    assert "unused field Geom.divisor" in audit.examples["no_switches"][0]


@pytest.mark.slow
def test_audit_of_a_small_default_build_passes_every_check(tmp_path: Path) -> None:
    cfg = tmp_path / "ks.yaml"
    cfg.write_text(yaml.safe_dump({
        "sources": {"seed_sample": 4, "transformers_sample": 0, "nnsmith": {"count": 0}},
        "generate": {"backend": "cpu", "variants_per_task": 2},
        "verify": {"backend": "cpu", "trials": 2, "perf_trials": 3, "perf_warmup": 1,
                   "build_cache_dir": str(BUILD_CACHE)},
        "repair": {"turns": 1},
    }))
    ws = tmp_path / "ws"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.run([str(Path(sys.executable).parent / "kernelsynth"), "build",
                           "--workspace", str(ws), "--config", str(cfg), "--json"],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["published"]
    out = tmp_path / "audit.md"
    code = main(["--workspace", str(ws), "--out", str(out)])
    table = out.read_text(encoding="utf-8")
    rows = {ln.split("|")[1].strip(): [int(x) for x in ln.split("|")[2:5]]
            for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln
            and not ln.startswith("| check")}
    for check in ("generalised", "no_switches", "builds_clean", "sizes_agree", "init_named",
                  "backend_named", "answer_format"):
        assert check in rows and rows[check][0] > 0, (check, table)
    assert code == 0 and all(r[1] == 0 for r in rows.values()), table


def test_review_kind_spread_is_checked_and_noted() -> None:
    def rows(kinds: list[str]) -> dict:
        return {"review": [{"row_id": f"r{i}", "candidate_id": f"c{i}", "bug_kind": k,
                            "bug_line": 1} for i, k in enumerate(kinds)]}

    skewed, even, few = Audit(), Audit(), Audit()
    check_reviews(skewed, rows(["wrong_cast"] * 4 + ["off_by_one", "wrong_init"]), [], {})
    spread = ["wrong_cast", "off_by_one", "wrong_init", "grid_rounding", "wrong_stride",
              "unstable_softmax", "wrong_init", "grid_rounding", "wrong_stride",
              "broadcast_stride"]
    check_reviews(even, rows(spread), [], {})
    check_reviews(few, rows(["wrong_cast", "off_by_one", "wrong_init"]), [], {})
    assert skewed.counts["review_kinds_spread"] == {"fail": 1}
    assert even.counts["review_kinds_spread"] == {"pass": 1}
    assert few.counts["review_kinds_spread"] == {"pass": 1}  # 3 rows cannot spread
    # four kinds at 25% each, but casts and bounds together at 50%
    shallow = Audit()
    check_reviews(shallow, rows(["wrong_cast", "off_by_one", "wrong_init", "wrong_stride"] * 2),
                  [], {})
    assert shallow.counts["review_kinds_spread"] == {"fail": 1}
    assert ("review bug kinds (6 rows, 3 kinds): wrong_cast 4, off_by_one 1, wrong_init 1"
            in skewed.table())


def test_repair_kinds_come_from_the_mutant_each_chain_starts_from() -> None:
    kinds = ["wrong_cast", "wrong_cast", "off_by_one", "wrong_init"]
    muts = [Candidate(f"m{i}", "t", "cpu", f"mutate:{k}", f"x = {i}\n")
            for i, k in enumerate(kinds)]
    attempt = Candidate("a", "t", "cpu", "template:a/b", "x = 'first try'\n")
    rows = {"repair": [{"row_id": f"r{c.candidate_id}", "task_id": "t", "messages": [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": f"Here:\n```python\n{c.code}```"},
        {"role": "user", "content": "feedback"},
        {"role": "assistant", "content": "```python\nx = 'fixed'\n```"}]}
        for c in [*muts, attempt]]}
    audit = Audit()
    check_reviews(audit, rows, [*muts, attempt], {})
    assert "repair bug kinds (4 of 5 rows, 3 kinds): wrong_cast 2, off_by_one 1, wrong_init 1" \
        in audit.table()
    assert audit.counts["repair_kinds_spread"] == {"fail": 1}  # wrong_cast holds 50%


def test_a_cpu_rows_system_prompt_that_says_gpu_fails_backend_named(tmp_path: Path) -> None:
    """Review rows once told a GPU reviewer to review C++ loops checked on the CPU."""
    (tmp_path / "README.md").write_text("---\ntags: []\n---\nKernels in this version: cpu\n")

    def row(i: int, backend: str, system: str) -> dict:
        return {"row_id": f"r{i:012d}", "backend": backend,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": "GPU words in a user turn are fine"}]}

    wrong, right = Audit(), Audit()
    gpu = "You are an expert GPU kernel reviewer. Find the bug."
    rows_audit.check_backend(wrong, tmp_path, {"review": [row(1, "cpu", gpu)]})
    rows_audit.check_backend(right, tmp_path, {"review": [
        row(1, "cpu", analysis_rows.review_system("cpu")),
        row(2, "cuda", analysis_rows.review_system("cuda"))]})
    assert any("system prompt says GPU" in e for e in wrong.examples["backend_named"])
    assert not any("system prompt" in e for e in right.examples.get("backend_named", []))
    assert "CUDA (GPU)" in analysis_rows.review_system("cuda")
    assert "GPU" not in analysis_rows.review_system("cpu")


def test_a_pair_side_timed_twice_is_audited_with_the_timing_its_row_records() -> None:
    """One program verified twice at the reward cap (1.0): the audit takes the verdict whose
    runtime the row records, not whichever comes first (a CPU build's pair failed pair_margin
    against the other timing of its chosen side)."""
    from tests.pipeline.ks_synthetic import candidate, kernel_code, make_task, verdict

    task = make_task(0)
    code = kernel_code("plain")
    first = candidate(task, "template:elementwise/cpu-simd", code)
    again = candidate(task, "repair:fix", code + "\n", parent=first, turn=1)
    verdicts = {first.candidate_id: verdict(first, "correct_fast", 4.0, 1.0),
                again.candidate_id: verdict(again, "correct_fast", 5.0, 1.0)}
    by_code = {}
    for c in (first, again):
        by_code.setdefault((c.task_id, pair_audit.normalise_code(c.code)), []).append(c)
    for speed in (4.0, 5.0):
        got = pair_audit._side_verdict(code, task.task_id, 1.0, by_code, verdicts, 40.0 / speed)
        assert got is not None and got.speedup == speed
