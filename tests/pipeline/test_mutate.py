"""Bug mutation: every kind edits real CUDA and C++ kernels where expected, and C++ mutants
compute something different from the original (compiled with g++ and run on fixed data)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.candidates.mutate import (
    CPU_KINDS,
    GPU_KINDS,
    MutationError,
    find_sites,
    kinds_for,
    mutate_candidates,
    mutate_code,
)
from pipeline.candidates.mutation_sites import kernel_spans
from pipeline.config import GenerateConfig
from schemas import Candidate, Task, Verdict

CPU_KERNELS = r"""
#ifndef KS_HARNESS
#include <torch/extension.h>
#endif
#include <cstdint>

// row sums: one output per row, accumulated over the columns
void row_sum_kernel(const float* x, float* out, int64_t rows, int64_t cols) {
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (int64_t c = 0; c < cols; ++c) {
            acc += x[r * cols + c];
        }
        out[r] = acc;
    }
}

void conv1d_kernel(const float* x, const float* w, float* out, int64_t n, int64_t k,
                   int64_t pad) {
    for (int64_t i = 0; i < n; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
            const int64_t src = i + j - pad;
            if (src >= 0 && src < n) {
                acc += x[src] * w[j];
            }
        }
        out[i] = acc;
    }
}

double total_sum(const float* x, int64_t n) {
    double s = 0.0;
    #pragma omp parallel for reduction(+:s)
    for (int64_t i = 0; i < n; ++i) {
        s += x[i];
    }
    return s;
}

#ifndef KS_HARNESS
torch::Tensor row_sum(torch::Tensor x) {
    auto out = torch::empty({x.size(0)}, x.options());
    row_sum_kernel(x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1));
    return out;
}
#endif
"""

CPU_CANDIDATE = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""{CPU_KERNELS}"""

