"""The parent's own judgement of a run: the candidate's raw outputs against references computed
here, in the verifier process, which never runs candidate code.

The sandboxed worker makes each trial's inputs from a seed the parent chose fresh for this run
(`input_seed`), and writes the candidate's raw outputs to `outputs.pt`; its own result (outcome,
nonce, statistics) can be forged by code running in its process (frames, `gc`, patched harness
functions), so it is never enough: a run is correct only when the parent, regenerating the same
inputs from the same seeds, gets matching reference outputs. Reference models are built once per
(task, seed) and kept.

References are computed on `DEVICE`: the parent's cpu for the sandboxed children (cpu, musa),
whose raw outputs come back in `outputs.pt`. A persistent (GPU) worker's trials never come back:
they are judged where they are, in the judge's arena (`verifier.judge.trial_judge`, in a trusted
referee process on the same GPU that sets DEVICE, `verifier.judge.referee`), which builds its
references with `reference` and draws its inputs with `make_inputs` from here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from verifier.judge.construct import DEVICE as DEVICE_CONTEXT
from verifier.judge.construct import build_checked
from verifier.judge.generalize import VARIANT_TRIALS
from verifier.judge.tensors import exact_fp32, to_device

LOCK = threading.Lock()  # held around every use of a cached reference model (judges share them)
_MODELS: dict[tuple[str, int, str], tuple[Any, Any]] = {}
DEVICE = "cpu"  # where references run (a referee process sets its GPU)


def make_inputs(get_inputs: Any, seed: int) -> list[Any]:
    """The task's inputs under `seed`, drawn on DEVICE as the worker draws them."""
    from verifier.judge.inputs import draw_inputs

    return draw_inputs(get_inputs, seed, DEVICE)


def on_device(out: Any) -> Any:
    """A worker's output (moved to the cpu by the worker) on DEVICE, next to the reference."""
    return out if DEVICE == "cpu" else to_device(out, DEVICE)


def reference(task_source: str, seed: int, construct: str = DEVICE_CONTEXT) -> tuple[Any, Any]:
    """(Model instance, get_inputs) for the task, built under `seed` by the run's construction
    method as the worker builds it (`verifier.judge.construct`: HostOnly when the device
    context cannot build it)."""
    key = (task_source, seed, construct)
    with LOCK:
        if key not in _MODELS:
            ns: dict[str, Any] = {"__name__": "ks_reference"}
            exec(compile(task_source, "reference.py", "exec"), ns)
            init = ns["get_init_inputs"]()
            model = build_checked(ns["Model"], init, seed, DEVICE, construct)
            _MODELS[key] = (model, ns["get_inputs"])
            if len(_MODELS) > 64:
                _MODELS.pop(next(iter(_MODELS)))
        return _MODELS[key]


def keep_only(sources: set[str]) -> None:
    """Drop the cached reference models of every other task source (on a GPU their memory is
    given back: a job's memory admission must not depend on the tasks judged before it)."""
    with LOCK:
        for key in [k for k in _MODELS if k[0] not in sources]:
            del _MODELS[key]
    if DEVICE != "cpu":
        import gc

        import torch

        gc.collect()  # a model in a reference cycle is freed only by a collection
        getattr(torch, torch.device(DEVICE).type).empty_cache()


