"""Shape facts of a KernelBench reference: its constructor arguments, input and output shapes
and every dim any tensor it makes has, from one forward on the meta device (a dispatch mode
records each op's outputs). The rows audit and the row-size test check row text against them.

torch + stdlib only and self-contained: `benchmarks.rows_audit` runs this file as a script in
the verifier's sandbox (reads `sources.json`, a list of sources; writes `result.json`).
"""

from __future__ import annotations

import json
from pathlib import Path


def facts(source: str) -> dict:
    """{ok, init (JSON values), inputs, outputs (shapes), dims (sorted)} of one reference;
    raises what building or running it raises."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    dims: set[int] = set()

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, tuple | list) else [out]):
                if isinstance(t, torch.Tensor):
                    dims.update(int(d) for d in t.shape)
            return out

    ns: dict = {"__name__": "ks_reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    init = ns["get_init_inputs"]()
    with torch.device("meta"):
        model = ns["Model"](*init)
        inputs = ns["get_inputs"]()
        for p in list(model.parameters()) + list(model.buffers()):
            dims.update(int(d) for d in p.shape)
        with torch.no_grad(), Shapes():
            out = model(*inputs)
    outs = out if isinstance(out, tuple | list) else [out]
    in_shapes = [[int(d) for d in x.shape] for x in inputs if isinstance(x, torch.Tensor)]
    for s in in_shapes:
        dims.update(s)
    return {"ok": True, "init": json.loads(json.dumps(init, default=str)), "inputs": in_shapes,
            "outputs": [[int(d) for d in o.shape] for o in outs if isinstance(o, torch.Tensor)],
            "dims": sorted(dims)}


def main() -> None:
    sources = json.loads(Path("sources.json").read_text(encoding="utf-8"))
    out = []
    for src in sources:
        try:
            out.append(facts(src))
        except Exception as exc:  # noqa: BLE001 - reported per source, the audit counts it
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
    Path("result.json").write_text(json.dumps({"facts": out}), encoding="utf-8")


if __name__ == "__main__":
    main()
