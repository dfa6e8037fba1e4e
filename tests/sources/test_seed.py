"""The built-in seed corpus: coverage of the op families, complete and runnable task files."""

from __future__ import annotations

import ast

import pytest
import torch

from pipeline.tasks.probe.dims import int_constants
from pipeline.tasks.probe.scale import input_numel, scale_constants
from schemas import OP_FAMILIES
from sources.seed import seed_families, seed_files

FILES = seed_files()


def test_corpus_size_and_family_coverage():
    assert len(FILES) >= 60
    families: dict[str, int] = {}
    levels: dict[int, int] = {}
    for path in FILES:
        fams, level = seed_families(path.read_text())
        assert fams, f"{path.name}: no Families line"
        assert set(fams) <= set(OP_FAMILIES), path.name
        assert path.name.startswith(fams[0] + "_"), path.name
        for f in fams:
            families[f] = families.get(f, 0) + 1
        levels[level] = levels.get(level, 0) + 1
    required = {"elementwise", "activation", "broadcast", "reduction", "softmax", "norm",
                "matmul", "conv", "conv_transpose", "pooling", "attention", "loss", "scan"}
    assert required <= set(families)
    assert levels.get(2, 0) >= 10  # fused chains
    names = {p.stem for p in FILES}
    for needed in ("conv_conv1d", "conv_conv2d", "conv_conv3d", "conv_transpose_conv_transpose1d",
                   "conv_transpose_conv_transpose2d", "conv_transpose_conv_transpose3d",
                   "softmax_log_softmax_rows", "norm_rms_norm", "norm_batch_norm_2d",
                   "matmul_bmm", "matmul_linear", "scan_cumsum"):
        assert needed in names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_task_file_runs_deterministically(path):
    """Every file is a complete KernelBench task; run it at a small scale twice."""
    source = path.read_text()
    tree = ast.parse(source)
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert {"Model", "get_inputs", "get_init_inputs"} <= top
    assert "dropout" not in source.lower()
    ns: dict = {"__name__": "seed_task"}
    exec(compile(tree, str(path), "exec"), ns)
    # the pipeline's own CPU scale-down
    scale_constants(ns, int_constants(tree), 1 << 12, lambda: input_numel(ns))
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = ns["Model"](*ns["get_init_inputs"]()).eval()
        torch.manual_seed(1)
        with torch.no_grad():
            out = model(*ns["get_inputs"]())
        outs.append(out if isinstance(out, tuple) else (out,))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
        if a.is_floating_point():
            assert torch.isfinite(a).all()


def test_seed_sample_is_stratified_deterministic_and_bounded():
    from sources.seed import sample_seed_files

    all_files = seed_files()
    families = {p.name.split("_", 1)[0] for p in all_files}
    picked = sample_seed_files(len(families) * 2, seed=3)
    assert len(picked) == len(families) * 2 == len(set(picked))
    assert {p.name.split("_", 1)[0] for p in picked} == families  # every family is seen
    assert picked == sample_seed_files(len(families) * 2, seed=3)
    assert picked != sample_seed_files(len(families) * 2, seed=4)
    assert sample_seed_files(0) == all_files == sample_seed_files(10_000)
