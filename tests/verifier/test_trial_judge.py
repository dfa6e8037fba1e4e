"""The trials on the judge's arena (`verifier.judge.trial_judge` judge side, `verifier.judge.trial_io`
worker side), in one process on cpu tensors (a memfd arena; on a GPU the same code runs on a
CUDA VMM arena in the referee): what an honest worker leaves passes, and every way the slots or
the report can be wrong is caught with the message the parent's old comparison gave."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from verifier.judge import decide
from verifier.judge.trial_io import ArenaTrials, rebuild
from verifier.judge.trial_judge import DoesNotFit, TrialJudge

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK  # noqa: E402

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
TUPLE_TASK = '''import torch
class Model(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k
    def forward(self, x):
        return (x * 2.0, x.shape[0] * self.k, None)
def get_inputs():
    return [torch.randn(8, 33)]
def get_init_inputs():
    return [3]
'''
SIZES_VARIANT = {"label": "sizes", "changes": {"dim": [1024, 512]},
                 "source": RELU_TASK.replace("dim = 1024", "dim = 512")}
BROKEN_VARIANT = {"label": "init", "changes": {"x": [1, 2]},
                  "source": RELU_TASK.replace("return torch.relu(x)", "raise ValueError('no')")}


def _args(source: str = RELU_TASK, trials: int = 3, variants: list | None = None) -> dict:
    return {"task_source": source, "seed": 0, "input_seed": 4242, "trials": trials,
            "tol": TOL, "variants": variants or []}


def _worker(judge: TrialJudge, model: Any, mutate: bool = False) -> ArenaTrials:
    """An honest worker's side: the judge's inputs, `model`'s outputs into the slots."""
    io = ArenaTrials(judge.spec, os.dup(judge.arena.fd), "cpu")
    for block, cases in enumerate(judge.spec["blocks"]):
        for t in range(len(cases or [])):
            inputs = io.inputs(block, t)
            io.keep(block, t, model(*inputs))
            if mutate and t == 1:
                inputs[0].mul_(2)
    return io


def test_an_honest_worker_passes_and_its_figures_are_the_judges() -> None:
    judge = TrialJudge(_args(), 1 << 30, 16 << 20)
    io = _worker(judge, torch.relu)
    ok, why, stats = judge.check(io.report()["trial_report"], None)
    assert (ok, why) == (True, "")
    assert stats["max_abs_diff"] == 0.0 and stats["mismatch_frac"] == 0.0
    assert stats["rel_norm"] == 0.0
    # the inputs are those the parent's seed gives, as the worker used to draw them
    ns: dict = {}
    exec(RELU_TASK, ns)
    torch.manual_seed(4242 + 1001)
    assert torch.equal(io.inputs(0, 1)[0], ns["get_inputs"]()[0])
    io.close()
    judge.close()


def test_wrong_missing_and_mutating_outputs_are_caught() -> None:
    judge = TrialJudge(_args(), 1 << 30, 16 << 20)
    io = _worker(judge, lambda x: torch.relu(x) + (x > 1.5) * 1e-2)
    ok, why, stats = judge.check(io.report()["trial_report"], None)
    assert not ok and why.startswith("trial 1, checked by the verifier itself: output 0: "), why
    assert "differ beyond atol=0.0001" in why and stats["max_abs_diff"] > 5e-3
    io.close()
    judge.close()
    judge = TrialJudge(_args(), 1 << 30, 16 << 20)
    io = _worker(judge, torch.relu, mutate=True)
    ok, why, _ = judge.check(io.report()["trial_report"], None)
    assert not ok and why == ("trial 2, checked by the verifier itself: forward modified its "
                              "input tensors"), why
    # a worker that claims outputs it never copied leaves the poisoned slot: NaN
    report = {"values": [[[], [], []]]}
    fresh = TrialJudge(_args(), 1 << 30, 16 << 20)
    ok, why, _ = fresh.check(report, None)
    assert not ok and why.startswith("trial 1, checked by the verifier itself: output 0: "), why
    ok, why, _ = fresh.check({"values": [[[], None, []]]}, None)
    assert not ok and "trial 1" in why
    for bad in ({"values": [[[]]]}, {"values": "x"}):  # a report of the wrong form: the
        ok, why, _ = fresh.check(bad, None)  # judge reads the slots all the same (poisoned)
        assert not ok and why.startswith("trial 1, checked by the verifier itself"), why
    for j in (judge, fresh):
        j.close()
    io.close()


