"""Diversity-preserving selection: features, token normalization, greedy choice, baselines."""

from __future__ import annotations

import random

import pytest

from pipeline.datasets.selection import (
    kernel_distance,
    kernel_features,
    normalized_tokens,
    select_diverse,
    select_random_k,
    select_top_k,
    selection_quality,
)
from schemas import Candidate
from tests.pipeline.ks_synthetic import candidate, kernel_code, make_task, pool, verdict
from verifier.protocol import CORRECT_STATUSES


def test_features_read_kernel_structure() -> None:
    plain = kernel_features(kernel_code("plain", threads=128))
    assert (plain.n_kernels, plain.threads_per_block) == (1, 128)
    assert not (plain.shared_memory or plain.vectorized or plain.warp_primitives)
    assert kernel_features(kernel_code("vec4")).vectorized
    shared = kernel_features(kernel_code("shared"))
    assert shared.shared_memory and shared.unrolled
    assert kernel_features(kernel_code("warp")).warp_primitives
    assert kernel_features(kernel_code("two")).n_kernels == 2
    wmma = kernel_features('src = """__global__ void k() { wmma::fragment<wmma::matrix_a> a; }"""')
    assert wmma.tensor_cores
    cpu = kernel_features('src = """#pragma omp parallel for\nfor (;;) {}"""\n'
                          'load_inline(name="k", cpp_sources=src, functions=["a", "b"])')
    assert cpu.multithreaded and cpu.n_kernels == 2


def test_tokens_ignore_names_constants_and_comments() -> None:
    a = kernel_code("plain", name="relu_scale", scale="2.0")
    b = kernel_code("plain", name="other_name", scale="7.0").replace(
        "int i =", "// a comment\n    int i =")
    assert normalized_tokens(a) == normalized_tokens(b)
    assert kernel_distance(a, b) == pytest.approx(0.0)
    assert kernel_distance(a, kernel_code("warp")) > 0.15


def _near_duplicate_pool() -> tuple[list[Candidate], list]:
    """One task: six renamed copies of the plain kernel (best reward) and three other styles."""
    task = make_task(0)
    cands, verdicts = [], []
    for j in range(6):
        c = candidate(task, "llm:m", kernel_code("plain", name=f"copy{j}", scale=f"{j + 2}.0"))
        cands.append(c)
        verdicts.append(verdict(c, "correct_fast", 2.0, 3.0 - 0.01 * j))
    for style in ("vec4", "warp", "two"):
        c = candidate(task, "llm:m", kernel_code(style))
        cands.append(c)
        verdicts.append(verdict(c, "correct_fast", 1.8, 2.8))
    return cands, verdicts


def test_diverse_prefers_new_strategies_over_renamed_copies() -> None:
    cands, verdicts = _near_duplicate_pool()
    styles = {c.candidate_id: kernel_features(c.code).strategy() for c in cands}
    top = select_top_k(cands, verdicts, 3)
    diverse = select_diverse(cands, verdicts, 3, 0.5)
    assert len({styles[c] for c in top}) == 1  # top-k keeps three copies of one kernel
    assert len({styles[c] for c in diverse}) == 3
    best = max(verdicts, key=lambda v: v.reward).candidate_id
    assert diverse[0] == best  # the best kernel always comes first
    q_top = selection_quality(cands, verdicts, top)
    q_div = selection_quality(cands, verdicts, diverse)
    assert q_div["mean_pairwise_distance"] > q_top["mean_pairwise_distance"] + 0.1


def test_weight_zero_is_top_k_and_result_ignores_input_order() -> None:
    tasks, cands, verdicts = pool(n_tasks=4)
    assert select_diverse(cands, verdicts, 3, 0.0) == select_top_k(cands, verdicts, 3)
    shuffled = list(cands)
    random.Random(1).shuffle(shuffled)
    assert select_diverse(shuffled, verdicts, 3, 0.6) == select_diverse(cands, verdicts, 3, 0.6)


def test_only_verified_correct_and_no_mutations_are_selected() -> None:
    _, cands, verdicts = pool(n_tasks=4)
    status = {v.candidate_id: v.status for v in verdicts}
    gen = {c.candidate_id: c.generator for c in cands}
    for select in (select_diverse, select_top_k, select_random_k):
        chosen = select(cands, verdicts, 50, 0.5, 3)
        assert chosen and all(status[c] in CORRECT_STATUSES for c in chosen)
        assert not any(gen[c].startswith("mutate:") for c in chosen)
    # A candidate without a verdict is never chosen.
    assert not set(select_diverse(cands, [], 4, 0.5))


def test_k_per_task_and_random_baseline_is_seeded() -> None:
    _, cands, verdicts = pool(n_tasks=4)
    task_of = {c.candidate_id: c.task_id for c in cands}
    chosen = select_diverse(cands, verdicts, 2, 0.5)
    per_task = {}
    for cid in chosen:
        per_task[task_of[cid]] = per_task.get(task_of[cid], 0) + 1
    assert set(per_task.values()) == {2} and len(per_task) == 4
    assert select_random_k(cands, verdicts, 2, seed=5) == select_random_k(cands, verdicts, 2,
                                                                           seed=5)
    assert select_random_k(cands, verdicts, 2, seed=5) != select_random_k(cands, verdicts, 2,
                                                                           seed=6)
    with pytest.raises(ValueError, match="k must be"):
        select_diverse(cands, verdicts, 0, 0.5)
    with pytest.raises(ValueError, match="weight"):
        select_diverse(cands, verdicts, 2, 1.5)
