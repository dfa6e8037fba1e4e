"""The generalisation check: a candidate correct at the task's sizes must also be correct at other
sizes and other constructor arguments (`verifier.judge.variants`), or it has hard-coded one of them.

Worker side (`check_variants`): after the task's own trials, each variant task is built, the
candidate's `ModelNew` is built with the variant's constructor arguments and compared with the
variant reference on VARIANT_TRIALS seeded inputs. A failure is `incorrect`; the feedback names
the variant's changes and, by trying each change alone, the ones the kernel does not follow.
Parent side (`verifier.judge.decide.recheck_variants`): the worker's claims are not believed; its raw variant outputs
are compared with references computed in the parent, and a variant it calls skipped (the
reference fails there) must fail in the parent too.
"""

from __future__ import annotations

from typing import Any

from verifier.judge.construct import DEVICE, HOST_ONLY, HostOnly, build_checked
from verifier.judge.variants import describe, first_of_each, single_change
from verifier.protocol import VerifyOptions, VerifyRequest

VARIANT_TRIALS = 2
MAX_SINGLE = 8  # changes tried one at a time to say which one the kernel hard-codes

_WORDS = {"sizes": "another size set", "init": "other constructor arguments",
          "args": "another axis argument"}
_HINTS = {"sizes": "read sizes from the input tensors (x.size(i), x.numel()) and pass them to "
                   "the kernel as arguments",
          "init": "keep constructor values on the module in __init__ and pass them to the kernel "
                  "as arguments",
          "args": "keep the axis on the module (self.dim) and derive the kernel's layout (the "
                  "sizes before, along and after that axis) from it at run time, not from the "
                  "axis the task was written with"}


def run_variant(source: str, cand_ns: dict[str, Any], backend: Any, seed: int, input_seed: int,
                trials: int, tol: tuple[float, float, float, float], io: Any = None,
                block: int = 0, construct: str = DEVICE) -> tuple[str, str, list[Any]]:
    """(outcome, message, raw outputs) of the candidate against one variant task; outcome is ok,
    task_error (the reference fails there), incorrect, runtime_error, cheat or HOST_ONLY (its
    ModelNew builds only on the host: `verifier.judge.construct`). With `io`
    (`verifier.judge.trial_io`), the inputs of trial t come from its `block` and the outputs go there
    (the raw list stays empty)."""
    import torch

    from verifier.judge.device_compare import judge as _judge
    from verifier.judge.failure import candidate_traceback
    from verifier.judge.inputs import draw_inputs
    from verifier.judge.tensors import clone

    device = backend.device()
    ns: dict[str, Any] = {"__name__": "ks_reference"}
    try:
        exec(compile(source, "reference.py", "exec"), ns)
        init = ns["get_init_inputs"]()
        ref = build_checked(ns["Model"], init, seed, device, construct)
    except Exception as exc:  # the variant is the task's fault, not the candidate's
        return "task_error", f"{type(exc).__name__}: {exc}", []
    try:
        new = build_checked(cand_ns["ModelNew"], init, seed, device, construct)
        ref_sd, new_sd = ref.state_dict(), new.state_dict()
        if ref_sd and list(ref_sd) == list(new_sd) and all(
                ref_sd[k].shape == new_sd[k].shape for k in ref_sd):
            new.load_state_dict(ref_sd)
    except HostOnly as exc:  # the whole run is made again the host's way
        return HOST_ONLY, f"ModelNew(...) {exc}", []
    except Exception as exc:
        return "runtime_error", "ModelNew(...) raised " + candidate_traceback(exc)[0], []
    raw: list[Any] = []
    for t in range(trials):
        given = io.inputs(block, t) if io is not None else None
        try:
            if given is not None:
                inputs = given
            else:
                inputs = draw_inputs(ns["get_inputs"], input_seed + 1000 + t, device)
            with torch.no_grad():
                ref_out = ref(*clone(inputs))
        except Exception as exc:
            return "task_error", f"{type(exc).__name__}: {exc}", raw
        try:
            with torch.no_grad():
                new_out = new(*clone(inputs))
            backend.synchronize()
        except Exception as exc:
            return "runtime_error", candidate_traceback(exc)[0], raw
        verdict, msg, _, _ = _judge(ref, inputs, ref_out, new_out, tol)
        if verdict != "ok":
            return ("cheat" if verdict == "cheat" else "incorrect"), f"trial {t + 1}: {msg}", raw
        if io is not None:
            io.keep(block, t, new_out)
        else:
            raw.append(clone(new_out))  # on its device, as the trials' (`verifier.run.worker`)
    return "ok", "", raw


