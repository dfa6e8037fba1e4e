"""The judge's side of the correctness trials: fresh inputs in an arena the worker maps, each
trial's output slot beside them, and the comparison on the device.

Made per job by the trusted judge (the referee on a GPU, `verifier.judge.referee`; the verifier
process for the persistent worker's cpu loop), which never runs candidate code. It builds the
task's reference (and each generalisation variant's), measures the run's footprint
(`verifier.judge.admission`: too big is `DoesNotFit`), draws every trial's inputs from the parent's
seed into the arena (`verifier.judge.arena`) and poisons the output slots. The worker runs the
candidate on those inputs and copies each output into its slot (`verifier.judge.trial_io`), and says
which plain values (ints, floats, None) the outputs held. `check` then regenerates each trial's
pristine inputs from the seed, compares them with the arena's (input mutation), computes the
reference output and compares the slot with it in chunks (`verifier.judge.device_compare`): nothing
of output size leaves the device, and the answer is a few figures. Only torch and the stdlib.

Stepped trials (`args["stepped"]`, paced by the clock: `verifier.judge.trial_pace`): the trial
inputs are the judge's poison at first; the clock calls `publish(t)` at trial t's "p" and
`seal(t)` at its "q": no trial can compute a later one's output, and what the worker writes into
a slot after its "q" does not count. How `seal` keeps the
slot, within what admission counts: a cpu judge reads it into its own copy of the arena (its
private memory, already counted as the arena: nothing more is held) and `check` pulls no sealed
slot again; a device arena has no private copy, and a clone of every trial's slot kept to the
end would be `trials` outputs beyond admission's count (a GB-sized task has no room), so the
device judge keeps a keyed fingerprint of the slot's bytes (`fingerprint`, a secret key of this
judge) and `check` fails a slot that no longer has it (comparing at each "q" instead would need
the plain values the worker reports only at the end). The fingerprint holds nothing of output
size: two int64 temporaries of a chunk, within the comparison's (`admission.CHUNK_TEMPS`); a
device's `publish` draws the set again from its seed, the judge's one regenerated set
(`admission.judge_bytes`). A cpu judge draws the sets when it is made and only writes each into
the file at its "p": no torch between the trials (a torch op there can leave the verifier's
thread pool spinning beside the worker's next trial, which the clock times). A paced job has
at least `trial_pace.PACED_TRIALS` trials (fewer leave the clock no figure): where admission
holds fewer sets (a GB-sized task), paced trial t runs on set t mod sets, its inputs drawn at
its "p" and its slot poisoned again, and a trial whose set a later one reuses is checked at its
"q" (`_check_now`; an output of tensors only: no plain value to wait for).
The variants' trials are not paced (their inputs are published with the arena).
"""

from __future__ import annotations

import secrets
from typing import Any

from verifier.judge import decide, trial_pace
from verifier.judge.admission import Admission, Footprint, admit
from verifier.judge.arena import Arena, fill, plan, shift, views
from verifier.judge.construct import DEVICE
from verifier.judge.fingerprint import fingerprint
from verifier.judge.tensors import clone, same, varies
from verifier.judge.trial_io import REPORT_WORD, tensors_only

POISON = 0xFF  # slot bytes before the worker writes: NaN in every float type


class DoesNotFit(RuntimeError):
    """The task's run cannot fit the device's free memory (the message has the footprint)."""


def _bytes(obj: Any) -> int:
    return plan(obj)[1]


def _params(model: Any) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


class _Block:
    """The task, or one variant: its reference, and the seeds and places of its trials."""

    def __init__(self, source: str, seed: int, input_seed: int, label: str = "",
                 construct: str = DEVICE) -> None:
        import torch

        self.label = label
        self.model, self.get_inputs = decide.reference(source, seed, construct)
        self.seeds: list[int] = []
        self.cases: list[dict[str, Any]] = []
        self.spans: list[tuple[int, int, int]] = []  # each case's inputs [lo, mid), slot to hi
        with decide.LOCK, torch.no_grad():
            self.sample = decide.make_inputs(self.get_inputs, input_seed + 1000)
            copy = clone(self.sample)
            base = _memory()
            _reset_peak()
            out = self.model(*copy)
        self.workspace = max(_peak() - base, _bytes(out))  # its output and its scratch
        del copy
        self.out_layout, self.out_bytes = plan(out)
        self.in_layout, self.in_bytes = plan(self.sample)


