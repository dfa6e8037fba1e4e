"""Template generator: coverage of the seed corpus, candidate format, CPU correctness against the
reference (one shared C++ build), CUDA sources compiling with nvcc, NoTemplate reasons."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.candidates.templates import (
    NoTemplate,
    TaskView,
    template_candidates,
    template_kernels,
)
from pipeline.candidates.templates.analysis import trace_sources
from pipeline.candidates.templates.selfcheck import (
    check_cpu_candidates,
)
from sources.seed import seed_families, seed_files
from tests.pipeline.candidates.nvcc_once import assert_nvcc_compiles

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

# Small task files (CPU-sized already) covering every template family.
TASKS = {
    "fused_chain": """
class Model(nn.Module):
    def __init__(self, scale):
        super(Model, self).__init__()
        self.scale = scale
    def forward(self, x):
        y = F.gelu(x * self.scale) + 1.0
        return torch.clamp(torch.sigmoid(y) - 0.25, min=0.0, max=0.6)
def get_inputs():
    return [torch.randn(8, 64)]
def get_init_inputs():
    return [0.7]
""",
    "broadcast_bias": """
class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(c, 1, 1))
    def forward(self, x, y):
        return torch.maximum(x + self.bias, y[:, :, :1, :])
def get_inputs():
    return [torch.randn(2, 4, 5, 6), torch.randn(2, 4, 3, 6)]
def get_init_inputs():
    return [4]
""",
    "argmax_and_mean": """
class Model(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1), x.mean(dim=2, keepdim=True), torch.var(x, dim=1)
def get_inputs():
    return [torch.randn(3, 17, 9)]
def get_init_inputs():
    return []
""",
    "softmax_logsumexp": """
class Model(nn.Module):
    def forward(self, x):
        return torch.log_softmax(x, dim=-1), torch.softmax(x, dim=1), torch.logsumexp(x, dim=2)
def get_inputs():
    return [torch.randn(4, 6, 33) * 5]
def get_init_inputs():
    return []
""",
    "linear_layernorm": """
class Model(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.fc = nn.Linear(i, o)
        self.ln = nn.LayerNorm(o)
    def forward(self, x):
        return F.silu(self.ln(self.fc(x)))
def get_inputs():
    return [torch.randn(5, 3, 24)]
def get_init_inputs():
    return [24, 300]
""",
    "conv_bn_pool": """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, groups=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8, bias=False)
    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        return F.max_pool2d(self.dw(y), 2), F.avg_pool2d(y, 3, stride=2, padding=1)
def get_inputs():
    return [torch.randn(2, 3, 15, 14)]
def get_init_inputs():
    return []
""",
    "conv_transpose_groupnorm": """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.gn = nn.GroupNorm(3, 6)
    def forward(self, x):
        return torch.tanh(self.gn(self.up(x)))
def get_inputs():
    return [torch.randn(2, 4, 11)]
def get_init_inputs():
    return []
""",
    "scans_and_bmm": """
class Model(nn.Module):
    def forward(self, a, b, m):
        c = torch.bmm(a, b.transpose(1, 2))
        return torch.cumsum(c * m, dim=2), torch.flip(torch.cumprod(a, dim=1), [1])
def get_inputs():
    return [torch.rand(3, 7, 5) + 0.5, torch.randn(3, 9, 5), torch.rand(3, 7, 9) > 0.5]
def get_init_inputs():
    return []
""",
    "losses": """
class Model(nn.Module):
    def forward(self, p, t, logits, y):
        return (F.mse_loss(p, t), F.smooth_l1_loss(p, t, beta=0.5),
                F.cross_entropy(logits, y), torch.mean(torch.clamp(1 - p * t, min=0)))
def get_inputs():
    return [torch.randn(6, 10), torch.randn(6, 10), torch.randn(6, 5),
            torch.randint(0, 5, (6,))]
def get_init_inputs():
    return []
