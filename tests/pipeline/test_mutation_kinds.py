"""The wider bug set (grid rounding, unstable softmax, reduction axis, broadcast stride, int32
index): each kind edits a template-style kernel where expected and changes what it computes."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.candidates.mutate import EXTRA_KINDS, kinds_for, mutate_code
from pipeline.candidates.mutation_sites import kernel_spans

# written in the form the CPU templates emit: int64_t sizes read from the tensors, a chunked
# outer loop, a max-shifted softmax, a broadcast bias
KERNELS = r"""
#ifndef KS_HARNESS
#include <torch/extension.h>
#endif
#include <cmath>
#include <cstdint>

// softmax over each row; rows are processed in chunks of 8
void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols) {
    const int64_t chunk = 8;
    const int64_t nchunks = (rows + chunk - 1) / chunk;
    for (int64_t k = 0; k < nchunks; ++k) {
        for (int64_t r = k * chunk; r < rows && r < (k + 1) * chunk; ++r) {
            float m = -INFINITY, s = 0.0f;
            for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, x[r * cols + c]);
            for (int64_t c = 0; c < cols; ++c) s += expf(x[r * cols + c] - m);
            for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = expf(x[r * cols + c] - m) / s;
        }
    }
}

// out[i] = x[i] + b[column of i]: the bias broadcast over rows
void bias_add(const float* x, const float* b, float* y, int64_t n, int64_t C) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] + b[i % C];
}

// column sums of a rows x cols matrix
void col_sum(const float* x, float* out, int64_t rows, int64_t cols) {
    for (int64_t c = 0; c < cols; ++c) {
        float acc = 0.0f;
        for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
        out[c] = acc;
    }
}

// the max of each row
void row_max(const float* x, float* out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float best = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) if (x[r * cols + c] > best) best = x[r * cols + c];
        out[r] = best;
    }
}

// flat copy with a 64-bit index
void copy_scaled(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            const int64_t at = r * cols + c;
            y[at] = 2.0f * x[at];
        }
    }
}
"""

CANDIDATE = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""{KERNELS}"""

