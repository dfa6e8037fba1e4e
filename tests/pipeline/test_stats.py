"""Statistics: pass@k estimator, funnel, slices, fast_p, speedups, compile-error taxonomy."""

from __future__ import annotations

import itertools
import json
from math import comb

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.datasets.stats import classify_compile_error, compute_stats, pass_at_k
from pipeline.workspace import Workspace
from tests.pipeline.ks_synthetic import (
    candidate,
    fill_workspace,
    kernel_code,
    make_task,
    pool,
    rejections,
    verdict,
)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (10, 3, 5), (4, 4, 2),
                                   (6, 1, 6)])
def test_pass_at_k_matches_enumeration(n: int, c: int, k: int) -> None:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_funnel_metrics_and_slices_on_a_hand_built_set() -> None:
    a, b = make_task(0, level=1), make_task(1, level=2)
    rows = []
    # Task a: 4 samples, 2 correct (speedups 2.0 and 1.05), 1 incorrect, 1 compile error.
    for j, (status, sp) in enumerate([("correct_fast", 2.0), ("correct_slow", 1.05),
                                      ("incorrect", None), ("compile_error", None)]):
        c = candidate(a, "llm:m", kernel_code("plain", name=f"a{j}"))
        rows.append((c, verdict(c, status, sp, error="error: expected a \";\"" if
                                status == "compile_error" else "")))
    # Task b: 2 samples, both wrong; one mutation (not a sample).
    for j in range(2):
        c = candidate(b, "llm:m", kernel_code("plain", name=f"b{j}"))
        rows.append((c, verdict(c, "runtime_error")))
    m = candidate(b, "mutate:off_by_one", kernel_code("plain", name="m"))
    rows.append((m, verdict(m, "correct_slow", 0.5)))
    cands, verdicts = [c for c, _ in rows], [v for _, v in rows]
    stats = compute_stats([a, b], cands, verdicts, sourced=10, rejections=rejections(), ks=(1, 2))
    assert stats["funnel"] == {"sourced": 10, "tasks": 3, "deduped": 2, "generated": 7,
                               "verified": 7, "compiled": 6, "correct": 3, "faster": 1,
                               "tasks_solved": 2}
    met = stats["metrics"]
    assert met["pass@1"] == pytest.approx((2 / 4 + 0) / 2)
    assert met["pass@2"] == pytest.approx(((1 - comb(2, 2) / comb(4, 2)) + 0) / 2)
    assert met["avg@1"] == pytest.approx(0.25)
    assert met["fast_1.0"] == pytest.approx((2 / 4 + 0) / 2)  # 2.0 and 1.05 beat 1.0
    assert met["fast_1.1"] == pytest.approx((1 / 4 + 0) / 2)
    assert met["faster_than_eager"] == pytest.approx(2 / 3) and met["faster_than_eager_n"] == 3
    assert stats["speedup"]["n"] == 3 and stats["speedup"]["p50"] == pytest.approx(1.05)
    assert stats["speedup"]["geomean"] == pytest.approx((2.0 * 1.05 * 0.5) ** (1 / 3))
    assert stats["by_level"]["level 1"] == {"verified": 4, "correct": 2, "pass_rate": 0.5,
                                            "faster": 1}
    assert stats["by_generator"]["mutate"]["verified"] == 1
    assert stats["by_generator"]["llm:m"]["verified"] == 6
    assert stats["compile_errors"] == {"syntax_error": 1}
    assert stats["rejections"] == {"extract:no_forward": 1, "curate:near_duplicate": 1}
    json.dumps(stats)  # JSON-ready


@pytest.mark.parametrize("log,cls", [
    ("kernel.cu(12): error: identifier \"tile\" is undefined", "undeclared_identifier"),
    ("error: 'foo' was not declared in this scope", "undeclared_identifier"),
    ("error: no matching function for call to 'max(float, double)'", "overload_mismatch"),
    ("undefined symbol: _Z3runN2at6TensorE", "link_error"),
    ("error: expected ';' before '}' token", "syntax_error"),
    ("error: cannot convert 'float*' to 'int*'", "type_error"),
    ("compilation timed out after 600 s", "timeout"),
    ("ptxas error   : Entry function uses too much shared data", "resource_limit"),
    ("error: 'struct float4' has no member named 'q'", "missing_member"),
    ("something odd happened", "other"),
])
def test_compile_error_taxonomy(log: str, cls: str) -> None:
    assert classify_compile_error(log) == cls