def load_outputs(path: Path) -> list[Any] | None:
    """The raw outputs a worker wrote (tensors and plain containers only), or None."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # missing, truncated or not a weights-only file: no outputs
        return None
    return data if isinstance(data, list) else None


def recheck(task_source: str, seed: int, input_seed: int, trials: int, outputs: list[Any] | None,
            tol: tuple[float, float, float, float], construct: str = DEVICE_CONTEXT
            ) -> tuple[bool, str]:
    """(ok, why not): every trial's output matches the parent's reference on its inputs."""
    import torch

    from verifier.judge.device_compare import judge

    if outputs is None:
        return False, "the worker left no raw outputs (its result was not written by the harness)"
    if len(outputs) != trials:
        return False, f"the worker returned {len(outputs)} trial outputs, expected {trials}"
    model, get_inputs = reference(task_source, seed, construct)
    exact_fp32()
    with LOCK, torch.no_grad():
        for t, out in enumerate(outputs):
            inputs = make_inputs(get_inputs, input_seed + 1000 + t)
            ref_out = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            verdict, msg, _, _ = judge(model, inputs, ref_out, on_device(out), tol)
            if verdict != "ok":
                return False, f"trial {t + 1}, checked by the verifier itself: {msg}"
    return True, ""


def recheck_variants(variants: list[dict], checked: Any, outputs: list[Any] | None, seed: int,
                     input_seed: int, tol: tuple[float, float, float, float],
                     construct: str = DEVICE_CONTEXT) -> tuple[bool, str]:
    """(ok, why not): the parent's own comparison of the worker's variant outputs."""
    if not variants:
        return True, ""
    if not (isinstance(checked, list) and len(checked) == len(variants)):
        return False, "the worker did not report the generalisation check"
    want = VARIANT_TRIALS * sum(1 for c in checked if c is True)
    if outputs is None or len(outputs) != want:
        return False, (f"the worker returned {0 if outputs is None else len(outputs)} variant "
                       f"outputs, expected {want}")
    start = 0
    for variant, done in zip(variants, checked, strict=True):
        if done is not True:
            try:  # a skip is believed only when the reference fails here too
                import torch

                model, get_inputs = reference(variant["source"], seed, construct)
                with torch.no_grad():
                    model(*make_inputs(get_inputs, input_seed + 1000))
            except Exception:  # noqa: BLE001 - the reference cannot run there: a real skip
                continue
            return False, f"the worker skipped the {variant['label']} variant, which builds"
        ok, why = recheck(variant["source"], seed, input_seed, VARIANT_TRIALS,
                          outputs[start:start + VARIANT_TRIALS], tol, construct)
        if not ok:
            return False, f"{variant['label']} variant: {why}"
        start += VARIANT_TRIALS
    return True, ""


def check_run(task_source: str, seed: int, input_seed: int, trials: int,
              tol: tuple[float, float, float, float], variants: list[dict], variants_checked: Any,
              outputs: list[Any] | None, construct: str = DEVICE_CONTEXT) -> tuple[bool, str]:
    """(ok, why not): the trials' outputs, then the generalisation variants' (the rest)."""
    ok, why = recheck(task_source, seed, input_seed, trials,
                      None if outputs is None else outputs[:trials], tol, construct)
    if ok:
        ok, why = recheck_variants(variants, variants_checked,
                                   None if outputs is None else outputs[trials:], seed,
                                   input_seed, tol, construct)
    return ok, why


CACHED_RESULT = "the output did not change with new inputs (cached result)"


def parent_check(out: Any, task_source: str, opts: Any, job: dict[str, Any],
                 variants: list[dict], payload: dict[str, Any]) -> tuple[str, str]:
    """The parent's judgement of a run the worker called ok: ("ok" | "cheat" | "runtime_error",
    why). Here on the cpu, or by the run's referee process (`out.referee`) on its GPU."""
    args = {"task_source": task_source, "seed": opts.seed, "input_seed": job["input_seed"],
            "trials": max(1, opts.trials), "variants": variants,
            "tol": (opts.atol_fp32, opts.rtol_fp32, opts.atol_low, opts.rtol_low),
            "variants_checked": payload.get("variants_checked"),
            "construct": job["options"].get("construct", DEVICE_CONTEXT)}
    try:
        ok, why = (out.referee("run", args) if out.referee is not None
                   else check_run(outputs=out.outputs, **args))
    except RuntimeError as exc:  # the referee itself failed: not the candidate's doing
        return "runtime_error", f"the verifier's referee failed: {exc}"
    if ok:
        return "ok", ""
    if CACHED_RESULT in why:  # the judge saw an earlier call's output returned for new inputs
        return "cheat", why
    if getattr(out, "judge_compared", False):  # the worker never compared: no claim was false
        return "incorrect", why
    return "cheat", "the worker reported success, but " + why