ext = load_inline(name="kinds_ext", cpp_sources=cpp_source, functions=["softmax_rows"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.softmax_rows(x)
'''

# kind -> (a fragment of the mutated line, the original line it replaces)
EXPECT = {
    "grid_rounding": ("nchunks = rows / chunk;", "nchunks = (rows + chunk - 1) / chunk;"),
    "unstable_softmax": ("s += expf(x[r * cols + c]);", "s += expf(x[r * cols + c] - m);"),
    "wrong_reduction_axis": ("s += expf(x[c * cols + r] - m);", "s += expf(x[r * cols + c] - m);"),
    "broadcast_stride": ("b[i / C]", "b[i % C]"),
    "int32_index": ("const int at = r * cols + c;", "const int64_t at = r * cols + c;"),
    "wrong_init": ("float best = 0;", "float best = -INFINITY;"),
}

HARNESS = r"""
#define RUN_VARIANT(NS)                                                                    \
    {                                                                                      \
        const int64_t rows = 12, cols = 12;                                                \
        std::vector<float> x(rows * cols), y(rows * cols, 0.0f), b(cols), o(cols, 0.0f);   \
        for (int64_t i = 0; i < rows * cols; ++i) x[i] = 0.9f * (float)((i * 7) % 13) - 2.f; \
        for (int64_t j = 0; j < cols; ++j) b[j] = 0.5f * (float)j;                         \
        NS::softmax_rows(x.data(), y.data(), rows, cols);                                  \
        for (float v : y) std::printf(#NS " %.6f\n", v);                                   \
        std::fill(y.begin(), y.end(), 0.0f);                                               \
        NS::bias_add(x.data(), b.data(), y.data(), rows * cols, cols);                     \
        for (float v : y) std::printf(#NS " %.6f\n", v);                                   \
        NS::col_sum(x.data(), o.data(), rows, cols);                                       \
        for (float v : o) std::printf(#NS " %.6f\n", v);                                   \
        std::vector<float> xn(x);                                                          \
        for (float& v : xn) v -= 20.f;  /* rows of only negative values */                 \
        NS::row_max(xn.data(), o.data(), rows, cols);                                      \
        for (float v : o) std::printf(#NS " %.6f\n", v);                                   \
    }
"""


def _kernel_text(code: str) -> str:
    (start, end), *_ = kernel_spans(code)
    return ast.literal_eval(code[start:end])


def test_every_backend_gets_the_wider_set() -> None:
    assert set(EXTRA_KINDS) <= set(kinds_for("cuda"))
    # an int32 overflow needs 2^31 elements, which no scaled-down CPU task has
    assert set(kinds_for("cpu")) & set(EXTRA_KINDS) == set(EXTRA_KINDS) - {"int32_index"}
    assert set(EXTRA_KINDS) == set(EXPECT)


@pytest.mark.parametrize("kind", EXTRA_KINDS)
def test_kind_edits_expected_line(kind: str) -> None:
    m = mutate_code(CANDIDATE, kind, "cpu")
    assert m is not None, kind
    fragment, original = EXPECT[kind]
    assert original in m.before, (kind, m.before)
    assert fragment in m.after, (kind, m.after)
    assert m.code.splitlines()[m.line - 1] in m.after.splitlines()
    ast.parse(m.code)
    assert m.description


def test_grid_rounding_prefers_launch_grids() -> None:
    cuda = ('K = r"""\n#include <cuda_runtime.h>\n__global__ void k(float* y, int n) '
            '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 1.f; }\n'
            'void go(float* y, int n) { const int t = 256;\n'
            '    k<<<(n + t - 1) / t, t>>>(y, n); }\n"""\n')
    m = mutate_code(cuda, "grid_rounding", "cuda")
    assert m is not None and "k<<<n / t, t>>>" in m.after


def test_unstable_softmax_leaves_other_exps_alone() -> None:
    code = 'K = r"""\n#include <torch/extension.h>\nfloat f(float a, float b) ' \
           '{ return expf(a - b) + expf(a); }\n"""\n'
    assert mutate_code(code, "unstable_softmax", "cpu") is None  # `b` is no running max


def _run(tmp: Path, kernels: dict[str, str]) -> dict[str, list[float]]:
    parts = ["#define KS_HARNESS\n#include <algorithm>\n#include <cmath>\n#include <cstdint>\n"
             "#include <cstdio>\n#include <vector>\n", HARNESS]
    for name, text in kernels.items():
        body = "\n".join(s for s in text.splitlines() if not s.startswith("#include"))
        parts.append(f"namespace {name} {{\n{body}\n}}\n")
    parts.append("int main() {\n" + "".join(f"    RUN_VARIANT({n})\n" for n in kernels)
                 + "    return 0;\n}\n")
    src = tmp / "kinds.cpp"
    src.write_text("".join(parts))
    exe = tmp / "kinds"
    subprocess.run(["g++", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True,
                   timeout=120)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out: dict[str, list[float]] = {n: [] for n in kernels}
    for line in res.stdout.splitlines():
        name, value = line.split()
        out[name].append(float(value))
    return out


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_kinds_change_behaviour(tmp_path: Path) -> None:
    # int32_index shows only past 2^31 elements: it must compile and compute the same here
    kernels = {"original": _kernel_text(CANDIDATE)}
    for kind in EXTRA_KINDS:
        m = mutate_code(CANDIDATE, kind, "cpu")
        assert m is not None
        kernels[kind] = _kernel_text(m.code)
    out = _run(tmp_path, kernels)
    base = out["original"]
    assert len(base) == 144 * 2 + 12 + 12
    assert abs(sum(base[:144]) - 12.0) < 1e-3  # twelve softmax rows sum to one each
    for kind in EXTRA_KINDS:
        diff = max(abs(a - b) for a, b in zip(out[kind], base, strict=True))
        if kind == "int32_index":
            assert diff == 0.0
        else:
            assert diff > 1e-3, kind


SOFTMAX_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(20, 20)]


def get_init_inputs():
    return []
'''

SOFTMAX_BINDING = r"""
#ifndef KS_HARNESS
torch::Tensor softmax(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::zeros_like(xc);
    softmax_rows(xc.data_ptr<float>(), y.data_ptr<float>(), xc.size(0), xc.size(1));
    return y;
}
#endif
"""


@pytest.mark.slow
def test_mutants_fail_and_their_fix_passes_the_verifier(tmp_path: Path) -> None:
    from verifier.api import verify_batch
    from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

    code = CANDIDATE.replace(f'r"""{KERNELS}"""', f'r"""{KERNELS}{SOFTMAX_BINDING}"""') \
        .replace('functions=["softmax_rows"]', 'functions=["softmax"]') \
        .replace("ext.softmax_rows(x)", "ext.softmax(x)")
    kinds = ("grid_rounding", "unstable_softmax", "wrong_reduction_axis")
    variants = {"fix": code}
    for kind in kinds:
        m = mutate_code(code, kind, "cpu")
        assert m is not None, kind
        variants[kind] = m.code
    reqs = [VerifyRequest(name, "softmax", SOFTMAX_TASK, text, "cpu")
            for name, text in variants.items()]
    opts = VerifyOptions(backend="cpu", workers=2, compile_workers=2, run_timeout_s=30.0,
                         trials=3, perf_trials=3, perf_warmup=1,
                         build_cache_dir=str(Path.home() / ".cache" / "kernelsynth-tests"
                                             / "verifier-builds"),
                         baseline_cache_dir=str(tmp_path / "baselines"))
    verdicts = {v.candidate_id: v for v in verify_batch(reqs, opts)}
    fix = verdicts["fix"]
    assert fix.status in CORRECT_STATUSES, (fix.status, fix.error, fix.compile_log[-800:])
    for kind in kinds:
        v = verdicts[kind]
        assert v.status == "incorrect", (kind, v.status, v.error, v.compile_log[-800:])
