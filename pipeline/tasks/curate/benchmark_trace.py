"""Child side of benchmark fingerprinting: the aten op sequence and input shapes of task files.

Runs sandboxed (`pipeline.tasks.curate.kernelbench_index` starts it) with torch + stdlib only
(transformers too for a file that loads a pretrained checkpoint). Reads one
JSON line per file (`{"name", "source"}`) and answers one JSON line each. Every file is run in a
forked child with a timeout, so a file that hangs or crashes costs only itself. The forward is
traced on meta tensors (any size, no memory); where a meta kernel is missing, on CPU with the
module's integer size constants shrunk. A file that loads a pretrained checkpoint (KernelBench
level 4) gets an offline stand-in of the same architecture (`pipeline.tasks.curate.pretrained_standins`)
and, on CPU, keeps its sequence length (attention code paths depend on it): only the batch shrinks.
"""

from __future__ import annotations

import ast
import json
import os
import select
import signal
import sys
import traceback

from verifier import pyast

_SMALL = 8  # module-level size constants above this are shrunk for the CPU fallback


def _recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        """aten op names without overload, in first-use order (as `Task.op_inventory`)."""

        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            name = str(func.overloadpacket).replace("aten::", "aten.")
            if name.startswith("aten.") and name not in self.ops:
                self.ops.append(name)
            return func(*args, **(kwargs or {}))

    return OpRecorder()


def _int_constants(source: str) -> dict[str, int]:
    out = {}
    for node in pyast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and type(node.value.value) is int:
            out.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return out


def _run(ns: dict, device: str) -> dict:
    import torch

    init = list(ns["get_init_inputs"]())
    torch.manual_seed(0)
    with torch.device(device):
        model = ns["Model"](*init).eval()
        inputs = list(ns["get_inputs"]())
        rec = _recorder()
        with torch.no_grad(), rec:
            model(*inputs)
    shapes = [list(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
    return {"ops": rec.ops, "shapes": shapes}


def trace_file(name: str, source: str) -> dict:
    """{"ops", "shapes", "trace"}: on meta first, else on CPU at small sizes."""
    if "from_pretrained" not in source:
        return _trace(name, source, pretrained=False)
    from pipeline.tasks.curate.pretrained_standins import UnknownCheckpoint, offline_pretrained

    try:
        with offline_pretrained() as used:
            out = _trace(name, source, pretrained=True)
    except UnknownCheckpoint as exc:
        return {"ops": [], "shapes": [], "trace": f"none: {exc}"}
    except ImportError as exc:  # the stand-ins need transformers
        return {"ops": [], "shapes": [], "trace": f"none: loads a checkpoint; {exc}"[:200]}
    if used and not out["trace"].startswith("none"):
        out["trace"] += f" (stand-in: {used[0]} from config, random weights)"
    return out


def _trace(name: str, source: str, pretrained: bool) -> dict:
    ns = {"__name__": "kernelsynth_benchmark", "__file__": name}
    try:
        exec(compile(source, name, "exec"), ns)
        if not callable(ns.get("Model")) or not callable(ns.get("get_inputs")):
            return {"ops": [], "shapes": [], "trace": "none: no Model/get_inputs"}
    except BaseException as exc:  # noqa: BLE001 - a file that cannot load is untraced, not fatal
        return {"ops": [], "shapes": [], "trace": f"none: {type(exc).__name__}: {exc}"[:200]}
    try:
        return {**_run(ns, "meta"), "trace": "meta"}
    except BaseException:  # noqa: BLE001 - a missing meta kernel: try small real tensors
        pass
    meta_shapes: list = []
    try:
        import torch

        with torch.device("meta"):
            meta_shapes = [list(x.shape) for x in ns["get_inputs"]()
                           if isinstance(x, torch.Tensor)]
    except BaseException:  # noqa: BLE001 - shapes are optional
        meta_shapes = []
    ns.update({k: min(v, _SMALL) for k, v in _int_constants(source).items()
               if v > _SMALL and (not pretrained or "batch" in k)})
    try:
        res = _run(ns, "cpu")
        return {"ops": res["ops"], "shapes": meta_shapes or res["shapes"], "trace": "cpu-small"}
    except BaseException as exc:  # noqa: BLE001
        return {"ops": [], "shapes": meta_shapes,
                "trace": f"none: {type(exc).__name__}: {exc}"[:200]}


def _in_child(job: dict, timeout_s: float) -> dict:
    """Trace one file in a forked child; a hang or crash is reported, not inherited."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            out = trace_file(job["name"], job["source"])
        except BaseException:  # noqa: BLE001
            out = {"ops": [], "shapes": [], "trace": "none: " + traceback.format_exc(limit=1)}
        os.write(wfd, json.dumps(out).encode())
        os._exit(0)
    os.close(wfd)
    chunks: list[bytes] = []
    ready, _, _ = select.select([rfd], [], [], timeout_s)
    if ready:
        while chunk := os.read(rfd, 1 << 16):
            chunks.append(chunk)
    os.close(rfd)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        why = "timeout" if not ready else f"crash (status {status})"
        return {"ops": [], "shapes": [], "trace": f"none: {why}"}
    return json.loads(b"".join(chunks))


def main() -> None:
    import torch  # noqa: F401 - imported once, before the forks

    timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    for line in sys.stdin:
        if line.strip():
            job = json.loads(line)
            print(json.dumps({"name": job["name"], **_in_child(job, timeout_s)}), flush=True)


if __name__ == "__main__":
    main()
