"""Dataset builders: schemas, TRL formats, splits by dedup cluster, every config's content."""

from __future__ import annotations

import json

import pytest

from pipeline.config import Config
from pipeline.datasets.pairs import (
    MAX_SIMILARITY,
    MAX_SPEED_SIMILARITY,
    code_similarity,
    fix_label,
    has_margin,
    mutant_configs,
    normalise_code,
    pair_similarity_limit,
    programs_not_held,
    unstable_timings,
)
from pipeline.datasets.rows import CONFIGS, assign_splits, build_datasets
from pipeline.datasets.selection import meets_speedup, select_diverse
from pipeline.datasets.tables import config_schema
from pipeline.prompts import (
    CODE_ONLY_RULE,
    REASONING_RULE,
    answer_format_problems,
    feedback_turn,
)
from schemas import Candidate, Message, Verdict
from tests.pipeline.ks_synthetic import candidate, kernel_code, make_task, pool, verdict
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
    # rft is selected among sampled responses only, so teacher kernels cannot crowd them out,
    # and only among those at least select.min_speedup (1.0) faster than eager
    sampled = [c for c in built[1] if c.generator.startswith("llm:")]
    fast = [v for v in built[2] if meets_speedup(v, 1.0)]
    assert {r["candidate_id"] for r in rft} == set(select_diverse(sampled, fast, 4, 0.5))


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
    owner = mutant_configs(built[1])
    # every failing mutant whose kind this task gives to review, and no other
    assert {r["candidate_id"] for r in rows} == {cid for cid, cfg in owner.items()
                                                 if cfg == "review"}
    assert rows
    for row in rows:
        code = cands[row["candidate_id"]].code.splitlines()
        assert "i <= n" in code[row["bug_line"] - 1]
        answer = row["messages"][-1]["content"]
        assert f"line {row['bug_line']}" in answer
        assert "if (i < n)" in answer.split("Replace line")[1]
        assert row["observed_status"] == "runtime_error"
        assert f"{row['bug_line']:4d} | " in row["messages"][1]["content"]


def test_review_skips_mutations_that_still_verify_correct() -> None:
    tasks, cands, verdicts = pool(n_tasks=2)
    for v in verdicts:
        if v.candidate_id in {c.candidate_id for c in cands if c.generator.startswith("mutate")}:
            v.status = "correct_slow"
    tables = build_datasets(tasks, cands, verdicts, [], Config())
    assert tables["review"].num_rows == 0
    assert tables["perf_analysis"].num_rows == 0
    gen = {c.candidate_id: c.generator for c in cands}
    sft = tables["sft"].to_pylist()
    assert sft and all(gen[r["candidate_id"]].startswith("template:") for r in sft)


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
    tasks, cands, verdicts = pool(n_tasks=6)
    owner = mutant_configs(cands)
    mut = next(c for c in cands if owner.get(c.candidate_id) == "review"
               and "bug_line" in json.loads(c.meta))
    meta = json.loads(mut.meta)
    assert meta["mutation"] == "off_by_one" and "bug_line" in meta
    rows = build_datasets(tasks, cands, verdicts, [], Config())["review"].to_pylist()
    row = next(r for r in rows if r["candidate_id"] == mut.candidate_id)
    assert row["bug_kind"] == "off_by_one" and row["bug_line"] == meta["bug_line"]


# --- preference pairs and review labels that teach (issue 18 part 5) --------------------------


def _pair_pool(fast: float, slow: float, slow_device: str = "NVIDIA H100 80GB HBM3",
               slow_code: str | None = None) -> tuple[list, list, list]:
    """One task, a fast and a slow correct kernel with the given speedups, nothing else."""
    task = make_task(0)
    a = candidate(task, "llm:qwen", kernel_code("vec4", name="fastk"),
                  response="I vectorise with float4.\n```python\nx\n```")
    b = candidate(task, "template:elementwise/plain",
                  slow_code or kernel_code("two", name="slowk", threads=128))
    return [task], [a, b], [verdict(a, "correct_fast", fast, 1.0 + fast),
                            verdict(b, "correct_slow", slow, 1.0 + slow, device=slow_device)]


