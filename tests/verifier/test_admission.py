"""Memory admission (`verifier.judge.admission`): a run's shape from its footprint and free memory."""

from __future__ import annotations

from verifier.judge.admission import (
    CHUNK_MAX,
    SLACK_BYTES,
    Footprint,
    admit,
    fp64_bytes,
    judge_bytes,
    window_min_bytes,
    worker_bytes,
)

GIB = 1 << 30
# KernelBench's GELU at its main-branch size: 4096 x 393216 fp32, 6.4 GB in and out
GELU = Footprint(params=0, inputs=int(6.44e9), output=int(6.44e9), workspace=int(6.44e9))


def _fixed(fp: Footprint, chunk: int = CHUNK_MAX) -> int:
    return worker_bytes(fp) + judge_bytes(fp, chunk) + window_min_bytes(fp)


def test_a_small_task_gets_every_trial_fp64_and_the_full_window_arena() -> None:
    fp = Footprint(params=1 << 20, inputs=1 << 20, output=1 << 20, workspace=1 << 20)
    a = admit(fp, 70 * GIB, 5, 2, 8 * GIB)
    assert a.fits and a.trial_sets == 5 and a.fp64 and a.chunk == CHUNK_MAX
    assert a.window_budget == 8 * GIB and a.jobs_per_device >= 2
    assert a.need_bytes < 70 * GIB


def test_kernelbench_sized_tasks_get_fewer_trials_or_does_not_fit() -> None:
    # a 5 GiB-per-tensor elementwise task on an H100's free memory: fewer trials, no fp64
    four = Footprint(params=0, inputs=5 * GIB, output=5 * GIB, workspace=5 * GIB)
    free = 75 * GIB
    a = admit(four, free, 5, 0, 8 * GIB)
    assert a.fits, a.why
    assert 1 <= a.trial_sets < 5 and not a.fp64
    # everything it holds stays under what is free, the slack included
    assert a.need_bytes <= free
    per_trial = four.inputs + four.output
    assert _fixed(four, a.chunk) + a.trial_sets * per_trial + SLACK_BYTES <= free
    # GELU at 6.4 GB a tensor, KernelBench's own size: it fits an H100 (the worker holds no
    # reference and no pristine copies; a window of one set has the judge clone one slot and
    # draw its set again for the check), with two trials, and an H200 (139 GiB) with more
    h100 = admit(GELU, free, 5, 0, 8 * GIB)
    assert h100.fits and h100.trial_sets == 2 and h100.need_bytes <= free, h100.why
    # KernelBench's L1Norm (8 GiB a tensor) on an H100 too
    l1 = Footprint(params=0, inputs=8 * GIB, output=8 * GIB, workspace=8 * GIB)
    assert admit(l1, free, 5, 0, 8 * GIB).fits
    h200 = admit(GELU, 135 * GIB, 5, 0, 8 * GIB)
    assert h200.fits and h200.trial_sets > 2 and h200.need_bytes <= 135 * GIB
    # four times GELU (26 GB a tensor) fits neither, and says so with its footprint
    big = Footprint(params=0, inputs=4 * GELU.inputs, output=4 * GELU.output,
                    workspace=4 * GELU.workspace)
    assert not admit(big, free, 5, 0, 8 * GIB).fits
    assert "an output 23.99 GiB" in admit(big, 135 * GIB, 5, 0, 8 * GIB).why


def test_a_wider_window_reserves_the_judges_clones_of_its_checked_slots() -> None:
    fp = Footprint(params=0, inputs=GIB, output=GIB, workspace=GIB)
    a = admit(fp, 60 * GIB, 1, 0, 30 * GIB)
    assert a.fits and a.need_bytes <= 60 * GIB
    from verifier.judge.admission import window_checks

    assert window_checks(fp, a.window_budget) == 3  # the last and two drawn: two more clones


def test_room_for_fp64_is_granted_only_when_it_fits() -> None:
    fp = Footprint(params=0, inputs=GIB, output=GIB, workspace=GIB)
    base = _fixed(fp) + 2 * GIB + SLACK_BYTES
    tight = admit(fp, int((base + fp64_bytes(fp) // 2) / 0.95), 1, 0, 0)
    roomy = admit(fp, int((base + 2 * fp64_bytes(fp)) / 0.95), 1, 0, 0)
    assert tight.fits and not tight.fp64
    assert roomy.fits and roomy.fp64


def test_variants_count_and_a_task_that_cannot_fit_names_its_footprint() -> None:
    fp = Footprint(params=2 * GIB, inputs=GIB, output=GIB, workspace=GIB,
                   variants=[(4 * GIB, 4 * GIB)])
    a = admit(fp, 24 * GIB, 5, 2, 8 * GIB)
    assert not a.fits and a.jobs_per_device == 0
    assert "parameters 2.00 GiB" in a.why and "24.00 GiB are free" in a.why
    no_variants = admit(Footprint(params=2 * GIB, inputs=GIB, output=GIB, workspace=GIB),
                        24 * GIB, 5, 2, 8 * GIB)
    assert no_variants.fits


def test_the_chunk_shrinks_before_a_task_is_refused() -> None:
    fp = Footprint(params=0, inputs=GIB, output=GIB, workspace=GIB)
    full = _fixed(fp) + 2 * GIB
    a = admit(fp, int((full + SLACK_BYTES - (600 << 20)) / 0.95), 1, 0, 0)
    assert a.fits and a.chunk < CHUNK_MAX