""",
}


def _view(name: str) -> TaskView:
    src = HEAD + TASKS[name].lstrip()
    return TaskView(task_id=name, name=name, source=src, cpu_source=src)


@pytest.fixture(scope="module")
def traced() -> None:
    """Trace every test task and the seed corpus in one sandboxed child (one torch import)."""
    sources = [HEAD + t.lstrip() for t in TASKS.values()]
    sources += [p.read_text(encoding="utf-8") for p in seed_files()]
    trace_sources(sources)


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_seed_level1_coverage_and_candidate_format(traced) -> None:
    import ast

    from verifier.checks.extspec import specs_from_source
    from verifier.checks.static import check_cpp, check_python

    level1, covered = 0, 0
    for path in seed_files():
        src = path.read_text(encoding="utf-8")
        _, level = seed_families(src)
        view = TaskView(path.stem, path.stem, src, src, level)
        try:
            kernels = template_kernels(view, "cuda", 3)
        except NoTemplate as exc:
            assert str(exc), path.name  # a reason, never empty
            kernels = []
        if level == 1:
            level1 += 1
            covered += bool(kernels)
        codes = [k.code for k in kernels]
        assert len(set(codes)) == len(codes), f"{path.name}: duplicate variants"
        for k in kernels:
            meta = json.loads(k.meta())
            assert meta["family"] == k.family and meta["variant"] == k.variant
            assert meta["reasoning"].startswith(f"The reference `{path.stem}` computes")
            assert f"```python\n{k.code}```" in k.raw_response()
            findings = check_python(ast.parse(k.code), src)
            specs = specs_from_source(k.code)  # literal load_inline args: no collect run needed
            assert specs is not None, f"{path.name}: load_inline arguments are not literal"
            findings += check_cpp(specs, k.code, src)
            assert not findings, f"{path.name} {k.variant}: {findings}"
    assert level1 >= 80 and covered / level1 >= 0.8, (covered, level1)


def test_variants_differ_in_block_size_tiling_or_vectorisation(traced) -> None:
    ks = template_kernels(_view("linear_layernorm"), "cuda", 3)
    assert len(ks) >= 2
    assert "tile16" in ks[0].variant and "tile64_reg4x4" in ks[1].variant
    assert "__shared__ float As[16][64 + 4]" in ks[1].code
    chain = template_kernels(_view("fused_chain"), "cuda", 2)
    assert "float4" in chain[0].code and "float4" not in chain[1].code
    # the whole activation chain is one kernel: one extension function in forward
    assert chain[0].code.count("_ext.") == 1


def test_unsupported_op_raises_no_template_with_reason(traced, tmp_path) -> None:
    src = HEAD + """
class Model(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=1)[0]
def get_inputs():
    return [torch.randn(4, 8)]
def get_init_inputs():
    return []
"""
    with pytest.raises(NoTemplate, match="aten.sort"):
        template_kernels(TaskView("s", "sort", src, src), "cpu", 1)
    broken = HEAD + "class Model(nn.Module):\n    def forward(self, x):\n        return x\n"
    with pytest.raises(NoTemplate, match="could not be traced"):
        template_kernels(TaskView("b", "broken", broken, broken), "cpu", 1)


def test_template_candidates_are_schema_records(traced) -> None:
    from schemas import Candidate, Task

    src = HEAD + TASKS["fused_chain"].lstrip()
    task = Task(task_id="t1", name="fused_chain", source=src, cpu_source=src)
    cands = template_candidates(task, "cpu", 2)
    assert cands and all(isinstance(c, Candidate) for c in cands)
    for c in cands:
        assert c.generator.startswith("template:activation/cpu-")
        assert c.candidate_id == Candidate.make_id("t1", "cpu", c.code)
        assert "```python" in c.raw_response and "load_inline" in c.code


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_cpu_candidates_match_reference_in_one_build(traced) -> None:
    cases, labels = [], []
    for name in TASKS:
        view = _view(name)
        for k in template_kernels(view, "cpu", 1):
            cases.append({"code": k.code, "reference": view.cpu_source})
            labels.append(f"{name}:{k.variant}")
    results = check_cpu_candidates(cases, timeout_s=600)
    bad = {lab: r.get("error") for lab, r in zip(labels, results, strict=True) if not r["ok"]}
    assert not bad, bad


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_sources_compile_with_nvcc(traced, tmp_path) -> None:
    # One variant each, chosen to touch every CUDA template once (nvcc is slow here: torch headers).
    codes = []
    for name, variant in (("linear_layernorm", 1), ("conv_bn_pool", 1), ("softmax_logsumexp", 1),
                          ("scans_and_bmm", 0), ("argmax_and_mean", 0), ("losses", 0),
                          ("conv_transpose_groupnorm", 0)):
        codes.append(template_kernels(_view(name), "cuda", variant + 1)[variant].code)
    joined = "\n".join(codes)
    for needle in ("float As[16][64 + 4]", "_smem[]", "__shfl_up_sync", "float4", "nll",
                   "__shfl_xor_sync", "td % g.sd"):
        assert needle in joined, needle
    half = HEAD + """
class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)
def get_inputs():
    return [torch.randn(64, 32, dtype=torch.float16), torch.randn(32, 48, dtype=torch.float16)]
def get_init_inputs():
    return []
"""
    wmma = template_kernels(TaskView("h", "half_mm", half, half), "cuda", 1)[0]
    assert "wmma::mma_sync" in wmma.code
    codes.append(wmma.code)
    assert_nvcc_compiles(codes, tmp_path)