def _memory() -> int:
    import torch

    return torch.cuda.memory_allocated() if decide.DEVICE.startswith("cuda") else 0


def _reset_peak() -> None:
    import torch

    if decide.DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak() -> int:
    import torch

    return torch.cuda.max_memory_allocated() if decide.DEVICE.startswith("cuda") else 0


def free_bytes(cpu_free: int) -> int:
    """What the judge's device has free (the cpu loop: `cpu_free`, its host budget)."""
    import torch

    if decide.DEVICE.startswith("cuda"):  # the blocks this process's allocator keeps (the
        torch.cuda.empty_cache()  # reference forward it just probed) are free for the worker
        return int(torch.cuda.mem_get_info()[0])
    return cpu_free


class TrialJudge:
    """A job's trials: their inputs and output slots in an arena, and their check."""

    def __init__(self, args: dict[str, Any], free: int, window_max: int) -> None:
        """`free`: the host budget of a cpu judge (on a GPU, what the device has free)."""
        from verifier.judge.generalize import VARIANT_TRIALS

        seed, self.input_seed = int(args["seed"]), int(args["input_seed"])
        self.stepped = bool(args.get("stepped"))  # each trial published at its "p", sealed at "q"
        self._key = secrets.randbits(62)  # the fingerprints' key: unknown to the worker
        self.seals: dict[int, int | None] = {}  # trial -> its slot's fingerprint at its "q"
        self.fingerprints = decide.DEVICE != "cpu"  # a device arena has no copy to keep it in
        self.tol = tuple(args["tol"])
        decide.keep_only({args["task_source"], *(v["source"] for v in args.get("variants") or [])})
        construct = str(args.get("construct") or DEVICE)  # the run's (`verifier.judge.construct`)
        self.main = _Block(args["task_source"], seed, self.input_seed, "", construct)
        self.variants: list[_Block | None] = []
        for v in args.get("variants") or []:
            try:  # a variant whose reference fails here is skipped (the worker must skip it)
                self.variants.append(_Block(v["source"], seed, self.input_seed, v["label"],
                                            construct))
            except Exception as exc:  # noqa: BLE001 - the variant's reference fails: a skip,
                if "out of memory" in str(exc).lower():  # unless it is only out of room
                    raise
                self.variants.append(None)
        blocks = [b for b in self.variants if b is not None]
        self.footprint = Footprint(
            params=_params(self.main.model), inputs=self.main.in_bytes,
            output=self.main.out_bytes, workspace=self.main.workspace,
            variants=[(b.in_bytes, b.out_bytes) for b in blocks])
        if decide.DEVICE.startswith("cuda"):  # now, with what the footprint counts held
            free = (free_bytes(free) + self.footprint.params
                    + sum(b.in_bytes for b in [self.main, *blocks]))  # samples: into the arena
        trials = max(1, int(args["trials"]))  # paced: enough for the clock's figure
        trials = max(trials, trial_pace.PACED_TRIALS) if self.stepped else trials
        self.admission: Admission = admit(self.footprint, free, trials, VARIANT_TRIALS,
                                          window_max)
        if not self.admission.fits:
            raise DoesNotFit(self.admission.why)
        self._place(VARIANT_TRIALS)
        sets = self.admission.trial_sets  # a stepped job's trials past them reuse them
        least, reusable = trial_pace.PACED_TRIALS, tensors_only(self.main.out_layout)
        self.paced = least if self.stepped and sets < least and reusable else sets  # no more
        self.in_slot = list(range(sets))  # the trial each set holds (its seed: `main.seeds`)
        self.early, self.early_worst = "", {}  # type: str, dict[str, float]
        self.spec = {"nbytes": self.arena.nbytes, "trials": self.paced,
                     "blocks": [[{"inputs": c["inputs"], "out": c["out"]} for c in b.cases]
                                if b is not None else None
                                for b in [self.main, *self.variants]]}

    def _place(self, variant_trials: int) -> None:
        """Lay out every case's inputs and slot, make the arena, draw the inputs into it."""
        end = 0
        todo = [(self.main, self.admission.trial_sets)]
        todo += [(b, variant_trials) for b in self.variants if b is not None]
        for block, n in todo:
            for t in range(n):
                lo = end
                inputs, end = plan(block.sample, end)
                out, end = shift(block.out_layout, end), end + block.out_bytes
                block.spans.append((lo, end - block.out_bytes, end))
                block.seeds.append(self.input_seed + 1000 + t)
                block.cases.append({"inputs": inputs, "out": out})
        self.arena = Arena.create(end, decide.DEVICE)
        self.arena.base.fill_(POISON)
        # stepped, the task's trials are published at their "p" (`publish`): a device's drawn
        # then; a cpu judge's drawn now into its own copy, only written to the file then
        later = self.stepped and self.arena.device != "cpu"
        for block, _ in sorted(todo, key=lambda item: item[0] is self.main):  # the main last
            if block is self.main and self.stepped:  # the file holds the poison there
                self.arena.push(0, self.arena.nbytes)
            for k, case in zip(block.seeds, block.cases, strict=True):
                if not (later and block is self.main):
                    drawn = block.sample if k == self.input_seed + 1000 else self._draw(block, k)
                    fill(views(self.arena, case["inputs"]), drawn)
            block.sample = None
        if decide.DEVICE.startswith("cuda"):  # the samples' blocks: free for the worker and
            import torch  # the windows' arena, not kept by this process's allocator

            torch.cuda.empty_cache()
        if not self.stepped:
            self.arena.push(0, self.arena.nbytes)
        _synchronize()

    def _draw(self, block: _Block, k: int) -> list[Any]:
        with decide.LOCK:
            return decide.make_inputs(block.get_inputs, k)

    def publish(self, t: int) -> None:
        """Trial t's inputs into the arena now (a stepped job's, at its "p"), ready before the
        clock's "g": a cpu judge writes its copy's span into the file (no torch here: the
        verifier's thread pool would spin beside the worker's trial); a device's draws the set
        again from its seed (one set held while it is written) and synchronizes."""
        if not (self.stepped and 0 <= t < self.paced):
            raise ValueError(f"no paced trial {t + 1} in this job")
        if t >= len(self.main.cases):
            self._publish_again(t)
            return
        if self.arena.device != "cpu":
            drawn = self._draw(self.main, self.main.seeds[t])
            fill(views(self.arena, self.main.cases[t]["inputs"]), drawn)
            del drawn
        self.arena.push(*self.main.spans[t][:2])
        _synchronize()

    def seal(self, t: int) -> None:
        """Trial t's slot read now (at its "q"): a cpu judge's copy of it is what `check`
        compares (it pulls no sealed slot again); a device's fingerprint is what the slot must
        still have at the check (`fingerprints`)."""
        if not (self.stepped and 0 <= t < self.paced) or t in self.seals:
            raise ValueError(f"trial {t + 1} sealed twice or not paced in this job")
        sets = len(self.main.cases)
        if t + sets < self.paced:  # its set is reused by a later trial: its check is now
            self._check_now(t)
            return
        _, lo, hi = self.main.spans[t % sets]
        self.arena.pull(lo, hi)
        self.seals[t] = (fingerprint(self.arena.base[lo:hi], self._key + t, self.admission.chunk)
                         if self.fingerprints else None)

    def _publish_again(self, t: int) -> None:
        """A paced trial past the arena's sets (`paced`): its inputs drawn into set t mod sets
        (whose last trial was checked at its "q", `_check_now`) and its slot poisoned again."""
        s = t % len(self.main.cases)
        lo, mid, hi = self.main.spans[s]
        self.main.seeds[s], self.in_slot[s] = self.input_seed + 1000 + t, t
        drawn = self._draw(self.main, self.main.seeds[s])
        fill(views(self.arena, self.main.cases[s]["inputs"]), drawn)
        del drawn
        self.arena.base[mid:hi].fill_(POISON)
        self.arena.push(lo, hi)
        _synchronize()

    def _check_now(self, t: int) -> None:
        """Paced trial t, whose set a later trial reuses, checked at its "q" as `check` checks
        the others; the first failure is the trials' (`check` answers it). A cpu judge then
        lets its thread pool go quiet (~5-10 ms of spin) before the clock times the next."""
        import time

        s, self.seals[t] = t % len(self.main.cases), None
        if self.early:
            return
        self.arena.pull(*self.main.spans[s][::2])
        why = self._check_case(self.main, self.main.seeds[s], self.main.cases[s], [],
                               self.early_worst)
        if why:
            self.early = f"trial {t + 1}, checked by the verifier itself: {why}"
        if self.arena.device == "cpu":
            time.sleep(0.02)

    def _pull(self) -> None:
        """The file's bytes into a cpu judge's copy for the check: all, but a sealed slot (read
        at its trial's "q", `seal`) where no fingerprint stands for it."""
        if not self.stepped or self.fingerprints:
            self.arena.pull(0, self.arena.nbytes)
            return
        for lo, mid, _ in self.main.spans:
            self.arena.pull(lo, mid)
        self.arena.pull(self.main.spans[-1][2], self.arena.nbytes)

    def _sealed(self, c: int) -> str:
        """Why set c's slot is not what it was at its last trial's "q" ("" when it is, or
        unstepped)."""
        if not self.stepped:
            return ""
        t = self.in_slot[c]
        if t not in self.seals:
            return "the trial was not paced by the verifier's clock"
        if self.seals[t] is None:  # the judge's copy, read then
            return ""
        _, lo, hi = self.main.spans[c]
        now = fingerprint(self.arena.base[lo:hi], self._key + t, self.admission.chunk)
        if now != self.seals[t]:
            return ("its output slot changed after the trial ended (the verifier read it at "
                    "the trial's end: what is written later does not count)")
        return ""

    def check(self, report: Any, checked: Any) -> tuple[bool, str, dict[str, float]]:
        """(ok, why not, the worst statistics over the task's trials) of a run whose worker
        said ok; `report` its `trial_report` (the plain values of each output), `checked` its
        `variants_checked`."""
        from verifier.judge.trial_io import values_of_report

        try:
            self._pull()
        except OSError as exc:
            return False, f"the trials' arena is unreadable: {exc}", {}
        if self.early:  # a trial whose set was reused, checked at its "q" (`_check_now`)
            return False, self.early, dict(self.early_worst)
        worst: dict[str, float] = dict(self.early_worst)
        try:
            values = values_of_report(report, len(self.variants) + 1)
            main = values[0]
            if self.paced > len(self.main.cases):  # the sets' last trials (others: checked)
                if not isinstance(main, list) or len(main) != self.paced:
                    raise ValueError(f"not its {self.paced} paced trials' outputs")
                main = [main[t] for t in self.in_slot]
            if len(main) != len(self.main.cases):
                raise ValueError(f"{len(main)} trial outputs, expected {len(self.main.cases)}")
        except ValueError as exc:
            return False, self._unreported(f"{REPORT_WORD}: {exc}", worst), worst
        ok, why = self._check_block(self.main, main, "", worst)
        if ok:
            ok, why = self._check_variants(values[1:], checked)
        return ok, why, worst

    def _unreported(self, why: str, worst: dict[str, float]) -> str:
        """A report that fails its form: where the outputs are tensors only (no plain value it
        must give), a slot that fails the comparison is the judge's own answer (it stands); else
        `why`, the worker's word (`on_word`: an earlier job's code may have garbled it)."""
        if not tensors_only(self.main.out_layout):
            return why
        ok, slots = self._check_block(self.main, [[]] * len(self.main.cases), "", worst)
        return why if ok else slots

    def _check_variants(self, values: list[Any], checked: Any) -> tuple[bool, str]:
        if not self.variants:
            return True, ""
        if not (isinstance(checked, list) and len(checked) == len(self.variants)):
            return False, "the worker did not report the generalisation check"
        for block, done, vals in zip(self.variants, checked, values, strict=True):
            if block is None:
                if done is True:
                    return False, "the worker checked a variant the verifier's reference cannot run"
                continue
            if done is not True:
                return False, f"the worker skipped the {block.label} variant, which builds"
            ok, why = self._check_block(block, vals, f"{block.label} variant: ", {})
            if not ok:
                return False, why
        return True, ""

    def _check_block(self, block: _Block, values: list[Any], prefix: str,
                     worst: dict[str, float]) -> tuple[bool, str]:
        if len(values) != len(block.cases):
            return False, (f"{prefix}the worker returned {len(values)} trial outputs, expected "
                           f"{len(block.cases)}")
        for t, (k, case, vals) in enumerate(zip(block.seeds, block.cases, values, strict=True)):
            why = self._sealed(t) if block is self.main else ""
            if why:
                return False, f"{prefix}trial {t + 1}, checked by the verifier itself: {why}"
            why = self._check_case(block, k, case, vals, worst)
            if why and self._repeats(block, values, t):  # every earlier trial passed
                return False, (f"{prefix}{decide.CACHED_RESULT}: trial {t + 1}'s output is an "
                               "earlier trial's, bit for bit, on other inputs")
            if why:
                return False, f"{prefix}trial {t + 1}, checked by the verifier itself: {why}"
        return True, ""

    def _repeats(self, block: _Block, values: list[Any], t: int) -> bool:
        """Trial t's output equal to an earlier trial's, which passed on its own inputs: a
        result kept from an earlier call (a kernel that writes nothing fails its first trial; a
        constant output is no evidence: `tensors.varies`)."""
        from verifier.judge.trial_io import rebuild

        try:
            now = rebuild(views(self.arena, block.cases[t]["out"]), values[t])
            return varies(now) and any(same(now, rebuild(views(self.arena, block.cases[e]["out"]), values[e]))
                       for e in range(t))
        except (ValueError, TypeError):  # a malformed report: the trial's own failure stands
            return False

    def _check_case(self, block: _Block, k: int, case: dict[str, Any], vals: Any,
                    worst: dict[str, float]) -> str:
        """Why trial `k` of `block` fails ("" when it passes)."""
        import torch

        from verifier.judge.device_compare import judge
        from verifier.judge.trial_io import rebuild

        if vals is None:
            return "the worker left no output in the verifier's slot"
        def again() -> list[Any]:  # the pristine inputs made again (no copy kept)
            return decide.make_inputs(block.get_inputs, k)

        with decide.LOCK, torch.no_grad():
            pristine = again()
            if not same(views(self.arena, case["inputs"]), pristine):
                return "forward modified its input tensors"
            try:
                new = rebuild(views(self.arena, case["out"]), vals)
            except ValueError as exc:
                return f"the worker's output does not fit the reference's: {exc}"
            ref_out = block.model(*pristine)  # its own draw: a reference may mutate it
            del pristine
            verdict, msg, stats, _ = judge(block.model, again, ref_out, new, self.tol,
                                           self.admission.chunk, self.admission.fp64)
        for key, v in stats.items():
            worst[key] = max(worst.get(key, 0.0), v)
        return "" if verdict == "ok" else msg

    def close(self) -> None:
        self.main = None  # type: ignore[assignment]
        self.variants = []
        self.arena.close()


def _synchronize() -> None:
    import torch

    if decide.DEVICE.startswith("cuda"):
        torch.cuda.synchronize()