ext = load_inline(name="row_sum_ext", cpp_sources=cpp_source, functions=["row_sum"],
                  extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.row_sum(x.contiguous())
'''

HARNESS_RUN = r"""
// runs one kernel variant (a namespace) on fixed data and prints its outputs, tagged
#define RUN_VARIANT(NS)                                                                      \
    {                                                                                        \
        const int64_t rows = 8, cols = 5, n = 12, k = 3, guard = 16;                         \
        std::vector<float> x(rows * cols), out(rows, 0.0f);                                  \
        for (int64_t i = 0; i < rows * cols; ++i) x[i] = 0.37f * (float)((i * 7) % 11) - 1.3f; \
        NS::row_sum_kernel(x.data(), out.data(), rows, cols);                                \
        for (float v : out) std::printf(#NS " %.6f\n", v);                                   \
        /* conv input inside a canary band: a read outside [0, n) shows in the result */     \
        std::vector<float> buf(n + 2 * guard, 100.0f), w(k), y(n, 0.0f);                     \
        for (int64_t i = 0; i < n; ++i) buf[guard + i] = 0.5f * (float)(i % 5) - 0.7f;       \
        for (int64_t j = 0; j < k; ++j) w[j] = 0.25f * (float)(j + 1);                       \
        NS::conv1d_kernel(buf.data() + guard, w.data(), y.data(), n, k, 1);                  \
        for (float v : y) std::printf(#NS " %.6f\n", v);                                     \
        std::printf(#NS " %.6f\n", NS::total_sum(x.data(), rows * cols));                    \
    }
"""

CUDA_KERNELS = r"""
#include <cuda_runtime.h>
#define TILE 16

__global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int ak = t * TILE + threadIdx.x;
        int bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
        __syncthreads();
        for (int i = 0; i < TILE; ++i) {
            acc += As[threadIdx.y][i] * Bs[i][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        C[row * N + col] = acc;
    }
}

__global__ void relu_kernel(const float* x, float* y, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        float v = x[idx];
        y[idx] = v > 0.0f ? v : 0.0f;
    }
}

void launch_matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_tiled<<<grid, block>>>(A, B, C, M, N, K);
}

void launch_relu(const float* x, float* y, int n) {
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    relu_kernel<<<blocks, threads>>>(x, y, n);
}
"""

CUDA_CANDIDATE = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""{CUDA_KERNELS}"""
cpp_source = "void launch_relu(const float* x, float* y, int n);"

ext = load_inline(name="mm_ext", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["launch_relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.launch_relu(x)
'''

# kind -> (a fragment of the mutated line, the original line it replaces)
CPU_EXPECT = {
    "off_by_one": ("r < rows - 1", "r < rows;"),
    "missing_bound_check": ("{", "if (src >= 0 && src < n) {"),
    "wrong_stride": ("x[c * cols + r]", "x[r * cols + c]"),
    "wrong_cast": ("int acc = 0.0f;", "float acc = 0.0f;"),
    "uninit_accumulator": ("float acc = 0.0f;", "float acc = 0.0f;"),
    "omp_race": ("#pragma omp parallel for", "reduction(+:s)"),
}
GPU_EXPECT = {
    "off_by_one": ("t < (K + TILE - 1) / TILE - 1", "t < (K + TILE - 1) / TILE;"),
    "missing_bound_check": ("{", "if (row < M && col < N) {"),
    "missing_syncthreads": ("", "__syncthreads();"),
    "wrong_stride": ("A[ak * K + row]", "A[row * K + ak]"),
    "wrong_index": ("threadIdx.y * blockDim.y + blockIdx.y", "blockIdx.y * blockDim.y"),
    "wrong_cast": ("int acc = 0.0f;", "float acc = 0.0f;"),
    "uninit_accumulator": ("float acc;", "float acc = 0.0f;"),
    "bad_launch_config": ("const int threads = 2048;", "const int threads = 256;"),
}


def _kernel_text(code: str) -> str:
    (start, end), *_ = [s for s in kernel_spans(code) if "KS_HARNESS" in code[s[0]:s[1]]
                        or "__global__" in code[s[0]:s[1]]]
    return ast.literal_eval(code[start:end])


def test_kernel_spans_find_only_cxx_literals() -> None:
    spans = kernel_spans(CUDA_CANDIDATE)
    texts = [CUDA_CANDIDATE[s:e] for s, e in spans]
    assert len(spans) == 1  # the CUDA source; the one-line declaration has nothing to mutate
    assert "__global__" in texts[0] and texts[0].startswith('r"""')
    assert not any("load_inline" in t for t in texts)


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_cpu_mutation_edits_expected_line(kind: str) -> None:
    m = mutate_code(CPU_CANDIDATE, kind, "cpu")
    assert m is not None, kind
    fragment, original = CPU_EXPECT[kind]
    assert original in m.before
    assert fragment in m.after
    assert m.code.splitlines()[m.line - 1] in m.after.splitlines()
    ast.parse(m.code)  # the Python file around the kernel is intact
    assert m.code != CPU_CANDIDATE


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_mutation_edits_expected_line(kind: str) -> None:
    m = mutate_code(CUDA_CANDIDATE, kind, "cuda")
    assert m is not None, kind
    fragment, original = GPU_EXPECT[kind]
    assert original in m.before, (kind, m.before)
    if kind == "missing_syncthreads":
        assert m.code.count("__syncthreads();") == CUDA_CANDIDATE.count("__syncthreads();") - 1
    else:
        assert fragment in m.after, (kind, m.after)
    ast.parse(m.code)


def test_comments_and_strings_are_never_mutated() -> None:
    code = CPU_CANDIDATE.replace("// row sums", "// for (int i = 0; i < n; ++i) x[a * b + c]")
    sites = find_sites(code, "off_by_one", "cpu") + find_sites(code, "wrong_stride", "cpu")
    comment_start = code.index("// for (int i")
    assert sites and all(not (comment_start <= s.start < comment_start + 50) for s in sites)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(MutationError, match="unknown mutation kind"):
        find_sites(CPU_CANDIDATE, "typo_kind", "cpu")


def _run_variants(tmp: Path, kernels: dict[str, str]) -> dict[str, list[float]]:
    """Compile every kernel variant into one program (one namespace each) and run it."""
    parts = ["#define KS_HARNESS\n#include <cstdint>\n#include <cstdio>\n#include <vector>\n",
             HARNESS_RUN]
    for name, text in kernels.items():
        body = "\n".join(line for line in text.splitlines() if not line.startswith("#include"))
        parts.append(f"namespace {name} {{\n{body}\n}}\n")
    parts.append("int main() {\n" + "".join(f"    RUN_VARIANT({n})\n" for n in kernels)
                 + "    return 0;\n}\n")
    src = tmp / "variants.cpp"
    src.write_text("".join(parts))
    exe = tmp / "variants"
    subprocess.run(["g++", "-O2", "-fopenmp", "-o", str(exe), str(src)], check=True,
                   capture_output=True, timeout=120)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                         env={"OMP_NUM_THREADS": "2"})
    assert res.returncode == 0, res.stderr
    outputs: dict[str, list[float]] = {n: [] for n in kernels}
    for line in res.stdout.splitlines():
        name, value = line.split()
        outputs[name].append(float(value))
    return outputs


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpu_mutations_change_behaviour(tmp_path: Path) -> None:
    # omp_race is a data race: whether it shows depends on scheduling, so only its text is
    # checked above; every other kind must change the numbers deterministically
    kinds = [k for k in CPU_KINDS if k != "omp_race"]
    kernels = {"original": _kernel_text(CPU_CANDIDATE)}
    for kind in kinds:
        m = mutate_code(CPU_CANDIDATE, kind, "cpu")
        assert m is not None
        kernels[kind] = _kernel_text(m.code)
    outputs = _run_variants(tmp_path, kernels)
    baseline = outputs["original"]
    assert len(baseline) == 8 + 12 + 1
    assert abs(baseline[-1] - sum(baseline[:8])) < 1e-3  # the harness itself computes sums
    for kind in kinds:
        got = outputs[kind]
        assert len(got) == len(baseline), kind
        assert max(abs(a - b) for a, b in zip(got, baseline, strict=True)) > 1e-3, kind


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_gpu_mutants_still_compile(tmp_path: Path) -> None:
    # one translation unit, one namespace per mutant: a bug must be a runtime bug, not a typo
    parts = []
    for kind in GPU_KINDS:
        m = mutate_code(CUDA_CANDIDATE, kind, "cuda")
        assert m is not None
        body = _kernel_text(m.code).replace("#include <cuda_runtime.h>", "")
        parts.append(f"namespace {kind} {{\n{body}\n}}\n")
    unit = tmp_path / "mutants.cu"
    unit.write_text("#include <cuda_runtime.h>\n" + "".join(parts))
    res = subprocess.run(["nvcc", "-c", "-o", str(tmp_path / "m.o"), str(unit)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def _task() -> Task:
    return Task(task_id="t1", name="row_sum", source="src", cpu_source="src")


def test_mutate_candidates_tags_kind_and_keeps_fix() -> None:
    cand = Candidate(candidate_id=Candidate.make_id("t1", "cpu", CPU_CANDIDATE), task_id="t1",
                     backend="cpu", generator="template:reduction/omp", code=CPU_CANDIDATE)
    wrong = Candidate(candidate_id="c-wrong", task_id="t1", backend="cpu",
                      generator="template:reduction/omp", code=CPU_CANDIDATE + "\n# other\n")
    verdicts = [Verdict(candidate_id=cand.candidate_id, task_id="t1", status="correct_slow",
                        stage="done", backend="cpu"),
                Verdict(candidate_id="c-wrong", task_id="t1", status="incorrect",
                        stage="correctness", backend="cpu")]
    cfg = GenerateConfig(mutations_per_kernel=3)
    out = mutate_candidates([_task()], [cand, wrong], verdicts, cfg)
    assert len(out) == 3  # only the correct kernel is mutated
    kinds = set()
    for m in out:
        meta = json.loads(m.meta)
        kind = m.generator.removeprefix("mutate:")
        kinds.add(kind)
        assert kind in kinds_for("cpu") and meta["mutation"] == kind
        assert meta["fix_code"] == CPU_CANDIDATE and meta["fix_candidate_id"] == cand.candidate_id
        assert m.code != CPU_CANDIDATE
        assert m.code.splitlines()[meta["bug_line"] - 1] == meta["bug_after"].splitlines()[0]
        assert m.prompt and m.prompt[-1].role == "user"  # built from the task
        assert re.search(r"```python\n", m.raw_response)
    assert len(kinds) == 3
    # deterministic for a fixed seed, and restricted to the configured kinds
    again = mutate_candidates([_task()], [cand], verdicts, cfg)
    assert [c.candidate_id for c in again] == [c.candidate_id for c in out]
    only = mutate_candidates([_task()], [cand], verdicts,
                             GenerateConfig(mutations_per_kernel=3, mutation_kinds=["omp_race"]))
    assert [c.generator for c in only] == ["mutate:omp_race"]


TEMPLATE_STYLE = r'''
#include <torch/extension.h>
typedef float sm_acc;
__device__ void merge(sm_acc& m, sm_acc& s, sm_acc om, sm_acc os) { m = om; s += os; }

__global__ void red_kernel(const float* in, float* out, int64_t outer, int64_t R) {
    for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
        sm_acc m = -INFINITY, s = 0;
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x) merge(m, s, in[o * R + r], 1);
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
        if (threadIdx.x == 0) out[o] = s;
    }
}

__global__ void ew_kernel(const float* in, float* out, int64_t n) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n;
         j += (int64_t)gridDim.x * blockDim.x) out[j] = in[j];
}

void gemm_rows(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
               int64_t sam, int64_t sak) {
    std::vector<double> row(N);
    for (int64_t i = 0; i < M; ++i) {
        std::fill(row.begin(), row.end(), 0.0);
        for (int64_t k = 0; k < K; ++k) {
            const double av = (double)A[i * sam + k * sak];
            for (int64_t j = 0; j < N; ++j) row[j] += av * (double)B[k * N + j];
        }
        for (int64_t j = 0; j < N; ++j) C[i * N + j] = (float)row[j];
    }
}

void launch(const float* in, float* out, int64_t outer, int64_t R, cudaStream_t stream) {
    red_kernel<<<(unsigned int)std::min<int64_t>(outer, 65535), 256, 0, stream>>>(
        in, out, outer, R);
}
'''


def test_template_style_patterns() -> None:
    code = f'KERNELS = r"""{TEMPLATE_STYLE}"""\n'
    sites = {k: find_sites(code, k, "cuda") for k in GPU_KINDS}
    texts = {k: [code[:s.start] + s.replacement + code[s.end:] for s in v]
             for k, v in sites.items()}
    assert any("off = 8;" in t for t in texts["wrong_stride"])  # warp shuffle start offset
    assert any("A[i * sak + k * sam]" in t for t in texts["wrong_stride"])  # swapped strides
    assert any("threadIdx.x * (int64_t)blockDim.x + blockIdx.x" in t
               for t in texts["wrong_index"])
    assert any("std::min<int64_t>(outer, 65535), 2048, 0, stream>>>" in t
               for t in texts["bad_launch_config"])
    gpu_uninit = mutate_code(code, "uninit_accumulator", "cuda")
    # only the running sum loses its zero; the running max keeps its -inf
    assert gpu_uninit is not None and "sm_acc m = -INFINITY, s;" in gpu_uninit.after
    cpu = [mutate_code(code, "uninit_accumulator", "cpu", i) for i in range(4)]
    descriptions = [m.description for m in cpu if m is not None]
    assert any("no longer reset" in d for d in descriptions)  # std::fill removed
    assert any("carries over" in d for d in descriptions)  # m, s hoisted out of the o-loop
    # loop variables and call arguments are never taken for accumulators
    assert not any("`j`" in m.description or "`r`" in m.description for m in cpu if m)


def test_kinds_are_dealt_least_used_first() -> None:
    # eight correct sampled kernels that differ only in a comment: each gets one mutant, and
    # the kinds go round instead of the commonest (a cast, a bound) repeating
    cands, verdicts = [], []
    for i in range(8):
        code = CPU_CANDIDATE + f"\n# copy {i}\n"
        c = Candidate(candidate_id=Candidate.make_id("t1", "cpu", code), task_id="t1",
                      backend="cpu", generator="import:demo", code=code)
        cands.append(c)
        verdicts.append(Verdict(candidate_id=c.candidate_id, task_id="t1",
                                status="correct_slow", stage="done", backend="cpu"))
    out = mutate_candidates([_task()], cands, verdicts, GenerateConfig(mutations_per_kernel=1))
    kinds = [m.generator.removeprefix("mutate:") for m in out]
    applicable = [k for k in kinds_for("cpu") if mutate_code(CPU_CANDIDATE, k, "cpu")]
    assert len(kinds) == 8
    assert max(kinds.count(k) for k in kinds) <= -(-8 // len(applicable))
    assert len(set(kinds)) == min(8, len(applicable))


def test_review_rows_spread_bug_kinds() -> None:
    from pipeline.datasets.analysis_rows import spread_kinds

    rows = (["wrong_cast"] * 6 + ["off_by_one"] * 4 + ["wrong_init"] * 3
            + ["grid_rounding", "wrong_stride"] * 2 + ["broadcast_stride"])
    kept = spread_kinds(rows, lambda r: r)
    assert all(kept.count(k) * 10 <= 3 * len(kept) for k in kept)  # none over 30%
    shallow = kept.count("wrong_cast") + kept.count("off_by_one")
    assert 0 < shallow * 10 < 4 * len(kept)  # casts and bounds together under 40%
    assert set(kept) == set(rows) and kept.count("wrong_init") == 3  # only the excess goes
    rest = iter(rows)
    assert all(k in rest for k in kept)  # a subsequence: rows keep their order
    # fewer kinds than a 30% spread needs: left alone; rows of no kind are kept, not counted
    assert spread_kinds(["wrong_cast"] * 4 + ["off_by_one"], lambda r: r) == \
        ["wrong_cast"] * 4 + ["off_by_one"]
    mixed = [None] * 5 + ["a", "b", "c", "d", "a"]
    assert spread_kinds(mixed, lambda r: r, shallow=()) == [None] * 5 + ["a", "b", "c", "d"]


def test_kernels_whose_mutants_verified_correct_get_other_kinds() -> None:
    cand = Candidate(candidate_id=Candidate.make_id("t1", "cpu", CPU_CANDIDATE), task_id="t1",
                     backend="cpu", generator="template:reduction/omp", code=CPU_CANDIDATE)
    ok = Verdict(candidate_id=cand.candidate_id, task_id="t1", status="correct_slow",
                 stage="done", backend="cpu")
    cfg = GenerateConfig(mutations_per_kernel=1, mutation_rounds=3)
    first = mutate_candidates([_task()], [cand], [ok], cfg)
    assert len(first) == 1
    # not judged yet, or failing: no new mutant
    assert mutate_candidates([_task()], [cand, *first], [ok], cfg) == []
    failed = Verdict(candidate_id=first[0].candidate_id, task_id="t1", status="incorrect",
                     stage="correctness", backend="cpu")
    assert mutate_candidates([_task()], [cand, *first], [ok, failed], cfg) == []
    # verified correct (the edit changed nothing at these sizes): another kind, then the cap
    made, verdicts = list(first), [ok]
    for _ in range(2):
        verdicts += [Verdict(candidate_id=m.candidate_id, task_id="t1", status="correct_slow",
                             stage="done", backend="cpu") for m in made[-1:]]
        more = mutate_candidates([_task()], [cand, *made], verdicts, cfg)
        assert len(more) == 1 and more[0].candidate_id not in {m.candidate_id for m in made}
        made += more
    assert len({m.generator for m in made}) == 3  # untried kinds go first
    verdicts.append(Verdict(candidate_id=made[-1].candidate_id, task_id="t1",
                            status="correct_slow", stage="done", backend="cpu"))
    assert mutate_candidates([_task()], [cand, *made], verdicts, cfg) == []  # 1 x 3 rounds


def test_only_the_fastest_template_variant_of_a_task_is_mutated() -> None:
    cands, verdicts = [], []
    for i, speedup in enumerate((0.5, 2.0, 1.1)):
        code = CPU_CANDIDATE + f"\n# variant {i}\n"
        c = Candidate(candidate_id=Candidate.make_id("t1", "cpu", code), task_id="t1",
                      backend="cpu", generator=f"template:reduction/cpu-v{i}", code=code)
        cands.append(c)
        verdicts.append(Verdict(candidate_id=c.candidate_id, task_id="t1", status="correct_fast",
                                stage="done", backend="cpu", speedup=speedup))
    out = mutate_candidates([_task()], cands, verdicts, GenerateConfig(mutations_per_kernel=1))
    assert len(out) == 1
    assert out[0].meta_dict()["fix_candidate_id"] == cands[1].candidate_id
