"""The CPU templates give the wider bug kinds real sites: an elementwise kernel's rounded-up
chunk count (grid_rounding) and a broadcast operand's per-dimension index (broadcast_stride);
through the real CPU verifier each mutant fails and the template passes, at the task's sizes and
at the other sizes the generalisation check runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.candidates.mutate import mutate_code
from pipeline.candidates.templates import TaskView, template_kernels
from pipeline.candidates.templates.analysis import trace_sources
from pipeline.tasks.probe.variants import validate
from sources.seed import SEED_DIR
from verifier.api import verify_batch
from verifier.judge.variants import apply_changes, rewrite_literals, shrink
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
# x * scale.view(1, -1, 1, 1): the scale is broadcast over batch, height and width
TASK = rewrite_literals((SEED_DIR / "broadcast_channel_scale.py").read_text(encoding="utf-8"),
                        lambda v: shrink(v, 16), lambda f: f)
KINDS = ("grid_rounding", "broadcast_stride")


@pytest.fixture(scope="module")
def template() -> str:
    trace_sources([TASK], timeout_s=600)
    return template_kernels(TaskView("scale", "scale", TASK, TASK), "cpu", 1)[0].code


def test_elementwise_template_has_grid_rounding_and_broadcast_sites(template: str) -> None:
    grid = mutate_code(template, "grid_rounding", "cpu")
    assert grid is not None
    assert "chunks = (n + chunk - 1) / chunk;" in grid.before
    assert "chunks = n / chunk;" in grid.after
    bcast = mutate_code(template, "broadcast_stride", "cpu")
    assert bcast is not None
    # the scale is read by the channel index i1; the mutant reads it by the height index i2
    assert "in1[i1 * 1]" in bcast.before and "in1[i2 * 1]" in bcast.after
    assert "broadcast along the wrong dimension" in bcast.description


@pytest.mark.slow
def test_template_mutants_fail_and_the_template_passes(template: str) -> None:
    kept = validate({"cpu": TASK})["variants"]["cpu"]
    variants = [{**v, "source": apply_changes(TASK, v["changes"])} for v in kept]
    programs = {"template": template}
    for kind in KINDS:
        m = mutate_code(template, kind, "cpu")
        assert m is not None, kind
        programs[kind] = m.code
    opts = VerifyOptions(backend="cpu", generalize=True, build_cache_dir=str(CACHE),
                         perf_trials=3, perf_max_trials=3, perf_budget_s=0.2)
    verdicts = {v.candidate_id: v for v in verify_batch(
        [VerifyRequest(k, "t", TASK, code, "cpu", variants) for k, code in programs.items()],
        opts)}
    ok = verdicts["template"]
    assert ok.status in CORRECT_STATUSES, (ok.status, ok.error, ok.feedback)
    for kind in KINDS:
        assert verdicts[kind].status == "incorrect", (kind, verdicts[kind].status)
