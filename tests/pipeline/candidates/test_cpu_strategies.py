"""The CPU teacher's strategy families: each task gets a simd, an omp and a fast-math variant,
with the loops, flags and vector-math declarations their names promise."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pipeline.candidates.templates import TaskView, template_kernels
from pipeline.candidates.templates.analysis import trace_sources

HEAD = "import torch\nimport torch.nn as nn\n\n"
SOURCES = {
    "scale_tanh": """
class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x * 2.0 + 1.0)
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
""",
    "div_col": """
class Model(nn.Module):
    def forward(self, x, s):
        return x / s
def get_inputs():
    return [torch.randn(64, 256), torch.rand(64, 1) + 1.0]
def get_init_inputs():
    return []
""",
    "row_norm": """
class Model(nn.Module):
    def forward(self, x):
        return torch.sum(x * x, dim=1)
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
""",
    "softplus_relu": """
class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.softplus(x) + torch.relu(x) * 0.5
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
""",
    "layer_norm": """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(256)
    def forward(self, x):
        return self.ln(x)
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
""",
    "linear": """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 64)
    def forward(self, x):
        return self.fc(x)
def get_inputs():
    return [torch.randn(32, 128)]
def get_init_inputs():
    return []
""",
}


@pytest.fixture(scope="module")
def kernels() -> dict[str, list]:
    srcs = {k: HEAD + v.lstrip() for k, v in SOURCES.items()}
    trace_sources(list(srcs.values()))
    return {k: template_kernels(TaskView(k, k, s, s), "cpu", 3) for k, s in srcs.items()}


def _flags(code: str) -> list[str]:
    return re.findall(r'"(-[^"]+)"', re.search(r"extra_cflags=\[(.*?)\]", code).group(1))


def test_every_task_gets_one_variant_per_strategy(kernels: dict[str, list]) -> None:
    for name, ks in kernels.items():
        strategies = [k.variant.split("-")[1] for k in ks]
        assert strategies == ["simd", "omp", "simd_fastmath"], name
        assert len({k.code for k in ks}) == 3, name
        simd, omp, fast = (_flags(k.code) for k in ks)
        assert "-march=native" in simd and "-fno-math-errno" in simd and "-ffast-math" not in simd
        assert omp == ["-O3", "-fopenmp"]
        assert "-ffast-math" in fast and "-fno-finite-math-only" in fast  # NaN tests live
        assert "omp simd" in ks[0].code and "omp simd" not in ks[1].code, name


def test_simd_elementwise_declares_vector_math_it_calls(kernels: dict[str, list]) -> None:
    simd, omp, _ = kernels["scale_tanh"]
    assert re.search(r'__attribute__\(\(simd\("notinbranch"\)\)\) float tanhf\(float\)', simd.code)
    assert "notinbranch" not in omp.code
    # the chain is one fused pass in every strategy
    assert simd.code.count("#pragma omp parallel for") == 1


def test_broadcast_rows_compute_offsets_once_per_row(kernels: dict[str, list]) -> None:
    simd, omp, _ = kernels["div_col"]
    assert "const int64_t L =" in simd.code and "for (int64_t j = 0; j < L; ++j)" in simd.code
    assert "const int64_t L =" not in omp.code  # the per-element index arithmetic


def test_reduction_and_matmul_strategies(kernels: dict[str, list]) -> None:
    simd = kernels["row_norm"][0]
    assert "#pragma omp simd reduction(+:v)" in simd.code
    packed = [k for k in kernels["linear"] if "cpu_packed" in k.variant]
    assert {k.variant.split("-")[-1] for k in packed} == {"cpu_packed_kb64", "cpu_packed_kb256"}
    assert all("Bp[k * N + j]" in k.code for k in packed)
    assert "cpu_packed" not in kernels["linear"][1].variant


def _object_symbols(code: str, tmp: Path) -> str:
    """`nm` of the candidate's C++ compiled as the verifier compiles it: inside a namespace of its
    own, with the candidate's flags."""
    import sysconfig

    import torch.utils.cpp_extension as cpp

    kernels = re.search(r'KERNELS = r"""\n(.*?)"""', code, re.S).group(1)
    src = tmp / "unit.cpp"
    src.write_text("#include <torch/extension.h>\nnamespace ks_unit {\n" + kernels + "\n}\n")
    inc = Path(cpp.__file__).resolve().parent.parent / "include"
    incs = [inc, inc / "torch" / "csrc" / "api" / "include", sysconfig.get_paths()["include"]]
    subprocess.run(["g++", "-c", "-std=c++17", "-fPIC", *_flags(code),
                    *[a for p in incs for a in ("-isystem", str(p))], str(src), "-o",
                    str(tmp / "unit.o")], check=True, capture_output=True, timeout=600)
    return subprocess.run(["nm", str(tmp / "unit.o")], check=True, capture_output=True,
                          text=True).stdout


@pytest.mark.slow
def test_simd_loops_call_vector_math_as_the_verifier_builds_them(kernels: dict[str, list],
                                                                  tmp_path: Path) -> None:
    """A select (relu, softplus' threshold, fmaxf) next to a vector-math call once kept GCC from
    vectorising the loop at all; the simd strategy's object calls libmvec's vector variants."""
    simd, omp, _ = kernels["softplus_relu"]
    assert "ks_fmaxf(" in simd.code and "?" not in simd.code.split("inline float ew")[1][:300]
    syms = _object_symbols(simd.code, tmp_path)
    assert re.search(r"_ZGV\w+_expf", syms) and re.search(r"_ZGV\w+_log1pf", syms), syms


