"""Red-team attacks that got through on an H100 (benchmarks/results/redteam_cuda.md, issue 22),
run through the persistent GPU worker's code (`verifier.run.gpu_worker`, `verifier.run.gpu_pool`,
`GpuRunner`) with the cpu backend: the parent judges the raw outputs itself, the worker's host
memory, disk total and output are bounded, as on the sandboxed cpu path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_observer import honest_held, judge, make_context, run_suite  # noqa: E402

PERSISTENT_CASES = ("patch_compare", "rlimit_raise", "multi_file_size", "stdout_flood")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    ctx = make_context(tmp_path_factory.mktemp("redteam-persistent") / "rt")
    ctx["persistent"] = True
    return run_suite(ctx, only=set(PERSISTENT_CASES), daemon_wait_s=0.5), ctx


@pytest.mark.slow  # three verifier processes, each with its worker: about a minute
@pytest.mark.parametrize("name", PERSISTENT_CASES)
def test_attack_held_in_the_persistent_worker(suite: tuple[dict, dict], name: str) -> None:
    r, ctx = suite
    held, why = judge(name, r, ctx)
    assert held, f"{name}: {why}"


@pytest.mark.slow
def test_honest_candidates_correct_in_the_persistent_worker(suite: tuple[dict, dict]) -> None:
    held, why = honest_held(suite[0])
    assert held, why
    assert not suite[0]["hangs"], suite[0]["hangs"]


@pytest.mark.slow
def test_the_parent_caught_what_the_patched_worker_passed(suite: tuple[dict, dict]) -> None:
    """patch_compare makes every comparison in the worker say ok: the persistent worker
    compares nothing any more (its trials' outputs go into the judge's arena slots), so the
    judge's own comparison decides, and the wrong answer is `incorrect`."""
    v = suite[0]["verdicts"]
    assert v["patch_compare"]["status"] == "incorrect", v["patch_compare"]
    assert "checked by the verifier itself" in v["patch_compare"]["error"], v["patch_compare"]
    assert v["stdout_flood"]["status"] == "runtime_error", v["stdout_flood"]
    assert "flooded stdout" in v["stdout_flood"]["error"], v["stdout_flood"]
    assert "No space left" in v["multi_file_size"]["error"], v["multi_file_size"]
