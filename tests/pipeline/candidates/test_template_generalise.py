"""The multi-head attention and max_pool1d templates generalise: built at one size set, the
real verifier (cpu backend, generalisation check on) finds them correct at other sizes, at a
head count that changes head_dim, and at a pooled length that is not the traced one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.candidates.templates import TaskView, template_kernels
from pipeline.candidates.templates.analysis import trace_sources
from sources.seed import seed_files
from verifier.api import verify_batch
from verifier.judge.variants import first_of_each, rewrite_literals, shrink, single_change
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"

# (seed task, a change the proportional size set cannot make: head_dim 8 -> 16, and a length
# whose pooled size (301 - 4) // 2 + 1 = 149 is no traced size)
CASES = {"attention_multi_head_self_attention": ("num_heads", 4),
         "pooling_max_pool1d": ("length", 301)}


def _small(name: str) -> str:
    path = next(p for p in seed_files() if p.stem == name)
    return rewrite_literals(path.read_text(encoding="utf-8"), lambda v: shrink(v, 16),
                            lambda f: f)


@pytest.fixture(scope="module")
def verdicts() -> dict:
    sources = {name: _small(name) for name in CASES}
    trace_sources(list(sources.values()), timeout_s=600)
    reqs = []
    for name, src in sources.items():
        code = template_kernels(TaskView(name, name, src, src), "cpu", 1)[0].code
        key, value = CASES[name]
        old = int(re.search(rf"^{key} = (\d+)$", src, re.M).group(1))
        variants = [*first_of_each(src), {"label": "sizes", "source": single_change(src, key, value),
                                          "changes": {key: [old, value]}}]
        reqs.append(VerifyRequest(name, name, src, code, "cpu", variants))
    opts = VerifyOptions(backend="cpu", generalize=True, build_cache_dir=str(CACHE),
                         perf_trials=3, perf_max_trials=3, perf_budget_s=0.2)
    return {v.candidate_id: v for v in verify_batch(reqs, opts)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_template_is_correct_at_other_sizes(verdicts, name) -> None:
    v = verdicts[name]
    assert v.status in CORRECT_STATUSES, (v.status, v.error, v.feedback)
    passed = [f for f in v.findings if f["rule"] == "generalised"]
    key, value = CASES[name]
    assert passed and f"{key} " in passed[0]["message"] and f"-> {value}" in passed[0]["message"]
    assert not [f for f in v.findings if f["rule"] == "variant_skipped"], v.findings