def test_a_report_of_the_wrong_form_over_right_slots_is_the_workers_word() -> None:
    """An honest worker's slots with a report of the wrong form (an earlier job's code in the
    worker can garble it): the slots pass the judge's comparison, so the failure rests on the
    report alone (`on_word`: made again in a fresh worker, `verifier.run.outcome`); over wrong
    slots the judge's own comparison is the answer (it stands). A task with plain values in its
    output cannot be read without the report: the report's failure, the worker's word."""
    from verifier.judge.trial_io import on_word

    for model, judged in ((torch.relu, False), (lambda x: torch.relu(x) + 1.0, True)):
        judge = TrialJudge(_args(), 1 << 30, 16 << 20)
        io = _worker(judge, model)
        for bad in (None, {"values": [[[], []]]}, {"values": [[[], [], []], []]}, [1] * 4):
            ok, why, _ = judge.check(bad, None)
            assert not ok and on_word(why) is not judged, (bad, why)
            assert why.startswith("trial 1, checked by the verifier itself") is judged, why
        assert judge.check(io.report()["trial_report"], None)[0] is not judged
        io.close()
        judge.close()
    judge = TrialJudge(_args(TUPLE_TASK), 1 << 30, 16 << 20)
    io = _worker(judge, lambda x: (x * 2.0 + 1.0, 24, None))  # wrong, but unreadable unreported
    ok, why, _ = judge.check({"values": [[]]}, None)
    assert not ok and on_word(why) and "0 trial outputs, expected 3" in why, why
    io.close()
    judge.close()


def test_the_judge_sees_what_the_worker_sees_not_what_it_kept() -> None:
    """The slot is the judge's; a worker that passes its own comparison but writes another
    output there (or nothing) is judged by what the slot holds, as the referee reads it."""
    judge = TrialJudge(_args(trials=2), 1 << 30, 16 << 20)
    io = ArenaTrials(judge.spec, os.dup(judge.arena.fd), "cpu")
    x = io.inputs(0, 0)
    io.keep(0, 0, torch.relu(x[0]))
    io.keep(0, 1, torch.relu(x[0]))  # trial 1's output replayed for trial 2's inputs
    ok, why, _ = judge.check(io.report()["trial_report"], None)
    assert not ok and why.startswith(decide.CACHED_RESULT) and "trial 2" in why, why
    io.close()
    judge.close()


def test_outputs_with_plain_values_and_containers() -> None:
    judge = TrialJudge(_args(TUPLE_TASK, trials=2), 1 << 30, 16 << 20)
    io = _worker(judge, lambda x: (x * 2.0, x.shape[0] * 3, None))
    report = io.report()["trial_report"]
    assert report["values"] == [[[24, None], [24, None]]]
    assert judge.check(report, None)[:2] == (True, "")
    wrong = {"values": [[[24, None], [25, None]]]}
    ok, why, _ = judge.check(wrong, None)
    assert not ok and why == "trial 2, checked by the verifier itself: output 1: 25 != 24", why
    ok, why, _ = judge.check({"values": [[[24, None], [24]]]}, None)
    assert not ok and "does not fit the reference's" in why, why
    io.close()
    # a list where the reference has a tuple is accepted (as `verifier.judge.device_compare` does); a tensor
    # subclass or a wrong shape does not fit the slot: no output
    io = ArenaTrials(judge.spec, os.dup(judge.arena.fd), "cpu")
    x = io.inputs(0, 0)[0]
    io.keep(0, 0, [x * 2.0, 24, None])
    io.keep(0, 1, (torch.nn.Parameter(x * 2.0), 24, None))
    io.keep(0, 2, (x[:1] * 2.0, 24, None))
    assert io.report()["trial_report"]["values"][0] == [[24, None], None, None]
    io.close()
    judge.close()
    with pytest.raises(ValueError, match="fewer plain values"):
        rebuild((torch.zeros(1), 3), [])


def test_variants_skips_and_their_checks() -> None:
    judge = TrialJudge(_args(trials=2, variants=[SIZES_VARIANT, BROKEN_VARIANT]), 1 << 30,
                       16 << 20)
    assert judge.spec["blocks"][2] is None and len(judge.spec["blocks"][1]) == 2
    io = _worker(judge, torch.relu)
    report = io.report()["trial_report"]
    assert judge.check(report, [True, False])[:2] == (True, "")
    ok, why, _ = judge.check(report, [False, False])
    assert not ok and why == "the worker skipped the sizes variant, which builds", why
    ok, why, _ = judge.check(report, [True, True])
    assert not ok and "cannot run" in why, why
    ok, why, _ = judge.check(report, None)
    assert not ok and why == "the worker did not report the generalisation check"
    bad = {"values": [report["values"][0], [[], None], []]}
    ok, why, _ = judge.check(bad, [True, False])
    assert not ok and why.startswith("sizes variant: trial 2, checked by the verifier"), why
    io.close()
    judge.close()