def _prefs(tasks: list, cands: list, verdicts: list) -> list[dict]:
    return build_datasets(tasks, cands, verdicts, [], Config())["preference"].to_pylist()


def test_preference_speed_pairs_need_1_2x_on_the_same_device() -> None:
    assert len(_prefs(*_pair_pool(1.3, 1.0))) == 1
    assert _prefs(*_pair_pool(1.15, 1.0)) == []  # 1.15x is no margin
    assert _prefs(*_pair_pool(1.3, 1.0, slow_device="NVIDIA A100")) == []  # not comparable
    row = _prefs(*_pair_pool(2.0, 1.0))[0]
    assert row["chosen_status"] == "correct_fast" and row["rejected_status"] == "correct_slow"


def test_preference_sides_are_the_same_bare_format() -> None:
    rows = _prefs(*_pair_pool(2.0, 1.0))
    for row in rows:
        for side in (row["chosen"], row["rejected"]):
            assert len(side) == 1 and side[0]["role"] == "assistant"
            text = side[0]["content"]
            # one fenced file and nothing else: no prose on either side
            assert text.startswith("```python\n") and text.endswith("\n```")
            assert text.count("```") == 2 and "vectorise" not in text


def test_preference_never_pairs_identical_or_near_identical_code() -> None:
    code = kernel_code("vec4", name="fastk")
    # the same program with a comment and different spacing: identical once normalised
    same = code.replace("int i =", "// index\n    int   i =")
    assert code_similarity(code, same) == 1.0
    assert _prefs(*_pair_pool(3.0, 1.0, slow_code=same)) == []
    near = code.replace("0.f) * 2.0f;\n        v.y", "0.f) * 2.5f;\n        v.y")
    assert MAX_SPEED_SIMILARITY < code_similarity(code, near) < 1.0
    assert _prefs(*_pair_pool(3.0, 1.0, slow_code=near)) == []


def test_a_speed_pair_may_be_close_siblings_a_correctness_pair_may_not() -> None:
    """Siblings of one strategy that differ in launch geometry and run 3x apart teach that
    difference; a bug pair that close would teach nothing but a few edited tokens."""
    code = kernel_code("vec4", name="fastk")
    sibling = (code.replace("__global__ void fastk", "__global__ void __launch_bounds__(64) fastk")
               .replace("(n / 4 + 256 - 1) / 256, 256", "(n / 4 + 64 - 1) / 64, 64")
               .replace("int n = x.numel();", "const int n = (int)x.numel();"))
    assert MAX_SIMILARITY < code_similarity(code, sibling) <= MAX_SPEED_SIMILARITY
    rows = _prefs(*_pair_pool(3.0, 1.0, slow_code=sibling))
    assert len(rows) == 1 and rows[0]["kind"] == "speed"
    tasks, cands, verdicts = _pair_pool(3.0, 1.0, slow_code=sibling)
    verdicts[1] = verdict(cands[1], "incorrect")
    assert _prefs(tasks, cands, verdicts) == []


def test_every_built_pair_has_margin_and_distinct_code(built: tuple) -> None:
    tasks, cands, verdicts, _, tables = built
    vmap = {v.candidate_id: v for v in verdicts}
    code_of = {c.code.rstrip(): c for c in cands}
    rows = tables["preference"].to_pylist()
    assert rows
    for row in rows:
        win = code_of[row["chosen"][0]["content"][len("```python\n"):-len("\n```")]]
        lose = code_of[row["rejected"][0]["content"][len("```python\n"):-len("\n```")]]
        assert has_margin(vmap[win.candidate_id], vmap[lose.candidate_id])
        limit = pair_similarity_limit(vmap[lose.candidate_id])
        assert code_similarity(win.code, lose.code) <= limit
        assert limit == 0.9 or row["kind"] == "speed"
        assert not row["chosen"][0]["content"].lower().startswith("the bug")
    owner = mutant_configs(cands)
    used = [c for c in cands if owner.get(c.candidate_id) not in (None, "preference")]
    assert not any(row["rejected"][0]["content"].find(c.code.rstrip()) >= 0
                   for row in rows for c in used)


