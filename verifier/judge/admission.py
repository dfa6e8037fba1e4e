"""Memory admission: from a task's probed footprint, how a run fits its device, or that it does
not (no torch here; the numbers come from the judge that probed them, `verifier.judge.trial_judge`).

A run holds, on one device: the worker (the reference's and the candidate's models and one
forward's workspace, its output included: the trials' inputs and slots are the judge's arena, and
the worker compares nothing), the judge (the reference, a regenerated pristine set, one forward,
the comparison's chunks (a stepped trial's publish draws that one set, its seal's fingerprint
holds two int64 temporaries of a chunk: `verifier.judge.trial_judge`), and, where room is left, the fp64 second opinion's copy of the model
and its two outputs; in a window's check, its copies of the checked calls' slots; while it fills
a window, its drawn copies of the sets), the trials' arena (each trial's inputs and output slot,
and the generalisation variants'), and the timed windows' arena (at least one input set and
its slot). The trials' input sets, the comparison's chunk, the arenas' sizes and whether the
fp64 second opinion runs are chosen so that the sum stays under what the device has free; a
task whose one-trial run does not fit gets `does_not_fit` with these figures, never a death of
the worker or the judge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verifier.judge.window_judge import RANDOM_CHECKS

CHUNK_MAX = 1 << 24  # elements a comparison chunk holds at most (`verifier.judge.device_compare`)
CHUNK_MIN = 1 << 16
CHUNK_TEMPS = 10  # fp64 temporaries a chunk of the comparison holds at once (8 bytes each)
SLACK_BYTES = 512 << 20  # allocator rounding and fragmentation, the kernels' own scratch
SLACK_SHARE = 0.05


@dataclass
class Footprint:
    """What a task's run holds, in bytes, as the judge measured it on the device."""

    params: int  # the reference's parameters and buffers
    inputs: int  # one input set
    output: int  # one output
    workspace: int  # one reference forward's peak beyond its parameters and inputs
    variants: list[tuple[int, int]] = field(default_factory=list)  # (inputs, output) each

    def describe(self) -> str:
        """The footprint in words, for a verdict."""
        gib = 1 << 30
        return (f"parameters {self.params / gib:.2f} GiB, an input set {self.inputs / gib:.2f} "
                f"GiB, an output {self.output / gib:.2f} GiB, a forward's workspace "
                f"{self.workspace / gib:.2f} GiB")


@dataclass
class Admission:
    """How a run uses its device (`fits` False: it cannot, and `why`)."""

    fits: bool
    why: str = ""
    trial_sets: int = 0  # trials held in the arena (fewer than asked only where room is short)
    chunk: int = CHUNK_MAX
    trial_arena_bytes: int = 0
    window_budget: int = 0  # the timed windows' arena (`verifier.judge.window_judge` budget)
    fp64: bool = True  # whether the fp64 second opinion has room
    need_bytes: int = 0  # the whole run at these choices
    jobs_per_device: int = 1  # runs of this footprint the free memory would hold side by side


def worker_bytes(fp: Footprint) -> int:
    """The candidate's process: two models (the reference's, for its init and baselines, and
    the candidate's) and one forward's workspace, its output included: a trial's output is
    dropped once it is in its slot (`verifier.run.worker._judged_trials`); the trials' inputs, and
    the kernel profile's and the last call's, are the arena's; the judge, not the worker, holds
    the references and pristine copies."""
    return 2 * fp.params + fp.workspace


def judge_bytes(fp: Footprint, chunk: int, checks: int = 1) -> int:
    """The judge's checks: its reference, one forward and the comparison's chunk temporaries,
    and the larger of a trial's regenerated input set and a window's check (its reference's
    clone of a set and its copies of the `checks` checked calls' slots, `verifier.judge.window_judge`:
    no more than the window's calls)."""
    window = fp.inputs + checks * fp.output
    return fp.params + fp.workspace + CHUNK_TEMPS * 8 * chunk + max(fp.inputs, window)


def window_checks(fp: Footprint, window_bytes: int) -> int:
    """How many calls a window's check clones: the last and RANDOM_CHECKS more, at most the
    input sets the windows' arena holds (`verifier.judge.window_judge.sets_for`)."""
    sets = max(1, window_bytes // max(2 * fp.inputs + fp.output, 1))
    return int(min(RANDOM_CHECKS + 1, sets))


def fp64_bytes(fp: Footprint) -> int:
    """The fp64 second opinion: the model and its inputs in fp64 (twice: exact and rounded),
    two fp64 outputs and their forwards' workspace."""
    return 2 * fp.params + 4 * fp.inputs + 4 * fp.output + 4 * fp.workspace


def window_min_bytes(fp: Footprint) -> int:
    """The timed windows' arena with one input set: the set and the call's slot (the judge's
    drawn copy of the set lives only while it fills, when none of its checks' memory is held:
    `judge_bytes` covers it; `verifier.judge.window_judge.WindowJudge.fill`)."""
    return fp.inputs + fp.output


def admit(fp: Footprint, free: int, trials: int, variant_trials: int,
          window_max: int) -> Admission:
    """The run's shape on a device with `free` bytes: as many of the `trials` as fit (at least
    one), each variant's `variant_trials`, the largest chunk and windows' arena left, the fp64
    second opinion where it still fits; `fits` False with the figures when one trial does not."""
    chunk = CHUNK_MAX
    slack = SLACK_BYTES + int(SLACK_SHARE * free)
    variants = variant_trials * sum(i + o for i, o in fp.variants)
    per_trial = fp.inputs + fp.output
    while True:
        fixed = worker_bytes(fp) + judge_bytes(fp, chunk) + window_min_bytes(fp) + variants
        room = free - slack - fixed
        if room >= per_trial or chunk <= CHUNK_MIN:
            break
        chunk //= 2
    if room < per_trial:
        need = fixed + per_trial + slack
        return Admission(False, why=(
            f"the task needs about {need / (1 << 30):.2f} GiB of device memory for one trial "
            f"(worker, judge, arenas), {free / (1 << 30):.2f} GiB are free: "
            f"{fp.describe()}"), need_bytes=need, jobs_per_device=0)
    sets = max(1, min(trials, room // max(per_trial, 1)))
    left = room - sets * per_trial
    window = window_min_bytes(fp) + max(0, min(window_max - window_min_bytes(fp), left // 2))
    # a window of more sets has the judge clone more checked slots: shrink it until they fit
    while True:
        more = (window_checks(fp, window) - 1) * fp.output
        if window <= window_min_bytes(fp) or window - window_min_bytes(fp) + more <= left:
            break
        window = max(window_min_bytes(fp), window - (2 * fp.inputs + fp.output))
    grown = window - window_min_bytes(fp) + (window_checks(fp, window) - 1) * fp.output
    left -= grown
    fp64 = left >= fp64_bytes(fp)
    need = fixed + sets * per_trial + grown + slack
    return Admission(True, trial_sets=int(sets), chunk=chunk,
                     trial_arena_bytes=sets * per_trial + variants, window_budget=int(window),
                     fp64=fp64, need_bytes=need, jobs_per_device=max(1, free // max(need, 1)))


def windows_left(trials: Any) -> int:
    """The timed windows' arena budget a job's trials' admission left (the trials' judge here,
    or the referee's reply with its admission as a dict)."""
    a = trials.admission
    return int(a["window_budget"] if isinstance(a, dict) else a.window_budget)