def test_synthetic_pool_slices_by_level_family_source() -> None:
    tasks, cands, verdicts = pool(n_tasks=6)
    stats = compute_stats(tasks, cands, verdicts)
    assert set(stats["by_level"]) == {"level 1", "level 2", "level 3"}
    assert set(stats["by_op_family"]) == {"activation", "elementwise"}
    assert set(stats["by_source"]) == {"seed", "nnsmith", "git"}
    assert sum(d["verified"] for d in stats["by_level"].values()) == len(verdicts)
    assert set(stats["by_generator"]) == {"template", "llm:qwen", "mutate", "repair"}
    assert sum(stats["compile_errors"].values()) == stats["statuses"]["compile_error"]


def test_cli_stats_for_workspace_and_version(workspace: Workspace) -> None:
    fill_workspace(workspace, n_tasks=3)
    runner = CliRunner()
    res = runner.invoke(app, ["stats", "-w", str(workspace.root), "--json"])
    assert res.exit_code == 0, res.output
    live = json.loads(res.stdout.strip().splitlines()[-1])
    assert live["funnel"]["deduped"] == 3 and live["funnel"]["sourced"] == 4
    assert runner.invoke(app, ["publish", "-w", str(workspace.root)]).exit_code == 0
    res = runner.invoke(app, ["stats", "--version", "v1", "-w", str(workspace.root), "--json"])
    stored = json.loads(res.stdout.strip().splitlines()[-1])
    assert stored["funnel"] == live["funnel"] and stored["selected"] > 0
    res = runner.invoke(app, ["stats", "-w", str(workspace.root)])
    assert res.exit_code == 0 and "funnel" in res.output and "pass@1" in res.output
    assert "compile-error taxonomy" in res.output


def test_does_not_fit_verdicts_are_left_out_of_the_rates() -> None:
    """A task whose run cannot fit the device (`does_not_fit`) says nothing of its candidates:
    the same set with such a verdict added has the same funnel and pass rates."""
    a = make_task(0, level=1)
    rows = []
    for j, status in enumerate(["correct_fast", "incorrect"]):
        c = candidate(a, "llm:m", kernel_code("plain", name=f"a{j}"))
        rows.append((c, verdict(c, status, 2.0 if status == "correct_fast" else None)))
    base = compute_stats([a], [c for c, _ in rows], [v for _, v in rows], ks=(1,))
    big = candidate(a, "llm:m", kernel_code("plain", name="big"))
    rows.append((big, verdict(big, "does_not_fit")))
    with_big = compute_stats([a], [c for c, _ in rows], [v for _, v in rows], ks=(1,))
    assert with_big["funnel"]["verified"] == base["funnel"]["verified"] == 2
    assert with_big["metrics"]["pass@1"] == base["metrics"]["pass@1"] == pytest.approx(0.5)


def test_template_variants_are_not_samples_of_a_model() -> None:
    """pass@k is a model's: the teacher's strategy variants of a task never enter it."""
    a = make_task(0, level=1)
    rows = []
    for j, status in enumerate(["correct_fast", "correct_fast", "correct_slow"]):
        c = candidate(a, "template:matmul", kernel_code("plain", name=f"t{j}"))
        rows.append((c, verdict(c, status, 2.0)))
    only_templates = compute_stats([a], [c for c, _ in rows], [v for _, v in rows], ks=(1,))
    assert "pass@1" not in only_templates["metrics"]
    for j, status in enumerate(["incorrect", "correct_fast"]):
        c = candidate(a, "llm:m", kernel_code("plain", name=f"s{j}"))
        rows.append((c, verdict(c, status, 1.5 if status == "correct_fast" else None)))
    stats = compute_stats([a], [c for c, _ in rows], [v for _, v in rows], ks=(1,))
    assert stats["metrics"]["pass@1"] == pytest.approx(0.5)  # the model's 1 of 2, not 4 of 5