def test_mutant_kinds_are_not_shared_between_configs() -> None:
    task = make_task(0)
    base = candidate(task, "template:elementwise/plain", kernel_code("plain"))
    muts = [candidate(task, f"mutate:{k}", kernel_code("plain", scale=f"{i}.5"))
            for i, k in enumerate(["off_by_one", "wrong_cast", "grid_rounding", "omp_race",
                                   "wrong_stride", "unstable_softmax"] * 2)]
    owner = mutant_configs([base, *muts])
    assert set(owner) == {m.candidate_id for m in muts}
    by_kind: dict[str, set[str]] = {}
    for m in muts:
        by_kind.setdefault(m.generator, set()).add(owner[m.candidate_id])
    assert all(len(v) == 1 for v in by_kind.values())  # one config per kind
    assert set(owner.values()) == {"review", "repair", "preference"}  # six kinds cover all


def test_review_drops_labels_whose_fix_was_not_verified() -> None:
    tasks, cands, verdicts = pool(n_tasks=6)
    owner = mutant_configs(cands)
    review = {cid for cid, cfg in owner.items() if cfg == "review"}
    assert {r["candidate_id"] for r in build_datasets(tasks, cands, verdicts, [], Config())
            ["review"].to_pylist()} == review
    # The kernels the mutants came from (and their repairs) fail verification: no label stands.
    fixes = {json.loads(c.meta)["fix_code"].strip() for c in cands if c.candidate_id in review}
    for v in verdicts:
        c = next(x for x in cands if x.candidate_id == v.candidate_id)
        if c.code.strip() in fixes:
            v.status = "incorrect"
    assert build_datasets(tasks, cands, verdicts, [], Config())["review"].num_rows == 0


def test_review_drops_a_label_that_does_not_fix_the_bug() -> None:
    tasks, cands, verdicts = pool(n_tasks=6)
    owner = mutant_configs(cands)
    mut = next(c for c in cands if owner.get(c.candidate_id) == "review")
    meta = json.loads(mut.meta)
    # a claimed fix that changes another line as well: applying the label is not a passing kernel
    meta["fix_code"] = meta["fix_code"].replace("threadIdx.x;", "threadIdx.x + 1;")
    meta.pop("fix_candidate_id", None)
    mut.meta = json.dumps(meta)
    rows = build_datasets(tasks, cands, verdicts, [], Config())["review"].to_pylist()
    assert mut.candidate_id not in {r["candidate_id"] for r in rows}
    assert rows  # the other labels still stand
    label = fix_label(mut.code, meta["fix_code"])
    assert label is None  # two edits: no one-line label describes it


def test_the_same_two_programs_make_one_pair_whatever_their_ids() -> None:
    task = make_task(0)
    good = kernel_code("vec4", name="fastk")
    a = candidate(task, "template:elementwise/vec4", good)
    b = candidate(task, "repair:fix", good + "\n// fixed\n")  # the same program, another id
    bad = candidate(task, "llm:qwen", kernel_code("two", name="bad"))
    verdicts = [verdict(a, "correct_fast", 2.0, 3.0), verdict(b, "correct_fast", 2.0, 3.0),
                verdict(bad, "incorrect", reward=0.1, error="max diff 2.0")]
    rows = _prefs([task], [a, b, bad], verdicts)
    assert len(rows) == 1 and rows[0]["rejected_status"] == "incorrect"


