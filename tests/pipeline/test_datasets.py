"""Dataset builders: schemas, TRL formats, splits by dedup cluster, every config's content."""

from __future__ import annotations

import json

import pytest

from pipeline.config import Config
from pipeline.datasets.rows import CONFIGS, assign_splits, build_datasets, config_schema
from pipeline.datasets.selection import select_diverse
from tests.pipeline.ks_synthetic import make_task, pool
from verifier.protocol import CORRECT_STATUSES


@pytest.fixture(scope="module")
def built() -> tuple:
    tasks, cands, verdicts = pool(n_tasks=6)
    selected = select_diverse(cands, verdicts, 3, 0.5)
    cfg = Config()
    return tasks, cands, verdicts, selected, build_datasets(tasks, cands, verdicts, selected, cfg)


def _rows(built: tuple, config: str) -> list[dict]:
    return built[4][config].to_pylist()


def test_every_config_has_its_explicit_schema(built: tuple) -> None:
    tables = built[4]
    assert list(tables) == list(CONFIGS)
    for name, table in tables.items():
        assert table.schema.equals(config_schema(name)), name
        assert table.num_rows > 0, name
        ids = table.column("row_id" if name != "tasks" else "task_id").to_pylist()
        assert ids == sorted(ids) and len(set(ids)) == len(ids), name


def test_split_follows_dedup_cluster_and_no_cluster_crosses(built: tuple) -> None:
    tasks = built[0]
    cluster = {t.task_id: t.dedup_cluster for t in tasks}
    for name, table in built[4].items():
        sides: dict[str, set[str]] = {}
        for row in table.select(["task_id", "split"]).to_pylist():
            sides.setdefault(cluster[row["task_id"]], set()).add(row["split"])
        assert all(len(s) == 1 for s in sides.values()), name
    splits = {r["split"] for r in _rows(built, "tasks")}
    assert splits == {"train", "validation"}


def test_split_assignment_is_stable_when_tasks_are_added() -> None:
    first = assign_splits([make_task(i) for i in range(30)], 0.2)
    more = assign_splits([make_task(i) for i in range(60)], 0.2)
    assert all(more[t] == s for t, s in first.items())
    assert 0 < sum(s == "validation" for s in more.values()) < 60
    # Two clusters and a tiny fraction still give a validation split.
    two = assign_splits([make_task(0), make_task(1)], 0.01)
    assert sorted(two.values()) == ["train", "validation"]


def test_sft_and_rft_rows_are_trl_conversations(built: tuple) -> None:
    gen = {c.candidate_id: c.generator for c in built[1]}
    sft, rft = _rows(built, "sft"), _rows(built, "rft")
    assert all(gen[r["candidate_id"]].startswith("template:") for r in sft)
    assert all(gen[r["candidate_id"]].startswith("llm:") for r in rft)
    for row in sft + rft:
        roles = [m["role"] for m in row["messages"]]
        assert roles[-1] == "assistant" and "user" in roles
        assert "class ModelNew" in row["messages"][-1]["content"]
    assert any("Plan for the cuda backend" in r["messages"][-1]["content"] for r in sft)
    selected = set(built[3])
    assert {r["candidate_id"] for r in sft} <= selected
    # rft is selected among sampled responses only, so teacher kernels cannot crowd them out
    sampled = [c for c in built[1] if c.generator.startswith("llm:")]
    assert {r["candidate_id"] for r in rft} == set(select_diverse(sampled, built[2], 4, 0.5))


def test_rft_group_statistics_match_the_sample_group(built: tuple) -> None:
    _, cands, verdicts, _, _ = built
    vmap = {v.candidate_id: v for v in verdicts}
    row = _rows(built, "rft")[0]
    group = [vmap[c.candidate_id] for c in cands
             if c.task_id == row["task_id"] and c.generator.startswith("llm:")]
    passed = sum(v.status in CORRECT_STATUSES for v in group)
    assert row["group_size"] == len(group)
    assert row["group_pass_rate"] == pytest.approx(passed / len(group))
    assert row["group_mean_reward"] == pytest.approx(sum(v.reward for v in group) / len(group))


def test_rl_has_prompt_rows_and_repair_prompts_for_all_failed_groups(built: tuple) -> None:
    rl = _rows(built, "rl")
    tasks = built[0]
    plain = [r for r in rl if r["kind"] == "task"]
    assert sorted(r["task_id"] for r in plain) == sorted(t.task_id for t in tasks)
    assert all(r["prompt"][-1]["role"] == "user" and "Model" in r["reference"] for r in plain)
    repair = [r for r in rl if r["kind"] == "repair"]
    failed_task = tasks[-1].task_id  # the pool's all-failed LLM group
    assert repair and {r["task_id"] for r in repair} == {failed_task}
    assert all(r["feedback"] and r["prompt"][-1]["role"] == "user" for r in repair)
    assert [s["shape"] for s in plain[0]["input_specs"]]


