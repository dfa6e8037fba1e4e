"""Where a run's trial inputs come from and where its outputs go (the worker's side of
`verifier.judge.trial_judge`), and the judge's reading of what the worker said it put there.

`ArenaTrials` (the persistent GPU worker, and its cpu loop): the judge wrote every trial's
inputs into an arena this process maps; the candidate runs on those views (an input it mutates
is seen by the judge), and each output is copied into the trial's slot on the device. Its plain
values (ints, floats, None beside the tensors) are not bytes: they go into the small
`trial_report`. `SeededTrials` (a sandboxed child, whose parent compares `outputs.pt`,
`verifier.judge.decide`): the worker draws the inputs from the parent's seeds and keeps the raw
outputs. Blocks: 0 the task's trials, 1.. the generalisation variants'.
"""

from __future__ import annotations

from typing import Any

MAX_VALUES = 4096  # plain values one output may carry in the report
_PLAIN = (type(None), bool, int, float, str)


class SlotMismatch(ValueError):
    """An output that does not fit the reference's slot (structure, shape, dtype, type)."""


def put(slot: Any, out: Any, values: list[Any]) -> None:
    """Copy `out`'s tensors into the views `slot` (the reference output's layout), its plain
    values appended to `values`; SlotMismatch where `out` does not have the slot's form."""
    import torch

    if isinstance(slot, torch.Tensor):
        if type(out) is not torch.Tensor:  # a subclass could defer work to the copy
            raise SlotMismatch(f"a {type(out).__name__} where a plain tensor goes")
        if out.shape != slot.shape or out.dtype != slot.dtype:
            raise SlotMismatch(f"a {out.dtype} tensor of shape {list(out.shape)}, the slot is "
                               f"{slot.dtype} {list(slot.shape)}")
        slot.copy_(out)
    elif isinstance(slot, list | tuple):
        if type(out) not in (list, tuple) or len(out) != len(slot):
            raise SlotMismatch(f"a {type(out).__name__} where a {len(slot)}-item sequence goes")
        for s, o in zip(slot, out, strict=True):
            put(s, o, values)
    else:
        if type(out) not in _PLAIN:
            raise SlotMismatch(f"a {type(out).__name__} where a plain value goes")
        values.append(out)


def tensors_only(layout: Any) -> bool:
    """Whether an output of this arena layout (`verifier.judge.arena.plan`) holds tensors only:
    no plain value the worker reports at the end."""
    kind, value = next(iter(layout.items()))
    if kind in ("t", "v"):
        return kind == "t"
    return all(tensors_only(v) for v in value)


def rebuild(slot: Any, values: Any) -> Any:
    """The candidate's output as the judge sees it: the slot's tensors, and the plain values
    the worker reported in the places the reference has them; ValueError when they differ in
    number or are not plain."""
    import torch

    if not isinstance(values, list) or not all(type(v) in _PLAIN for v in values):
        raise ValueError("its plain values are not a list of plain values")
    left = list(values)

    def walk(s: Any) -> Any:
        if isinstance(s, torch.Tensor):
            return s
        if isinstance(s, list | tuple):
            return type(s)(walk(x) for x in s)
        if not left:
            raise ValueError("fewer plain values than the reference's output has")
        return left.pop(0)

    out = walk(slot)
    if left:
        raise ValueError("more plain values than the reference's output has")
    return out


REPORT_WORD = "the worker's trial report"  # a failure of the report's form: `on_word`


def on_word(why: str) -> bool:
    """Whether a trials' failure rests on the form of the worker's report alone, not on a slot
    the judge compared (`verifier.judge.trial_judge.TrialJudge._unreported`): the worker's word,
    made again in a fresh worker after earlier jobs (`verifier.run.outcome.judged_failure`)."""
    return why.startswith(REPORT_WORD)


def values_of_report(report: Any, blocks: int) -> list[list[Any]]:
    """Per block, per trial: the plain values a worker reported (None: no output kept)."""
    if not isinstance(report, dict) or not isinstance(report.get("values"), list):
        raise ValueError("no trial report")
    values = report["values"]
    if len(values) != blocks or not all(isinstance(b, list) for b in values):
        raise ValueError(f"{len(values)} blocks of trials, expected {blocks}")
    return values