def test_sft_and_rft_answers_without_a_passed_generalisation_check_are_not_published() -> None:
    from dataclasses import replace

    from schemas import Finding

    tasks, cands, verdicts = pool(n_tasks=4)
    selected = select_diverse(cands, verdicts, 3, 0.5)
    full = build_datasets(tasks, cands, verdicts, selected, Config())
    sft_ids = full["sft"].column("candidate_id").to_pylist()
    rft_ids = full["rft"].column("candidate_id").to_pylist()
    assert sft_ids and rft_ids
    unchecked = {sft_ids[0], rft_ids[0]}  # correct, but never checked at other sizes
    skipped = {sft_ids[-1]}  # one variant skipped: not every size set was checked
    changed = []
    for v in verdicts:
        if v.candidate_id in unchecked:
            v = replace(v, findings=[])
        elif v.candidate_id in skipped:
            v = replace(v, findings=[*v.findings, Finding("variant_skipped", "sizes: ...",
                                                          None, "warning")])
        changed.append(v)
    out = build_datasets(tasks, cands, changed, selected, Config())
    kept = set(out["sft"].column("candidate_id").to_pylist()) | set(
        out["rft"].column("candidate_id").to_pylist())
    assert not kept & (unchecked | skipped)
    assert set(sft_ids) - unchecked - skipped <= kept
    # with the check off (a build that never ran it) the same verdicts publish
    off = Config()
    off.verify.generalize = False
    assert sft_ids[0] in build_datasets(tasks, cands, changed, selected, off)["sft"].column(
        "candidate_id").to_pylist()


def test_speed_margin_must_hold_across_the_timing_spread() -> None:
    def timed(cid: str, median: float, iqr: float | None) -> Verdict:
        return Verdict(candidate_id=cid, task_id="t", status="correct_fast", stage="done",
                       backend="cpu", device="cpu", runtime_us=median, runtime_iqr_us=iqr)

    fast = timed("a", 100.0, 4.0)
    assert has_margin(fast, timed("b", 140.0, 4.0))  # 138 >= 1.2 * 102
    # 1.3x by the medians, but the quartiles overlap the 1.2x line: within the noise
    assert not has_margin(fast, timed("c", 130.0, 20.0))  # 120 < 1.2 * 102
    assert not has_margin(timed("d", 100.0, 30.0), timed("e", 130.0, 2.0))
    assert not has_margin(timed("f", 100.0, None), timed("g", 300.0, 1.0))  # no spread known


def test_every_config_gets_its_share_of_every_failing_kind() -> None:
    # six tasks, each with a cast and an off-by-one mutant; three rarer kinds once each; and a
    # mutant that verified correct (no bug shows), which no config gets
    muts, verdicts = [], {}
    for t in range(6):
        task = make_task(t)
        kinds = ["off_by_one", "wrong_cast"] + (["wrong_init", "grid_rounding",
                                                 "unstable_softmax"][t:t + 1])
        for i, k in enumerate(kinds):
            m = candidate(task, f"mutate:{k}", kernel_code("plain", scale=f"{t}.{i}5"))
            muts.append(m)
            verdicts[m.candidate_id] = verdict(m, "incorrect")
    passing = candidate(make_task(0), "mutate:wrong_stride", kernel_code("plain", scale="9.5"))
    verdicts[passing.candidate_id] = verdict(passing, "correct_slow")
    owner = mutant_configs([*muts, passing], verdicts)
    assert owner[passing.candidate_id] == ""
    for kind in ("off_by_one", "wrong_cast"):
        got = sorted(owner[m.candidate_id] for m in muts if m.generator == f"mutate:{kind}")
        assert got == ["preference", "preference", "repair", "repair", "review", "review"]
    rare = {owner[m.candidate_id] for m in muts
            if m.generator not in ("mutate:off_by_one", "mutate:wrong_cast")}
    assert rare == {"review", "repair", "preference"}
    # a second off-by-one mutant of task 0 (from another kernel) goes where the first went
    again = candidate(make_task(0), "mutate:off_by_one", kernel_code("plain", scale="7.5"))
    verdicts[again.candidate_id] = verdict(again, "incorrect")
    both = mutant_configs([*muts, again], verdicts)
    assert both[again.candidate_id] == both[muts[0].candidate_id]


def _conversations(tables: dict) -> list[tuple[str, list[Message]]]:
    out = []
    for config, key in (("sft", "messages"), ("rft", "messages"), ("repair", "messages"),
                        ("rl", "prompt")):
        for r in tables[config].to_pylist():
            out.append((config, [Message(m["role"], m["content"]) for m in r[key]]))
    for r in tables["preference"].to_pylist():
        for side in ("chosen", "rejected"):
            out.append(("preference", [Message(m["role"], m["content"])
                                       for m in r["prompt"] + r[side]]))
    return out


