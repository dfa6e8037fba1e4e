"""Multi-turn repair: feedback becomes the next user turn; known fixes and LLM answers."""

from __future__ import annotations

import json

from pipeline.candidates.mutate import mutate_candidates
from pipeline.candidates.repair import repair_round, retry_buffer
from pipeline.candidates.response_code import extract_code
from pipeline.config import Config, GenerateConfig, RepairConfig
from pipeline.plan import run_step
from pipeline.prompts import build_prompt, feedback_turn, fence
from pipeline.runner import local_executor
from pipeline.workspace import Workspace
from schemas import Candidate, Message, Rejection, Task, Verdict
from tests.pipeline.chat_server import chat_server
from tests.pipeline.test_mutate import CPU_CANDIDATE

FEEDBACK = "Output 0 differs from the reference: max abs diff 3.25 at index [7] (row 7)."


def _task(task_id: str = "t1") -> Task:
    src = "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    pass\n"
    return Task(task_id=task_id, name=f"task_{task_id}", source=src, cpu_source=src)


def _verdict(cand: Candidate, status: str, reward: float = 0.0, feedback: str = FEEDBACK
             ) -> Verdict:
    stage = {"compile_error": "compile", "incorrect": "correctness"}.get(status, "done")
    return Verdict(candidate_id=cand.candidate_id, task_id=cand.task_id, status=status,
                   stage=stage, backend=cand.backend, reward=reward, feedback=feedback)


def _original() -> Candidate:
    return Candidate(candidate_id=Candidate.make_id("t1", "cpu", CPU_CANDIDATE), task_id="t1",
                     backend="cpu", generator="template:reduction/rows", code=CPU_CANDIDATE,
                     raw_response=fence(CPU_CANDIDATE, "Sum each row."),
                     prompt=build_prompt(_task(), "cpu", GenerateConfig()))


def _mutant(kind: str = "off_by_one") -> tuple[Candidate, Candidate]:
    orig = _original()
    (mutant,) = mutate_candidates([_task()], [orig], [_verdict(orig, "correct_slow", 1.0)],
                                  GenerateConfig(mutation_kinds=[kind]))
    return orig, mutant


def test_mutation_chain_is_answered_by_its_known_fix() -> None:
    orig, mutant = _mutant()
    verdicts = [_verdict(orig, "correct_slow", 1.0), _verdict(mutant, "incorrect")]
    (fix,) = repair_round([_task()], [orig, mutant], verdicts, Config(), turn=1)
    assert fix.generator == "repair:fix"
    assert fix.code == CPU_CANDIDATE and fix.candidate_id != orig.candidate_id
    assert fix.parent_id == mutant.candidate_id and fix.turn == 1
    # the conversation: the task, the buggy attempt, the verifier's feedback as the user turn
    assert fix.prompt[:len(mutant.prompt)] == mutant.prompt
    assert fix.prompt[-2] == Message("assistant", mutant.raw_response)
    assert fix.prompt[-1].role == "user" and FEEDBACK in fix.prompt[-1].content
    assert "incorrect" in fix.prompt[-1].content
    assert extract_code(fix.raw_response) == CPU_CANDIDATE
    meta = json.loads(mutant.meta)
    assert f"line {meta['bug_line']}" in fix.raw_response
    assert meta["bug_after"].strip() in fix.raw_response and "- 1" in meta["bug_after"]
    assert meta["bug_before"].strip() in fix.raw_response


def test_only_failing_unrepaired_chain_ends_within_turns_continue() -> None:
    orig, mutant = _mutant()
    fail = [_verdict(orig, "correct_slow", 1.0), _verdict(mutant, "incorrect")]
    (fix,) = repair_round([_task()], [orig, mutant], fail, Config(), turn=1)
    both = [orig, mutant, fix]
    # the chain already has turn 1: nothing new at turn 1; a correct fix ends the chain
    assert repair_round([_task()], both, fail, Config(), turn=1) == []
    assert repair_round([_task()], both, [*fail, _verdict(fix, "correct_fast", 1.2)], Config(),
                        turn=2) == []
    # no verdict yet, compile-only verdicts, other tasks and turns past the limit: nothing
    assert repair_round([_task()], [mutant], [], Config(), turn=1) == []
    assert repair_round([_task()], [mutant], [_verdict(mutant, "compiled")], Config(), 1) == []
    assert repair_round([_task("other")], [mutant], fail, Config(), turn=1) == []
    capped = Config(repair=RepairConfig(turns=1))
    assert repair_round([_task()], both, [*fail, _verdict(fix, "incorrect")], capped, 2) == []


def test_feedback_turn_falls_back_to_error_and_log() -> None:
    orig = _original()
    v = _verdict(orig, "compile_error", feedback="")
    v.compile_log = "kernel.cpp:12:5: error: 'acc' was not declared in this scope"
    text = feedback_turn(v)
    assert "compile_error" in text and "compile stage" in text and "'acc' was not" in text


def _llm_cfg(url: str, **repair: object) -> Config:
    return Config(generate=GenerateConfig(generators=["openai"], openai_base_url=url,
                                          openai_model="coder", retries=0),
                  repair=RepairConfig(**repair))


