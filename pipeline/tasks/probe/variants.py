"""The task's other size sets and constructor arguments, checked by the probe before they are kept.

`verifier.judge.variants.derive` proposes them (module-level sizes at 3/4, else at 1/2; constructor
floats at 1.25x); `validate` runs in the sandboxed probe worker and keeps, per kind, the first
proposal whose reference still runs (else those of its changes the reference accepts alone):
the CPU file's on the CPU with the probe's validity checks (deterministic, finite,
input-dependent output), the GPU file's on the meta device (shapes only).
The Task keeps the kept variants' changes in `meta["variants"]` per file (`cpu`, `gpu`); the
verify stage rebuilds their sources and hands them to the verifier's generalisation check.
"""

from __future__ import annotations

import json

from schemas import Task
from verifier.judge.variants import apply_changes, derive, single_change


def _runs_cpu(source: str) -> str:
    """"" when the reference runs at this variant on the CPU and passes the validity checks."""
    from pipeline.tasks.probe.inputs import build_model
    from pipeline.tasks.probe.measure import check_validity
    from pipeline.tasks.probe.runtime import ProbeReject, exec_source, load_torch, short_error

    torch = load_torch()
    try:
        ns = exec_source(source)
        model = build_model(ns, list(ns["get_init_inputs"]()))
        torch.manual_seed(1)
        inputs = list(ns["get_inputs"]())
        check_validity(model, inputs, lambda: list(ns["get_inputs"]()))
    except ProbeReject as rej:
        return f"{rej.args[0]}: {rej.args[1]}"
    except BaseException as exc:  # noqa: BLE001 - any failure is a reason to drop the variant
        return short_error(exc)
    return ""


def _runs_meta(source: str) -> str:
    """"" when the reference builds and runs at this variant on the meta device."""
    from pipeline.tasks.probe.inputs import build_model
    from pipeline.tasks.probe.runtime import exec_source, load_torch, short_error

    torch = load_torch()
    try:
        ns = exec_source(source)
        model = build_model(ns, list(ns["get_init_inputs"]()), "meta")
        with torch.device("meta"), torch.no_grad():
            model(*ns["get_inputs"]())
    except BaseException as exc:  # noqa: BLE001
        return short_error(exc)
    return ""


def _subset(source: str, first: dict, check) -> list[dict]:
    """The last resort when every whole proposal fails: the first proposal's changes that the
    reference accepts one at a time, together (a model whose hidden size lives in a config
    object still gets another batch and sequence length)."""
    if len(first["changes"]) < 2:
        return []
    fine = {name: change for name, change in first["changes"].items()
            if not check(single_change(source, name, change[1]))}
    if not fine or len(fine) == len(first["changes"]):
        return []
    return [{"label": first["label"], "source": apply_changes(source, fine), "changes": fine}]


def validate(sources: dict[str, str]) -> dict:
    """Probe job `variants`: {file: [{label, changes}]} of the kept variants, and why the others
    were dropped ({file: [reason]})."""
    kept: dict[str, list[dict]] = {}
    dropped: dict[str, list[str]] = {}
    for key, source in sources.items():
        check = _runs_cpu if key == "cpu" else _runs_meta
        kept[key] = []
        for group in derive(source):
            for variant in group + _subset(source, group[0], check):
                why = check(variant["source"])
                if not why:
                    kept[key].append({"label": variant["label"], "changes": variant["changes"]})
                    break
                dropped.setdefault(key, []).append(f"{variant['label']}: {why}"[:300])
    return {"ok": True, "variants": kept, "dropped": dropped}


def job_for(task: Task, timeout_s: float) -> dict:
    """The probe job that validates a task's variants (both files; one when they are equal)."""
    sources = {"gpu": task.source}
    if task.cpu_source and task.cpu_source != task.source:
        sources["cpu"] = task.cpu_source
    return {"kind": "variants", "sources": sources, "timeout_s": timeout_s}


def with_variants(task: Task, result: dict) -> Task:
    """The task with the probe's kept variants (and drop reasons) in its meta."""
    meta = json.loads(task.meta or "{}")
    if result.get("ok"):
        kept = result.get("variants", {})
        if "cpu" not in kept and "gpu" in kept:
            kept = {**kept, "cpu": kept["gpu"]}  # one file for both
        meta["variants"] = kept
        if result.get("dropped"):
            meta["variants_dropped"] = result["dropped"]
    else:
        meta["variants"] = {"cpu": [], "gpu": []}
        meta["variants_dropped"] = {"probe": [f"{result.get('reason')}: {result.get('detail')}"]}
    task.meta = json.dumps(meta, default=str)
    return task


def task_variants(task: Task, backend: str) -> list[dict] | None:
    """The validated variants of the file the verifier runs for `backend` ({label, source,
    changes}); None for a task probed before variants existed (the verifier derives its own)."""
    try:
        meta = json.loads(task.meta or "{}")
    except json.JSONDecodeError:
        return None
    per_file = meta.get("variants") if isinstance(meta, dict) else None
    if not isinstance(per_file, dict):
        return None
    source = (task.cpu_source or task.source) if backend == "cpu" else task.source
    out = []
    for v in per_file.get("cpu" if backend == "cpu" else "gpu", []):
        try:
            out.append({**v, "source": apply_changes(source, v["changes"])})
        except (ValueError, SyntaxError, KeyError):
            continue  # the file changed since the probe: that variant cannot be rebuilt
    return out