def test_every_answer_has_the_form_its_prompt_asked_for(built: tuple) -> None:
    """A prompt that says "explain your design before the code" is never answered with bare
    code (preference sides, repair first attempts), nor "code block only" with prose."""
    convs = _conversations(built[4])
    assert {c for c, _ in convs} >= {"sft", "repair", "rl", "preference"}
    for config, conv in convs:
        assert answer_format_problems(conv) == [], (config, conv[-1].content[:200])
    pref = [conv for c, conv in convs if c == "preference"]
    assert pref and all(CODE_ONLY_RULE in conv[1].content for conv in pref)
    sft = [conv for c, conv in convs if c == "sft"]
    assert sft and all(REASONING_RULE in conv[1].content for conv in sft)
    repair = [conv for c, conv in convs if c == "repair"]
    # the fix turns are the repair generator's own feedback turn, naming the status
    assert repair and all("did not pass verification (status:" in conv[-2].content
                          for conv in repair)


def test_answer_format_problems_flags_both_mismatches() -> None:
    code = "```python\nx = 1\n```"
    ask = [Message("system", "s"), Message("user", f"task\n7. {REASONING_RULE}")]
    only = [Message("system", "s"), Message("user", f"task\n7. {CODE_ONLY_RULE}")]
    assert answer_format_problems(ask + [Message("assistant", code)]) == [
        "turn 2: asked for an explanation, answered with bare code"]
    assert answer_format_problems(ask + [Message("assistant", "One loop.\n\n" + code)]) == []
    assert answer_format_problems(only + [Message("assistant", "Plan.\n" + code)]) == [
        "turn 2: asked for the code block only, answered with prose"]
    assert answer_format_problems(only + [Message("assistant", code)]) == []
    fix_only = only + [Message("assistant", code),
                       Message("user", feedback_turn(Verdict("c", "t", "incorrect", "correctness", "cpu"), explain=False))]
    assert answer_format_problems(fix_only + [Message("assistant", "It was off.\n" + code)]) == [
        "turn 4: asked for the code block only, answered with prose"]
    explain = only + [Message("assistant", code),
                      Message("user", feedback_turn(Verdict("c", "t", "incorrect", "correctness", "cpu")))]
    assert answer_format_problems(explain + [Message("assistant", code)]) == [
        "turn 4: asked for an explanation, answered with bare code"]


def test_every_row_keeps_its_verdicts_numbers_by_name(built: tuple) -> None:
    vmap = {v.candidate_id: v for v in built[2]}
    fields = ("reward", "speedup", "runtime_us", "runtime_iqr_us", "eager_us")
    for config in ("sft", "rft", "perf_analysis"):
        rows = _rows(built, config)
        assert rows, config
        for row in rows:
            v = vmap[row["candidate_id"]]
            assert v.status in CORRECT_STATUSES
            assert {f: row[f] for f in fields} == {f: getattr(v, f) for f in fields}, config
            assert row["reward"] > 0 and row["speedup"] and row["runtime_us"] and row["eager_us"]
    by_code: dict[tuple[str, str], list[tuple]] = {}  # the pool repeats a code under two ids
    for c in built[1]:
        v = vmap[c.candidate_id]
        by_code.setdefault((c.task_id, c.code.rstrip()), []).append(
            (v.reward, v.speedup, v.runtime_us, v.runtime_iqr_us))
    for row in _rows(built, "preference"):
        for side in ("chosen", "rejected"):
            code = row[side][0]["content"].removeprefix("```python\n").removesuffix("\n```")
            got = tuple(row[f"{side}_{f}"] for f in ("reward", "speedup", "runtime_us",
                                                     "runtime_iqr_us"))
            assert got in by_code[(row["task_id"], code)]
        assert row["chosen_speedup"] and row["chosen_runtime_us"] and row["eager_us"]
        both = row["rejected_status"] in CORRECT_STATUSES
        assert row["kind"] == ("speed" if both else "correctness")
    for row in _rows(built, "repair"):
        assert row["final_reward"] == row["turn_rewards"][-1] > 0
        assert row["final_speedup"] and row["final_runtime_us"] and row["eager_us"]


