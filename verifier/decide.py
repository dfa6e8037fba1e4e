"""The parent's own judgement of a run: the candidate's raw outputs against references computed
here, in the verifier process, which never runs candidate code.

The sandboxed worker makes each trial's inputs from a seed the parent chose fresh for this run
(`input_seed`), and writes the candidate's raw outputs to `outputs.pt`; its own result (outcome,
nonce, statistics) can be forged by code running in its process (frames, `gc`, patched harness
functions), so it is never enough: a run is correct only when the parent, regenerating the same
inputs from the same seeds, gets matching reference outputs. Reference models are built once per
(task, seed) and kept.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
_MODELS: dict[tuple[str, int], tuple[Any, Any]] = {}


def _reference(task_source: str, seed: int) -> tuple[Any, Any]:
    """(Model instance, get_inputs) for the task, built under `seed` as the worker builds it."""
    import torch

    key = (task_source, seed)
    with _LOCK:
        if key not in _MODELS:
            ns: dict[str, Any] = {"__name__": "ks_reference"}
            exec(compile(task_source, "reference.py", "exec"), ns)
            init = ns["get_init_inputs"]()
            torch.manual_seed(seed)
            model = ns["Model"](*init).eval()
            _MODELS[key] = (model, ns["get_inputs"])
            if len(_MODELS) > 64:
                _MODELS.pop(next(iter(_MODELS)))
        return _MODELS[key]


def load_outputs(path: Path) -> list[Any] | None:
    """The raw outputs a worker wrote (tensors and plain containers only), or None."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # missing, truncated or not a weights-only file: no outputs
        return None
    return data if isinstance(data, list) else None


def recheck(task_source: str, seed: int, input_seed: int, trials: int, outputs: list[Any] | None,
            tol: tuple[float, float, float, float]) -> tuple[bool, str]:
    """(ok, why not): every trial's output matches the parent's reference on its inputs."""
    import torch

    from verifier.worker import _judge, exact_fp32

    if outputs is None:
        return False, "the worker left no raw outputs (its result was not written by the harness)"
    if len(outputs) != trials:
        return False, f"the worker returned {len(outputs)} trial outputs, expected {trials}"
    model, get_inputs = _reference(task_source, seed)
    exact_fp32()
    with _LOCK, torch.no_grad():
        for t, out in enumerate(outputs):
            torch.manual_seed(input_seed + 1000 + t)
            inputs = list(get_inputs())
            ref_out = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            verdict, msg, _, _ = _judge(model, inputs, ref_out, out, tol)
            if verdict != "ok":
                return False, f"trial {t + 1}, checked by the verifier itself: {msg}"
    return True, ""