def test_simd_layer_norm_is_one_division_free_pass_per_row(kernels: dict[str, list]) -> None:
    simd, omp, _ = kernels["layer_norm"]
    assert "% S)" not in simd.code and "#pragma omp simd reduction(+:part)" in simd.code
    assert "(j / S) * T" in omp.code  # the general strided form stays the omp strategy's


FAST_MATH_SOURCE = HEAD + """
import torch.nn.functional as F
class Model(nn.Module):
    def forward(self, x):
        return (torch.sin(x) + torch.cos(x * 3.0) * F.softplus(x) + torch.log1p(torch.abs(x))
                + torch.tanh(x) * torch.exp(-torch.abs(x)))
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
"""


def test_fast_math_replaces_every_transcendental_it_has_a_polynomial_for() -> None:
    trace_sources([FAST_MATH_SOURCE])
    simd, _, fast = template_kernels(TaskView("fm", "fm", FAST_MATH_SOURCE, FAST_MATH_SOURCE),
                                     "cpu", 3)
    body = fast.code.split("inline float ew")[1]
    for f in ("sinf", "cosf", "log1pf", "expf", "tanhf"):
        assert f"ks_{f}(" in body and not re.search(rf"(?<![\w:.]){f}\s*\(", body), f
    assert "static inline void ks_sincosf" in fast.code
    assert "ks_sinf" not in simd.code  # the plain simd strategy keeps libm/libmvec


@pytest.mark.slow
def test_fast_math_polynomials_match_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """The simd_fastmath kernel of a chain of every polynomial (sin, cos, log1p, exp, tanh),
    built by load_inline with its own flags, against torch on random inputs from tiny to large
    magnitudes (the quadrant selects and the exponent-field splits at every range)."""
    import torch

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    trace_sources([FAST_MATH_SOURCE])
    fast = template_kernels(TaskView("fm", "fm", FAST_MATH_SOURCE, FAST_MATH_SOURCE), "cpu",
                            3)[2]
    ns: dict = {}
    exec(compile(FAST_MATH_SOURCE, "reference.py", "exec"), ns)
    cand: dict = {}
    exec(compile(fast.code, "candidate.py", "exec"), cand)
    ref, new = ns["Model"](), cand["ModelNew"]()
    gen = torch.Generator().manual_seed(0)
    for scale in (1e-4, 0.5, 1.0, 4.0, 30.0):
        x = torch.randn(64, 256, generator=gen) * scale
        want, got = ref(x), new(x)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (
            scale, float((got - want).abs().max()))


ATTENTION_SOURCE = HEAD + """
import math
class Model(nn.Module):
    def forward(self, q, k, v):
        n = q.size(-2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)
def get_inputs():
    return [torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)]
def get_init_inputs():
    return []
"""


def test_simd_attention_is_one_fused_kernel_and_omp_keeps_the_generic_one() -> None:
    trace_sources([ATTENTION_SOURCE])
    simd, omp, fast = template_kernels(TaskView("at", "at", ATTENTION_SOURCE, ATTENTION_SOURCE),
                                       "cpu", 3)
    for k in (simd, fast):
        assert k.family == "attention" and k.code.count("_ext.") == 1, k.variant
        assert "std::min<int64_t>(S, i + 1)" in k.code  # the causal mask as a key count
    assert "attn_" not in omp.code and omp.code.count("_ext.") > 1


@pytest.mark.slow
def test_fused_attention_matches_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused causal attention, built with its flags, against torch at the traced sizes and
    at other ones (its sizes are read from the tensors: another batch, more keys)."""
    import torch

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    trace_sources([ATTENTION_SOURCE])
    simd = template_kernels(TaskView("at", "at", ATTENTION_SOURCE, ATTENTION_SOURCE), "cpu", 3)[0]
    ns: dict = {}
    exec(compile(ATTENTION_SOURCE, "reference.py", "exec"), ns)
    cand: dict = {}
    exec(compile(simd.code, "candidate.py", "exec"), cand)
    ref, new = ns["Model"](), cand["ModelNew"]()
    gen = torch.Generator().manual_seed(0)
    for shape in ((2, 4, 16, 8), (3, 2, 33, 8)):
        q, k, v = (torch.randn(*shape, generator=gen) for _ in range(3))
        want, got = ref(q, k, v), new(q, k, v)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (
            shape, float((got - want).abs().max()))


SCAN_SOURCE = HEAD + """
class Model(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=-1), torch.cumprod(x, dim=-1), torch.cummax(x, dim=-1).values
def get_inputs():
    return [torch.randn(13, 300)]
def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_row_interleaved_scans_match_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """cumsum, cumprod (its products decay through fp32's subnormals: written as zero) and
    cummax's values (a NaN stays), eight rows side by side with a shorter last group, against
    torch."""
    import torch

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    trace_sources([SCAN_SOURCE])
    simd = template_kernels(TaskView("sc", "sc", SCAN_SOURCE, SCAN_SOURCE), "cpu", 3)[0]
    assert simd.code.count("double v[8];") == 3  # each scan eight rows side by side
    ns: dict = {}
    exec(compile(SCAN_SOURCE, "reference.py", "exec"), ns)
    cand: dict = {}
    exec(compile(simd.code, "candidate.py", "exec"), cand)
    ref, new = ns["Model"](), cand["ModelNew"]()
    gen = torch.Generator().manual_seed(0)
    for rows in (13, 16, 5):
        x = torch.randn(rows, 300, generator=gen)
        x[rows // 2, 100] = float("nan")
        for want, got in zip(ref(x), new(x), strict=True):
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4, equal_nan=True), rows
