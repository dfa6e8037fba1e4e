"""NNSmith graphs as readable standalone PyTorch task files.

NNSmith 0.1.0 generates random, valid DNN graphs (`nnsmith.graph_gen`) and materializes them as a
`SymbolNet` interpreter; it has no source emitter, and torch.fx cannot trace SymbolNet. So we walk
the concrete graph IR ourselves and write one explicit torch call per instruction, with every
weight an `nn.Parameter` created in instruction order (seeded construction reproduces it).
Graphs are constrained to the configured dtypes and ranks, and the generator draws placeholder
shapes near `target_numel` elements, because NNSmith's defaults give tiny mixed-dtype graphs.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

from schemas import RawModule, Rejection
from sources.config import NNSmithConfig
from sources.nnsmith_emit import UnsupportedOp, emit_source

NNSMITH_REPO = "https://github.com/ise-uiuc/nnsmith"
_LOGGERS = ("dtest", "mgen", "smt", "core", "gen|torch", "exec", "fuzz")


# --- generation ----------------------------------------------------------------------------


def _quiet_nnsmith() -> None:
    # nnsmith warns at import that pygraphviz is missing; we never draw graphs
    warnings.filterwarnings("ignore", message="Install pygraphviz", category=UserWarning)
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def build_opset(cfg: NNSmithConfig) -> list[type]:
    """NNSmith's torch opset narrowed to ops whose every type combination stays in cfg.dtypes."""
    _quiet_nnsmith()
    from nnsmith.abstract.dtype import DType
    from nnsmith.materialize import Model
    from nnsmith.narrow_spec import auto_opset

    model_type = Model.init("torch")
    model_type.add_seed_setter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        opset = auto_opset(model_type, vulops=False)
    allowed = {DType.from_str(d) for d in cfg.dtypes}
    kept = []
    for op in opset:
        name = op.name()
        short = name.split(".")[-1]
        if cfg.include_ops and name not in cfg.include_ops and short not in cfg.include_ops:
            continue
        if name in cfg.exclude_ops or short in cfg.exclude_ops:
            continue
        # the two lists are not aligned pairwise: narrow each on its own
        ins = [t for t in op.in_dtypes if set(t) <= allowed]
        outs = [t for t in op.out_dtypes if set(t) <= allowed]
        if not ins or not outs:
            continue
        # auto_opset already rebinds these class attributes per process; we narrow them further
        op.in_dtypes = ins
        op.out_dtypes = outs
        kept.append(op)
    return kept


def _make_gen_class():
    from nnsmith.abstract.tensor import AbsTensor
    from nnsmith.gir import Placeholder
    from nnsmith.graph_gen import ConcolicGen

    class SizedConcolicGen(ConcolicGen):
        """Draws placeholder shapes whose element count lands near `target_numel`."""

        target_numel = 1 << 16

        def make_random_concrete_placeholder(self, rank, dtype=None):
            per_dim = self.target_numel ** (1.0 / max(1, rank))
            shape = [max(1, int(round(per_dim * random.uniform(0.5, 1.5)))) for _ in range(rank)]
            dtype = dtype if dtype is not None else self.random_dtype_gen()
            return Placeholder(AbsTensor(shape=shape, dtype=dtype))

    return SizedConcolicGen


@contextlib.contextmanager
def _deterministic_ids() -> Iterator[None]:
    """Number new IR instructions from a counter instead of id(): nnsmith falls back to memory
    addresses for instruction ids, which makes the same seed give different graphs."""
    import nnsmith.gir as gir

    original = gir.id_maker
    counter = itertools.count(1 << 32)

    def id_maker(fallback, irctx=None):
        if irctx is None:
            return next(counter)
        return original(fallback, irctx)

    gir.id_maker = id_maker
    try:
        yield
    finally:
        gir.id_maker = original


class GraphConstraintError(ValueError):
    """No graph within the configured ranks came out of nnsmith for this seed."""


def _within_ranks(ir, cfg: NNSmithConfig) -> bool:
    # nnsmith only applies rank_choices to the first placeholder; backward insertion can add
    # inputs of any rank an op asks for, so check every input and every intermediate
    inputs_ok = all(cfg.min_rank <= len(ir.vars[v].shape) <= cfg.max_rank
                    for v in ir.input_var())
    return inputs_ok and all(len(t.shape) <= cfg.max_rank for t in ir.vars.values())


def generate_graph(opset: list[type], cfg: NNSmithConfig, seed: int, tries: int = 8):
    """One concrete GraphIR from nnsmith, seeded, within cfg's ranks/dtypes/size.

    Raises GraphConstraintError when `tries` sub-seeds all leave the rank bounds.
    """
    from nnsmith.abstract.dtype import DType

    gen_cls = _make_gen_class()
    gen_cls.target_numel = cfg.target_numel
    ranks = list(range(cfg.min_rank, cfg.max_rank + 1))
    dtypes = [DType.from_str(d) for d in cfg.dtypes]
    for k in range(tries):
        sub_seed = seed * 31 + k
        random.seed(sub_seed)
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), _deterministic_ids():
            gen = gen_cls(opset, seed=sub_seed, init_fp=True, rank_choices=ranks,
                          dtype_choices=dtypes, max_elem_per_tensor=cfg.target_numel * 16)
            gen.abstract_gen(max_node_size=cfg.max_nodes, max_gen_millisec=5000)
            ir = gen.make_concrete()
        if _within_ranks(ir, cfg):
            return ir
    raise GraphConstraintError(f"seed {seed}: {tries} graphs all left ranks "
                               f"[{cfg.min_rank}, {cfg.max_rank}]")