def _culprits(task_src: str, variant: dict, run: Any) -> list[str]:
    """The changes that break the candidate on their own (others moved alone pass)."""
    bad = []
    for name, (_, new) in list(variant["changes"].items())[:MAX_SINGLE]:
        outcome, _, _ = run(single_change(task_src, name, new), 1)
        if outcome not in ("ok", "task_error"):
            bad.append(name)
    return bad


def feedback(variant: dict, message: str, culprits: list[str]) -> str:
    """What failed, at which changed sizes or constructor values, and what to do instead."""
    label = variant["label"]
    text = (f"generalisation check: correct at the task's sizes, but not at "
            f"{_WORDS.get(label, label)} ({describe(variant)}): {message}.")
    what = {"sizes": "a size", "args": "an axis argument"}.get(label, "a constructor value")
    if culprits:
        names = ", ".join(f"{n} ({variant['changes'][n][0]})" for n in culprits)
        text += f" The kernel hard-codes {names}"
    else:
        text += f" The kernel hard-codes {what} (it fails only when these change together)"
    return text + f": {_HINTS.get(label, _HINTS['sizes'])}."


def check_variants(res: Any, job: dict[str, Any], task_src: str, cand_ns: dict[str, Any],
                   backend: Any, tol: tuple[float, float, float, float], io: Any) -> None:
    """Run the job's variants; finish `incorrect` at the first one the candidate fails. The
    outputs of the variants it passes go to `io` (`verifier.judge.trial_io`), in order, for the
    parent's (or its judge's) own comparison."""
    opts = job["options"]
    seed, input_seed = int(opts.get("seed", 0)), int(job.get("input_seed", 0))
    construct = str(opts.get("construct") or DEVICE)
    checked = []
    for i, variant in enumerate(job.get("variants") or []):
        def run(src: str, trials: int) -> tuple[str, str, list[Any]]:
            return run_variant(src, cand_ns, backend, seed, input_seed, trials, tol,
                               construct=construct)

        if io.skipped(i + 1):  # the judge's reference fails there: it checks nothing
            outcome, msg = "task_error", "the verifier's reference cannot run it"
        else:
            outcome, msg, _ = run_variant(variant["source"], cand_ns, backend, seed, input_seed,
                                          VARIANT_TRIALS, tol, io, i + 1, construct)
        if outcome == HOST_ONLY:
            res.finish(HOST_ONLY, f"{variant['label']} variant: {msg}")
        if outcome == "task_error":
            checked.append(False)
            res.finding("variant_skipped", f"the {variant['label']} variant ({describe(variant)}) "
                        f"was not checked: the reference fails there ({msg})", severity="warning")
            continue
        if outcome != "ok":
            res.data["variants_checked"] = checked
            res.finding("generalisation", f"{variant['label']}: {describe(variant)}: {msg}")
            res.finish("cheat" if outcome == "cheat" else "incorrect",
                       feedback(variant, msg, _culprits(task_src, variant, run)))
        checked.append(True)
    res.data["variants_checked"] = checked


def request_variants(req: VerifyRequest, opts: VerifyOptions) -> list[dict[str, Any]]:
    """The variants to check: none unless `opts.generalize`; the request's own (validated by the
    task probe) or, when it brings none, one per kind derived from the task source."""
    if not opts.generalize:
        return []
    if req.variants is not None:
        return list(req.variants)
    return first_of_each(req.task_source)


def record_generalisation(v: Any, variants: list[dict[str, Any]], checked: Any) -> None:
    """An `info` finding `generalised` naming the variants the candidate passed, so a dataset
    row can show its generalisation check (a candidate with none has no such finding)."""
    if not variants or not isinstance(checked, list):
        return
    done = [describe(x) for x, c in zip(variants, checked, strict=False) if c is True]
    if done:
        v.findings.append({"rule": "generalised", "severity": "info", "line": None,
                           "message": "also correct at " + "; ".join(done)})