def test_min_speedup_gates_sft_rft_and_the_chosen_side(built: tuple) -> None:
    tasks, cands, verdicts, selected, _ = built
    vmap = {v.candidate_id: v for v in verdicts}
    for gate in (1.0, 1.5):
        cfg = Config.model_validate({"select": {"min_speedup": gate}})
        tables = build_datasets(tasks, cands, verdicts, selected, cfg)
        sft, rft = tables["sft"].to_pylist(), tables["rft"].to_pylist()
        assert sft and rft
        assert all(r["speedup"] >= gate for r in sft + rft)
        assert all(r["chosen_speedup"] >= gate for r in tables["preference"].to_pylist())
        # sft: one answer per task, the fastest correct teacher kernel
        assert len({r["task_id"] for r in sft}) == len(sft)
        for r in sft:
            siblings = [vmap[c.candidate_id].speedup for c in cands if c.task_id == r["task_id"]
                        and c.generator.startswith("template:")
                        and vmap[c.candidate_id].status in CORRECT_STATUSES]
            assert r["speedup"] == max(siblings)
    slow = Config.model_validate({"select": {"min_speedup": 0.0}})
    rows = build_datasets(tasks, cands, verdicts, selected, slow)["rft"].to_pylist()
    assert any(r["speedup"] < 1.0 for r in rows)  # the gate, not the pool, removed them


def test_speed_pairs_take_turns_with_correctness_pairs(built: tuple) -> None:
    rows = _rows(built, "preference")
    speed = [r for r in rows if r["kind"] == "speed"]
    assert len(speed) * 3 >= len(rows) and len(speed) < len(rows)
    for r in speed:  # both sides correct, and the margin holds across both spreads
        lo = r["rejected_runtime_us"] - r["rejected_runtime_iqr_us"] / 2
        hi = r["chosen_runtime_us"] + r["chosen_runtime_iqr_us"] / 2
        assert r["rejected_status"] in CORRECT_STATUSES and lo >= 1.2 * hi


def test_a_timing_that_did_not_repeat_labels_nothing() -> None:
    tasks, cands, verdicts = _pair_pool(3.0, 1.0)
    fast = cands[0]
    # the same program verified again (another id: a repair turn) at a third of the speed
    again = candidate(tasks[0], "repair:fix", fast.code + "\n", parent=cands[1], turn=1)
    redo = verdict(again, "correct_fast", 1.05, 2.05)
    assert unstable_timings(cands + [again], {v.candidate_id: v for v in verdicts + [redo]}) \
        == {fast.candidate_id, again.candidate_id}
    assert _prefs(tasks, cands + [again], verdicts + [redo]) == []
    assert len(_prefs(tasks, cands, verdicts)) == 1  # the same pool, timed once, makes its pair


def test_a_program_retimed_below_the_gate_is_no_chosen_side_under_another_id() -> None:
    """The default build's audit (timing_repeats) found chosen sides that were a repair turn
    restoring a template kernel: the repair's one timing held, the template's re-timing fell
    below the gate. The program's every timing decides, not the id's."""
    from dataclasses import replace

    from pipeline.datasets.retime import retime_finding

    tasks, cands, verdicts = _pair_pool(2.0, 1.0)
    fast = cands[0]
    again = candidate(tasks[0], "repair:fix", fast.code + "\n", parent=cands[1], turn=1)
    redo = verdict(again, "correct_fast", 2.0, 3.0)  # the same runtime: not unstable
    low = verdict(fast, "correct_slow", 0.9)
    held = [redo, *verdicts[1:]]
    assert len(_prefs(tasks, cands + [again], [verdicts[0], *held])) == 1
    retimed = replace(verdicts[0], findings=[*verdicts[0].findings, retime_finding(low)])
    vmap = {v.candidate_id: v for v in [retimed, *held]}
    assert programs_not_held(cands + [again], vmap, 1.0) == {fast.candidate_id,
                                                             again.candidate_id}
    assert _prefs(tasks, cands + [again], [retimed, *held]) == []