def test_the_judge_agrees_with_the_parents_seeded_comparison() -> None:
    """The same outputs judged by the old path (`decide.recheck`, outputs through host memory)
    and by the arena: the same verdicts and messages."""
    def outputs_of(model: Any, judge: TrialJudge) -> tuple[ArenaTrials, list[Any]]:
        io = _worker(judge, model)
        raw = [model(*io.inputs(0, t)) for t in range(judge.spec["trials"])]
        return io, raw

    for model in (torch.relu, lambda x: torch.relu(x) * 1.001, lambda x: torch.relu(x) + 1e-5,
                  lambda x: torch.where(x > 2.5, x * 0, torch.relu(x))):
        judge = TrialJudge(_args(), 1 << 30, 16 << 20)
        io, raw = outputs_of(model, judge)
        old = decide.recheck(RELU_TASK, 0, 4242, 3, raw, TOL)
        new = judge.check(io.report()["trial_report"], None)[:2]
        assert new == old, (new, old)
        io.close()
        judge.close()


def test_a_task_that_cannot_fit_says_so_with_its_footprint() -> None:
    judge = TrialJudge(_args(trials=5), 1 << 30, 16 << 20)
    assert judge.spec["trials"] == 5 and judge.admission.fp64
    judge.close()
    with pytest.raises(DoesNotFit, match="GiB of device memory for one trial.*an input set"):
        TrialJudge(_args(trials=5), 64 << 20, 16 << 20)


def test_a_job_keeps_only_its_own_reference_models_cached() -> None:
    """Models cached for other tasks would hold device memory a later job's admission counts
    as taken: the verdict would depend on what ran before. A job drops them."""
    decide.reference(TUPLE_TASK, 0)
    assert any(k[0] == TUPLE_TASK for k in decide._MODELS)
    judge = TrialJudge(_args(variants=[SIZES_VARIANT]), 1 << 30, 16 << 20)
    assert {k[0] for k in decide._MODELS} == {RELU_TASK, SIZES_VARIANT["source"]}
    judge.close()


def test_an_earlier_trials_output_returned_again_is_a_cached_result() -> None:
    """A result cache (its first output kept and returned for every later input: the GPU
    conformance cases cuda_result_cache and cuda_graph_legacy_stream) is a cheat named as
    such, as the worker's own comparison named it, not an `incorrect` kernel; a kernel that
    is merely wrong on a later trial, or writes nothing at all, stays `incorrect`."""
    kept: list[torch.Tensor] = []

    def cache(x: torch.Tensor) -> torch.Tensor:
        if not kept:
            kept.append(torch.relu(x))
        return kept[0]

    judge = TrialJudge(_args(), 1 << 30, 16 << 20)
    io = _worker(judge, cache)
    ok, why, _ = judge.check(io.report()["trial_report"], None)
    assert not ok and why.startswith(decide.CACHED_RESULT) and "trial 2" in why, why

    class Out:  # what the parent's check reads: the judge compared, the worker claimed nothing
        judge_compared, referee = True, staticmethod(lambda op, args: (ok, why))

    job = {"input_seed": 4242, "options": {}}
    opts = type("O", (), {"seed": 0, "trials": 3, "atol_fp32": 1e-4, "rtol_fp32": 1e-4,
                          "atol_low": 1e-2, "rtol_low": 1e-2})()
    assert decide.parent_check(Out(), RELU_TASK, opts, job, [], {})[0] == "cheat"
    io.close()
    judge.close()

    calls = iter(range(10))
    judge = TrialJudge(_args(), 1 << 30, 16 << 20)  # right once, then wrong on new inputs
    io = _worker(judge, lambda x: torch.relu(x) if next(calls) == 0 else torch.relu(x) + 1.0)
    ok, why, _ = judge.check(io.report()["trial_report"], None)
    assert not ok and why.startswith("trial 2, checked by the verifier itself"), why
    io.close()
    judge.close()

    judge = TrialJudge(_args(), 1 << 30, 16 << 20)  # writes nothing: fails its first trial
    io = _worker(judge, lambda x: torch.zeros_like(x))
    ok, why, _ = judge.check(io.report()["trial_report"], None)
    assert not ok and why.startswith("trial 1, checked by the verifier itself"), why
    Out.referee = staticmethod(lambda op, args: (ok, why))
    assert decide.parent_check(Out(), RELU_TASK, opts, job, [], {})[0] == "incorrect"
    io.close()
    judge.close()