def test_repair_rows_are_attempt_feedback_fix_chains(built: tuple) -> None:
    rows = _rows(built, "repair")
    assert rows
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles[:2] == ["system", "user"]
        assert roles[2:] == ["assistant", "user"] * (len(roles[2:]) // 2) + ["assistant"]
        assert len(row["turn_rewards"]) == len(row["turn_statuses"]) == roles.count("assistant")
        assert row["final_status"] in CORRECT_STATUSES
        assert row["turn_statuses"][0] not in CORRECT_STATUSES
        assert "status" in row["messages"][-2]["content"]  # the verifier's feedback turn


def test_preference_pairs_correct_fast_over_incorrect_or_slow(built: tuple) -> None:
    vmap = {v.candidate_id: v for v in built[2]}
    rows = _rows(built, "preference")
    assert rows
    for row in rows:
        assert row["chosen_status"] in CORRECT_STATUSES
        assert row["chosen_reward"] > row["rejected_reward"]
        assert [m["role"] for m in row["chosen"]] == ["assistant"]
        assert [m["role"] for m in row["rejected"]] == ["assistant"]
        assert row["prompt"][-1]["role"] == "user"
    assert any(r["rejected_status"] not in CORRECT_STATUSES for r in rows)
    # A correct rejected kernel is there only because it is clearly slower than the chosen one.
    for row in rows:
        if row["rejected_status"] in CORRECT_STATUSES:
            assert row["chosen_reward"] > row["rejected_reward"]
    assert {r["chosen_status"] for r in rows} <= {v.status for v in vmap.values()}


def test_review_rows_name_bug_line_and_fix(built: tuple) -> None:
    cands = {c.candidate_id: c for c in built[1]}
    rows = _rows(built, "review")
    assert len(rows) == 5  # one mutation per task with a correct kernel
    for row in rows:
        code = cands[row["candidate_id"]].code.splitlines()
        assert "i <= n" in code[row["bug_line"] - 1]
        answer = row["messages"][-1]["content"]
        assert f"line {row['bug_line']}" in answer
        assert "if (i < n)" in answer.split("Fix:")[1]
        assert row["observed_status"] == "runtime_error"
        assert f"{row['bug_line']:4d} | " in row["messages"][1]["content"]


def test_review_skips_mutations_that_still_verify_correct() -> None:
    tasks, cands, verdicts = pool(n_tasks=2)
    for v in verdicts:
        if v.candidate_id in {c.candidate_id for c in cands if c.generator.startswith("mutate")}:
            v.status = "correct_slow"
    tables = build_datasets(tasks, cands, verdicts, [], Config())
    assert tables["review"].num_rows == 0
    assert tables["sft"].num_rows == 0 and tables["perf_analysis"].num_rows == 0


def test_perf_analysis_explains_the_bottleneck(built: tuple) -> None:
    rows = _rows(built, "perf_analysis")
    assert rows and {r["bottleneck"] for r in rows} <= {"memory", "compute", "launch", "unknown"}
    for row in rows:
        assert row["arithmetic_intensity"] == pytest.approx(0.25)
        text = row["messages"][-1]["content"]
        assert "Next optimization:" in text and f"{row['runtime_us']:.2f} us" in text
    # Tiny elementwise tasks on an H100 are launch-bound, and a two-kernel answer is told to fuse.
    assert {r["bottleneck"] for r in rows} == {"launch"}
    two = [r for r in rows if "_b<<<" in r["messages"][1]["content"]]
    assert two and all("fuse the 2 kernels" in r["messages"][-1]["content"] for r in two)


def test_manifest_meta_of_real_mutator_is_understood() -> None:
    tasks, cands, verdicts = pool(n_tasks=2)
    mut = next(c for c in cands if c.generator.startswith("mutate:"))
    meta = json.loads(mut.meta)
    assert meta["mutation"] == "off_by_one" and "bug_line" in meta
    rows = build_datasets(tasks, cands, verdicts, [], Config())["review"].to_pylist()
    row = next(r for r in rows if r["candidate_id"] == mut.candidate_id)
    assert row["bug_kind"] == "off_by_one" and row["bug_line"] == meta["bug_line"]