def _attempt(task_id: str, i: int) -> Candidate:
    code = CPU_CANDIDATE.replace("row_sum_ext", f"ext_{task_id}_{i}")
    return Candidate(candidate_id=f"{task_id}-s{i}", task_id=task_id, backend="cpu",
                     generator="llm:coder", code=code, raw_response=fence(code),
                     prompt=build_prompt(_task(task_id), "cpu", GenerateConfig()))


def test_llm_repairs_with_feedback_and_buffered_retry() -> None:
    a0, a1, b0, b1 = _attempt("a", 0), _attempt("a", 1), _attempt("b", 0), _attempt("b", 1)
    verdicts = [_verdict(a0, "compile_error", 0.0), _verdict(a1, "incorrect", 0.2),
                _verdict(b0, "incorrect", 0.2), _verdict(b1, "correct_slow", 1.0)]
    buffered = retry_buffer([a0, a1, b0, b1], verdicts)
    assert [(r.task_id, r.candidate_id, r.group_size) for r in buffered] == [("a", "a-s1", 2)]
    assert buffered[0].messages[-1].role == "user" and FEEDBACK in buffered[0].messages[-1].content
    def reply(body: dict, i: int) -> str:
        return "Found it.\n" + fence(CPU_CANDIDATE.replace("row_sum_ext", f"fixed{i}"))

    with chat_server() as (state, url):
        state.reply = reply
        out = repair_round([_task("a"), _task("b")], [a0, a1, b0, b1], verdicts,
                           _llm_cfg(url, retry_samples=3), turn=1)
    # every failing chain gets one answer; the all-failed group's best attempt gets three
    assert sorted((len(r["messages"]), r["n"]) for r in state.requests) == [
        (4, 1), (4, 1), (4, 3)]
    by_parent: dict[str, list[Candidate]] = {}
    for c in out:
        by_parent.setdefault(c.parent_id, []).append(c)
    assert {k: len(v) for k, v in by_parent.items()} == {"a-s0": 1, "a-s1": 3, "b-s0": 1}
    c = by_parent["b-s0"][0]
    assert c.generator == "repair:1" and c.turn == 1
    assert c.code == extract_code(reply({}, 0)) and "fixed0" in c.code
    assert c.prompt[-1].role == "user" and FEEDBACK in c.prompt[-1].content
    meta = json.loads(c.meta)
    assert meta["model"] == "llm:coder" and meta["usage"]["prompt_tokens"] == 11
    assert all(json.loads(x.meta).get("retry") == "buffered_dynamic_retry"
               for x in by_parent["a-s1"])


def test_llm_failure_becomes_a_rejection_not_a_crash() -> None:
    a0 = _attempt("a", 0)
    rejections: list[Rejection] = []
    with chat_server() as (state, url):
        state.script = ["400"]
        out = repair_round([_task("a")], [a0], [_verdict(a0, "incorrect")],
                           _llm_cfg(url, retry_samples=1), turn=1, rejections=rejections)
    assert out == []
    assert [(r.stage, r.item_id, r.reason) for r in rejections] == [("repair", "a-s0",
                                                                       "llm_error")]


def test_repair_step_writes_turns_and_is_idempotent(workspace: Workspace) -> None:
    orig, mutant = _mutant("wrong_cast")
    run = workspace.new_run("r1")
    run.write([_task()])
    run.write([orig, mutant])
    run.write([_verdict(orig, "correct_slow", 1.0), _verdict(mutant, "incorrect")])
    cfg = Config(repair=RepairConfig(turns=3, verify=False))
    counts = run_step(local_executor(workspace, cfg), "repair")
    assert counts["turn1"] == 1 and counts["unverified"] == 1
    (fix,) = [c for c in workspace.read(Candidate) if c.generator == "repair:fix"]
    assert fix.parent_id == mutant.candidate_id and fix.code == orig.code
    again = run_step(local_executor(workspace, cfg), "repair")
    assert again.get("candidates", 0) == 0
    assert len(workspace.read(Candidate)) == 3


def test_fix_explanation_is_checked_against_the_diff() -> None:
    from pipeline.candidates.repair import fix_explanation

    fixed = "a = 1\ny = x[i * n + j]\nz = 3\n"
    buggy = "a = 1\ny = x[j * n + i]\nz = 3\n"
    right = {"bug_line": 7, "bug_description": "index `[j * n + i]` uses the wrong stride",
             "mutation": "wrong_stride"}
    text = fix_explanation(buggy, fixed, right)
    # the line number and both texts come from the diff, not from a stale label
    assert text.startswith("The bug is on line 2: index `[j * n + i]` uses the wrong stride.")
    assert "```\ny = x[j * n + i]\n```\nand it should read\n```\ny = x[i * n + j]\n```" in text
    # a description that quotes the correct code as the bug reads backwards: not repeated
    backwards = dict(right, bug_description="index `[i * n + j]` uses the wrong stride")
    text = fix_explanation(buggy, fixed, backwards)
    assert "`[i * n + j]` uses the wrong stride" not in text
    assert "line 2: the line was changed (wrong_stride)" in text


def test_a_task_too_big_for_the_device_is_not_repaired() -> None:
    """`does_not_fit` judges the task, not the attempt: nothing to repair (nor is a correct or
    a compile-only verdict), while a wrong attempt is."""
    from pipeline.candidates.repair import is_failure

    orig = _original()
    assert not is_failure(_verdict(orig, "does_not_fit"))
    assert not is_failure(_verdict(orig, "correct_slow"))
    assert is_failure(_verdict(orig, "incorrect"))