def test_rft_preference_and_review_each_have_validation_rows() -> None:
    tasks, cands, verdicts = pool(n_tasks=6)
    cfg = Config.model_validate({"publish": {"validation_fraction": 0.01}})
    tables = build_datasets(tasks, cands, verdicts, select_diverse(cands, verdicts, 3, 0.5), cfg)
    cluster = {t.task_id: t.dedup_cluster for t in tasks}
    side: dict[str, str] = {}
    for name in ("rft", "preference", "review"):
        rows = tables[name].to_pylist()
        assert {r["split"] for r in rows} == {"train", "validation"}, name
    for name, table in tables.items():  # one side per cluster across every config
        for r in table.select(["task_id", "split"]).to_pylist():
            assert side.setdefault(cluster[r["task_id"]], r["split"]) == r["split"], name


def test_perf_analysis_has_one_row_per_distinct_kernel(built: tuple) -> None:
    tasks, cands, verdicts, _, _ = built
    every = [c.candidate_id for c in cands]  # the repair reverts repeat template kernels
    rows = build_datasets(tasks, cands, verdicts, every, Config())["perf_analysis"].to_pylist()
    code = {c.candidate_id: normalise_code(c.code) for c in cands}
    keys = [(r["task_id"], code[r["candidate_id"]]) for r in rows]
    assert rows and len(keys) == len(set(keys))
    advice = [r["messages"][-1]["content"].split("Next optimization:")[1] for r in rows]
    assert len(set(advice)) > 1


def test_a_speed_label_whose_retiming_disagreed_is_dropped_with_a_rejection() -> None:
    """The same program timed twice (a repair turn restores a template kernel) at 1.5x and 3x
    with tight spreads: neither timing is a label; the sft row is dropped and a publish
    rejection says why. A sibling whose timing stands is taught instead."""
    from pipeline.datasets.selection import label_rejections

    task = make_task(0)
    code = kernel_code("vec4", name="fast")
    first = candidate(task, "template:elementwise/simd", code)
    again = Candidate(**{**first.__dict__, "candidate_id": "again", "generator": "repair:fix",
                         "turn": 1, "parent_id": first.candidate_id})
    other = candidate(task, "template:elementwise/omp", kernel_code("two", name="slowk"))
    v1, v2 = verdict(first, "correct_fast", 1.5, 1.5), verdict(again, "correct_fast", 3.0, 1.6)
    vo = verdict(other, "correct_fast", 1.2, 1.2)
    vmap = {v.candidate_id: v for v in (v1, v2, vo)}
    unstable = unstable_timings([first, again, other], vmap)
    assert unstable == {first.candidate_id, "again"}
    rej = label_rejections([first, again, other], vmap, 1.0, unstable)
    assert [r.item_id for r in rej] == [first.candidate_id]  # the teacher's own kernel
    assert rej[0].reason == "timing_not_repeated" and "timed again" in rej[0].detail
    sft = build_datasets([task], [first, again, other], [v1, v2, vo], [], Config())["sft"]
    assert [r["candidate_id"] for r in sft.to_pylist()] == [other.candidate_id]


def test_a_task_teaches_no_more_bug_pairs_than_speed_pairs() -> None:
    """The CI build's preference set had 1 speed pair of 8: tasks without a speed pair filled
    their four slots with injected bugs. A task now keeps as many correctness pairs as speed
    pairs (at least one), speed first, within the per-task limit."""
    from pipeline.datasets.rows import balanced_pairs

    assert balanced_pairs([], ["b1", "b2", "b3"], 4) == ["b1"]
    assert balanced_pairs(["s1"], ["b1", "b2", "b3"], 4) == ["s1", "b1"]
    assert balanced_pairs(["s1", "s2"], ["b1", "b2", "b3"], 4) == ["s1", "b1", "s2", "b2"]
    assert balanced_pairs(["s1", "s2", "s3", "s4", "s5"], ["b1"], 4) == ["s1", "s2", "s3", "s4"]
    assert balanced_pairs(["s1", "s2", "s3"], ["b1", "b2"], 4) == ["s1", "b1", "s2", "s3"]