class SeededTrials:
    """Inputs drawn in the worker from the parent's seeds; raw outputs kept for `outputs.pt`."""

    shared = False

    def __init__(self) -> None:
        self.raw: list[Any] = []

    def inputs(self, block: int, t: int) -> list[Any] | None:
        return None  # the caller draws them

    def skipped(self, block: int) -> bool:
        return False

    def keep(self, block: int, t: int, out: Any) -> None:
        from verifier.judge.tensors import clone

        self.raw.append(clone(out))  # kept on its device: the parent's copy is made once

    def report(self) -> dict[str, Any]:
        return {"raw_outputs": self.raw}

    def early(self, checked: Any) -> bytes:  # the parent compares the raw outputs at the end
        return b""

    def close(self) -> None:
        self.raw = []


class ArenaTrials:
    """The judge's trial inputs and output slots, in an arena this process maps."""

    shared = True

    def __init__(self, spec: dict[str, Any], handle: str | int, device: str,
                 paced: bool = False) -> None:
        from verifier.judge.arena import Arena

        self.arena = Arena.attach(handle, int(spec["nbytes"]), device)
        self.paced = paced  # the judge times each trial (`verifier.judge.trial_pace`)
        self.blocks = spec["blocks"]
        self.values: list[list[Any]] = [[] for _ in self.blocks]
        # the task's trials: more than its sets where the judge reuses them (a paced trial t on
        # set t mod sets, its slot checked at its "q": `verifier.judge.trial_reuse`)
        self.task_trials = max(int(spec.get("trials") or 0), len(self.blocks[0] or []))

    def _case(self, block: int, t: int) -> dict[str, Any] | None:
        cases = self.blocks[block] if block < len(self.blocks) else None
        if block == 0 and cases and t < self.task_trials:
            t %= len(cases)
        return cases[t] if cases is not None and t < len(cases) else None

    def trials(self) -> int:
        return self.task_trials if self.blocks[0] else 0

    def inputs(self, block: int, t: int) -> list[Any] | None:
        """Trial `t` of `block`'s inputs, views of the arena (None: the judge made none)."""
        from verifier.judge.arena import views

        case = self._case(block, t)
        return None if case is None else list(views(self.arena, case["inputs"]))

    def skipped(self, block: int) -> bool:
        """The judge could not run this variant's reference: the worker skips it too."""
        return block < len(self.blocks) and self.blocks[block] is None

    def keep(self, block: int, t: int, out: Any) -> None:
        """`out` into trial `t`'s slot; its plain values into the report (None when it does
        not fit the slot: the judge reads that as no output)."""
        from verifier.judge.arena import views

        case = self._case(block, t)
        values: list[Any] | None = []
        try:
            if case is None:
                raise SlotMismatch("no slot")
            put(views(self.arena, case["out"]), out, values)
            if len(values) > MAX_VALUES:
                raise SlotMismatch("too many plain values")
        except SlotMismatch:
            values = None
        self.values[block].append(values)

    def report(self) -> dict[str, Any]:
        """The plain values, once every copy into the slots has landed."""
        if self.arena.device != "cpu":
            import torch

            getattr(torch, self.arena.device.split(":")[0]).synchronize()
        return {"trial_report": {"values": self.values}}

    def early(self, checked: Any) -> bytes:
        """The report the judge checks the trials by before any timed window (sent with the
        clock's "t", `verifier.judge.trial_pace.trials_checked`): the plain values and
        `variants_checked`, as the run's result line would carry them."""
        import json

        return json.dumps({**self.report(), "variants_checked": checked}).encode()

    def close(self) -> None:
        self.arena.close()


def for_job(job: dict[str, Any], device: str) -> SeededTrials | ArenaTrials:
    """The job's trials: in the judge's arena where the job has one, else seeded."""
    spec = job.get("trials_arena")
    if not spec:
        return SeededTrials()
    # a judge's windows: its clock reads the pipes, and times the trials too
    return ArenaTrials(spec, spec.get("path") or job["trials_fd"], device, bool(job.get("arena")))