def _check_runs(source: str) -> str | None:
    """Run the emitted file once on CPU; return a reason when it fails or is non-finite."""
    import torch

    ns: dict = {"__name__": "kernelsynth_nnsmith_check"}
    try:
        exec(compile(source, "<nnsmith>", "exec"), ns)  # our own generated code
        torch.manual_seed(0)
        model = ns["Model"]().eval()
        with torch.no_grad():
            out = model(*ns["get_inputs"]())
    except Exception as exc:  # noqa: BLE001 - any failure rejects this graph
        return f"emitted source raised {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    outs = out if isinstance(out, tuple) else (out,)
    for o in outs:
        if o.is_floating_point() and not bool(torch.isfinite(o).all()):
            return "emitted source gives non-finite outputs on randn inputs"
    return None


def generate_sources(cfg: NNSmithConfig, count: int, seed: int) -> Iterator[dict]:
    """In this process: `count` emitted graphs as dicts ({"source", "ops", ...} or
    {"reason", "detail"} for a skipped graph). Used by the child process of the iterator."""
    opset = build_opset(cfg)
    if not opset:
        yield {"ref": "nnsmith", "reason": "nnsmith_opset",
               "detail": "no nnsmith op fits the configured dtypes/include/exclude lists"}
        return
    made = attempts = 0
    while made < count and attempts < count * 4:
        graph_seed = seed * 1_000_003 + attempts
        attempts += 1
        ref = f"nnsmith/seed{graph_seed}.py"
        try:
            ir = generate_graph(opset, cfg, graph_seed)
            emitted = emit_source(ir, title=f"NNSmith graph (seed {graph_seed})")
        except UnsupportedOp as exc:
            yield {"ref": ref, "reason": "nnsmith_unsupported_op",
                   "detail": f"{ref}: graph uses {exc.op}, which the emitter cannot write"}
            continue
        except GraphConstraintError as exc:
            yield {"ref": ref, "reason": "nnsmith_constraint", "detail": f"{ref}: {exc}"}
            continue
        except Exception as exc:  # noqa: BLE001 - nnsmith's solver raises many kinds
            first = str(exc).splitlines()[0][:160] if str(exc) else ""
            yield {"ref": ref, "reason": "nnsmith_gen",
                   "detail": f"{ref}: generation failed ({type(exc).__name__}: {first})"}
            continue
        problem = _check_runs(emitted.source)
        if problem:
            yield {"ref": ref, "reason": "nnsmith_check", "detail": f"{ref}: {problem}"}
            continue
        made += 1
        yield {"ref": ref, "seed": graph_seed, "source": emitted.source, "ops": emitted.ops,
               "input_shapes": emitted.input_shapes}


def iter_nnsmith_modules(cfg: NNSmithConfig, count: int | None = None, seed: int | None = None,
                         timeout_s: float | None = None) -> Iterator[RawModule | Rejection]:
    """Generate `count` graphs and yield each as a RawModule, or a Rejection naming why.

    Generation runs in a fresh child process: z3 and nnsmith keep process-wide state, so only a
    fresh process gives the same graphs for the same seed (and a solver crash stays there).
    """
    count = cfg.count if count is None else count
    seed = cfg.seed if seed is None else seed
    if count <= 0:
        return
    try:
        nnsmith_version = package_version("nnsmith")
    except PackageNotFoundError:
        yield Rejection.make("ingest", "nnsmith", "nnsmith", "nnsmith_unavailable",
                             "nnsmith is not installed; pip install nnsmith==0.1.0")
        return
    commit = f"nnsmith-{nnsmith_version}"
    request = json.dumps({"cfg": cfg.model_dump(mode="json"), "count": count, "seed": seed})
    timeout_s = timeout_s if timeout_s is not None else 60.0 + 30.0 * count
    with tempfile.TemporaryDirectory(prefix="ks-nnsmith-") as tmp:
        try:
            proc = subprocess.run([sys.executable, "-m", "sources.nnsmith_graphs"], input=request,
                                  capture_output=True, text=True, timeout=timeout_s, cwd=tmp,
                                  env={**os.environ, "PYTHONPATH": _import_root()}, check=False)
        except subprocess.TimeoutExpired:
            yield Rejection.make("ingest", "nnsmith", f"nnsmith/seed{seed}", "timeout",
                                 f"nnsmith generation took more than {timeout_s:.0f}s")
            return
    items = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 and not items:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        yield Rejection.make("ingest", "nnsmith", f"nnsmith/seed{seed}", "nnsmith_unavailable",
                             f"nnsmith generation failed: {tail}")
        return
    for item in items:
        ref = item["ref"]
        if "source" not in item:
            yield Rejection.make("ingest", ref, ref, item["reason"], item["detail"])
            continue
        source = item["source"]
        meta = json.dumps({"seed": item["seed"], "ops": item["ops"],
                           "input_shapes": item["input_shapes"]}, sort_keys=True)
        yield RawModule(
            module_id=RawModule.make_id("nnsmith", NNSMITH_REPO, commit, ref, "Model", source),
            source_kind="nnsmith", repo_url=NNSMITH_REPO, commit=commit, path=ref,
            license="Apache-2.0", module_name="Model", code=source, line_start=1,
            line_end=source.count("\n"), meta=meta)


def _import_root() -> str:
    """The directory holding the `sources` package, for the child's import path."""
    root = str(Path(__file__).resolve().parent.parent)
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root


def main() -> None:
    """Child side: read {"cfg", "count", "seed"} on stdin, write one JSON line per graph."""
    request = json.loads(sys.stdin.read())
    cfg = NNSmithConfig.model_validate(request["cfg"])
    for item in generate_sources(cfg, int(request["count"]), int(request["seed"])):
        sys.stdout.write(json.dumps(item) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
