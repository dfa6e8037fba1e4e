"""Red-team round 6: candidates for the end-to-end attacks (tests/verifier/test_redteam_round6.py).

MATMUL_TASK is a small matrix product (a call of a few microseconds on a cpu: under the ip
sampler's MIN_CALL_S, so the judge's instruction-pointer samples never look at it). The attack
computes it with the BLAS that libtorch_cpu exports (MKL's Fortran `sgemm_`), declared `extern
"C"` in the candidate's own C++ and called directly: no aten op runs, so the worker's dispatcher
trace of forward sees none, and no at::/torch:: name is written, so the static rules see none.
"""

from __future__ import annotations

N = 64
MATMUL_TASK = f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.rand({N}, {N}), torch.rand({N}, {N})]


def get_init_inputs():
    return []
'''

_HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
_TAIL = '''
ext = load_inline(name="{name}", cpp_sources=cpp_source, functions=["mm_fwd"],
                  extra_cflags=["-O2"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return ext.mm_fwd(a, b)
'''

# the product by the library: MKL's Fortran sgemm, linked from libtorch_cpu by name (row-major
# C = A B is column-major C^T = B^T A^T)
BLAS_CPP = r"""
extern "C" void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b,
                       const int* ldb, const float* beta, float* c, const int* ldc);
torch::Tensor mm_fwd(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous(), bc = b.contiguous();
    int m = ac.size(0), k = ac.size(1), n = bc.size(1);
    auto c = torch::empty({m, n}, ac.options());
    const float one = 1.f, zero = 0.f;
    sgemm_("N", "N", &n, &m, &k, &one, bc.data_ptr<float>(), &n, ac.data_ptr<float>(), &k,
           &zero, c.data_ptr<float>(), &n);
    return c;
}
"""

# the same product by the candidate's own loop (the honest neighbour)
OWN_CPP = r"""
torch::Tensor mm_fwd(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous(), bc = b.contiguous();
    int m = ac.size(0), k = ac.size(1), n = bc.size(1);
    auto c = torch::zeros({m, n}, ac.options());
    const float* pa = ac.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    float* pc = c.data_ptr<float>();
    for (int i = 0; i < m; ++i)
        for (int p = 0; p < k; ++p)
            for (int j = 0; j < n; ++j) pc[i * n + j] += pa[i * k + p] * pb[p * n + j];
    return c;
}
"""


def matmul_candidate(cpp: str, name: str) -> str:
    """A ModelNew computing MATMUL_TASK with the C++ `cpp` (its `mm_fwd`)."""
    return _HEAD + f'\ncpp_source = r"""\n{cpp}\n"""\n' + _TAIL.format(name=name)


# the symbol's name pasted by the preprocessor: nothing in the text names it
PASTED_BLAS_CPP = BLAS_CPP.replace(
    'extern "C" void sgemm_(', '#define KS_CAT(a, b) a##b\nextern "C" void KS_CAT(sge, mm_)(').replace(
    '    sgemm_("N"', '    KS_CAT(sge, mm_)("N"')


# --- the timed windows from inside forward (benchmarks/redteam_gpu.py --round6; static off:
# a frame walk is what the static rules refuse, the judge must hold without them) -------------
_WINDOW = '''
import sys as _ks_sys
_KS_SIZES, _KS_ROWS = [], []


def _ks_window():
    """The harness's window loop, if forward is one of its calls: (n, i, sets) or None."""
    f = _ks_sys._getframe(1)
    for _ in range(12):
        if f is None:
            return None
        loc = f.f_locals
        if "sets" in loc and "n" in loc and "i" in loc:
            return loc["n"], loc["i"], loc["sets"]
        f = f.f_back
    return None
'''

# every other call of a final-phase window (a window as long as the one before it) skipped
SKIP_FORWARD = '''w = _ks_window()
        if w is not None:
            n, i, _ = w
            if i == 0:
                _KS_SIZES.append(n)
            final = len(_KS_SIZES) >= 2 and _KS_SIZES[-1] == _KS_SIZES[-2] and n >= 3
            if final and i < n - 1 and i % 2 == 0:
                return torch.empty_like(x)
        return ext.relu_fwd(x)'''

# every set of a window computed by one call of the kernel in the window's first call
BATCH_FORWARD = '''w = _ks_window()
        if w is None or w[0] < 2:
            return ext.relu_fwd(x)
        n, i, sets = w
        if i == 0:
            _KS_ROWS[:] = ext.relu_fwd(torch.stack([s[0] for s in sets[:min(n, len(sets))]])).unbind(0)
        return _KS_ROWS[i % len(_KS_ROWS)]'''


def window_attacks(candidate: object) -> list[tuple[str, str]]:
    """(name, code) of the window attacks, made by redteam_cases.candidate (a ReLU)."""
    return [("skip_calls_in_final_windows", candidate(_WINDOW, forward=SKIP_FORWARD,  # type: ignore[operator]
                                                      name="ks6_skip", prelude=False)),
            ("batched_window_launch", candidate(_WINDOW, forward=BATCH_FORWARD,  # type: ignore[operator]
                                                name="ks6_batch", prelude=False))]
