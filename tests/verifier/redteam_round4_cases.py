"""Red-team round 4 (issue 28 follow-up): candidates that compute a correct ReLU while trying a
way around the judge that the earlier rounds (redteam_cases.py) did not try.

Each entry is (name, class, code). Every candidate passes `extract` and is meant to pass the
static checks of the current main; what it does at run time is in its comment. An attack that
gets through on a channel the observer cannot see reports itself by raising `ESCAPED:<what>`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from redteam_cases import RELU, candidate  # noqa: E402
from verifier_cases import relu_task  # noqa: E402

# --- fallback hidden from the worker's dispatcher trace ----------------------------------------
# numpy computes without any aten op: the trace of forward holds none, the profiler neither, so
# the strict policy finds nothing, and the extension need not run at all.
NUMPY_HELPER = '''
import numpy as np


def _np_relu(x):  # a helper outside ModelNew: the static torch_compute rule reads only its methods
    return torch.from_numpy(np.maximum(x.numpy(), 0))
'''

# numpy without importing it: torch's own modules hold it (torch.storage.np, F.np, ...), numpy
# takes a cpu tensor through __array__, and torch.as_tensor (an allocation) takes the result
# back; the tensor-method rule reads `.maximum` under a `torch.` head as torch's.
TORCH_NP = """
def _np_relu(x):
    return torch.as_tensor(torch.storage.np.maximum(x, 0))
"""

# torch's own helper pops every dispatch mode (the verifier's trace among them) for its block.
DISABLE_MODES = '''
from torch.utils._python_dispatch import _disable_current_modes


def _hidden(x, f=torch.relu):  # torch.relu as a default value: no call of torch.relu is written
    with _disable_current_modes():
        return f(x)
'''

# C++: a namespace alias of at:: hides the op from the `at::`/`torch::` rule, and excluding the
# Python dispatch keys hides it from the trace (the profiler sees it in the trials and the timed
# calls alike, so "timed ops the trials did not run" stays empty).
KEYGUARD_CPP = r"""
#include <c10/core/impl/LocalDispatchKeySet.h>
namespace K = at;
torch::Tensor relu_fwd(torch::Tensor x) {
    c10::impl::ExcludeDispatchKeyGuard g1(c10::DispatchKeySet(c10::DispatchKey::Python));
    c10::impl::ExcludeDispatchKeyGuard g2(
        c10::DispatchKeySet(c10::DispatchKey::PythonTLSSnapshot));
    return K::relu(x);
}
"""

# The control: the same alias without the guard. The trace sees aten::relu (a cheat).
ALIAS_ONLY_CPP = r"""
namespace K = at;
torch::Tensor relu_fwd(torch::Tensor x) {
    return K::relu(x);
}
"""

# C++ reaches the interpreter through a namespace alias of pybind11 (the rule names `py::` and
# `pybind11::` only) and turns the worker's fallback classifier off; torch.relu then runs
# traced, and nothing is called a fallback.
PYBIND_ALIAS_CPP = r"""
#include <pybind11/eval.h>
namespace q = pybind11;
torch::Tensor relu_fwd(torch::Tensor x) {
    static bool patched = false;
    if (!patched) {
        patched = true;
        q::exec("import verifier.checks.fallback as f\nf.is_fallback = lambda kind: False\n");
    }
    return q::module_::import("torch").attr("relu")(x).cast<torch::Tensor>();
}
"""

# --- timing: more cores than the judge's one thread --------------------------------------------
# The job runs with one thread (torch.set_num_threads(1), OMP_NUM_THREADS=1) and the eager
# baseline with one; OpenMP's num_threads clause asks for more. If the run's cpus allow it, the
# kernel's wall time divides by the cores it takes. The probe reports what it got.
OMP_PROBE_CPP = r"""
#include <omp.h>
#include <string>
torch::Tensor relu_fwd(torch::Tensor x) {
    int used = 1;
    #pragma omp parallel num_threads(8)
    {
        #pragma omp single
        used = omp_get_num_threads();
    }
    if (used > 1 && omp_get_num_procs() > 1)
        throw std::runtime_error("ESCAPED:openmp ran " + std::to_string(used) + " threads on "
                                 + std::to_string(omp_get_num_procs()) + " cpus");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""

# --- builds and files: a libc function by its address ------------------------------------------
# The C++ escape rule matches calls (`fopen(`); a pointer to fopen calls it all the same. The
# files are named *.so: the run's disk total leaves .so files out (its own extensions). 180 MB
# written in full (over the 128 MB a run may write) and a correct verdict: the bound missed it.
FOPEN_POINTER_CPP = RELU.replace("torch::Tensor relu_fwd(torch::Tensor x) {", r"""#include <cstdio>
#include <string>
#include <vector>
static void ks_fill() {
    static int once = 0;
    if (once++) return;
    auto op = &::fopen;
    std::vector<char> mb(1 << 20, 'z');
    for (int f = 0; f < 3; ++f) {
        char name[32];
        snprintf(name, sizeof(name), "ks_fill%d.so", f);
        FILE* fh = op(name, "wb");
        if (!fh) throw std::runtime_error("KS-HELD: fopen by pointer failed");
        size_t wrote = 0;
        for (int i = 0; i < 60; ++i) wrote += fwrite(mb.data(), 1, mb.size(), fh);
        if (fclose(fh) != 0 || wrote != mb.size() * 60)  // a bound that holds: ENOSPC/EFBIG
            throw std::runtime_error("KS-HELD: short write of ks_fill" + std::to_string(f));
    }
}
torch::Tensor relu_fwd(torch::Tensor x) {
    ks_fill();""")

# --- a verdict of a batch-mate: a lone surrogate in a comment ----------------------------------
# Valid JSON ("\ud800") and valid Python (in a comment), but no UTF-8 can encode it: every file
# the verifier writes the candidate into fails to encode.
SURROGATE_TAIL = "# \ud800 a lone surrogate\n"


def attacks() -> list[tuple[str, str, str]]:
    """(name, class, candidate source) of every round-4 attack run end to end."""
    return [
        ("numpy_relu_helper", "fallback: another library",
         candidate(NUMPY_HELPER, forward="return _np_relu(x)", name="npfb", prelude=False,
                   cflags='["-O2", "-DKS_R4_NUMPY"]')),
        ("numpy_via_torch_module", "fallback: another library, reached through torch",
         candidate(TORCH_NP, forward="return _np_relu(x)", name="torchnp", prelude=False,
                   cflags='["-O2", "-DKS_R4_TORCHNP"]')),
        ("disable_modes_relu", "fallback: dispatch mode popped",
         candidate(DISABLE_MODES, forward="return _hidden(x)", name="popmode", prelude=False,
                   cflags='["-O2", "-DKS_R4_POP"]')),
        ("cpp_keyguard_relu", "fallback: C++ dispatch keys excluded",
         candidate(cpp=KEYGUARD_CPP, name="keyguard", prelude=False,
                   cflags='["-O2", "-DKS_R4_GUARD"]')),
        ("cpp_alias_traced", "fallback: C++ namespace alias (control)",
         candidate(cpp=ALIAS_ONLY_CPP, name="aliasonly", prelude=False,
                   cflags='["-O2", "-DKS_R4_ALIAS"]')),
        ("pybind_alias_patch", "introspection: C++ into the interpreter",
         candidate(cpp=PYBIND_ALIAS_CPP, name="pyalias", prelude=False,
                   cflags='["-O2", "-DKS_R4_PYBIND"]')),
        ("omp_more_cores", "timing: work in other threads",
         candidate(cpp=OMP_PROBE_CPP, name="ompcores", prelude=False,
                   cflags='["-O2", "-fopenmp", "-DKS_R4_OMP"]')),
        ("fopen_pointer_so", "files: libc by address, disk total",
         candidate(cpp=FOPEN_POINTER_CPP, name="fopenptr", prelude=False,
                   cflags='["-O2", "-DKS_R4_FOPEN"]')),
    ]


def surrogate_candidate(base: str) -> str:
    """`base` (a correct candidate) with a lone surrogate in a trailing comment."""
    return base + SURROGATE_TAIL


# --- a batch-mate's process: an aten kernel registered from a static initializer ----------------
# Candidates with the same flags and headers share one shared object (one translation unit per
# batch unit), and every worker that runs one of them loads all of it: a batch-mate's static
# registrations run in the honest candidate's process. This one registers a CPU kernel for
# aten::relu that returns zeros: the honest worker's own reference (torch.relu) is wrong there,
# its trials "fail", and a worker's "incorrect" is not checked again by the parent.
OVERRIDE_CPP = RELU + r"""
static at::Tensor ks_zero_relu(const at::Tensor& x) { return torch::zeros_like(x); }
TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("relu", ks_zero_relu); }
"""
BATCHMATE_FLAGS = '["-O1", "-DKS_R4_BATCH"]'


def override_pair(tag: str) -> list[tuple[str, str]]:
    """The aten::relu override and an honest batch-mate with the same flags and headers (one
    unit), fresh per `tag` so neither comes from the build cache."""
    fresh = f"static int ks_fresh_{tag} = 0;\n"
    return [("aten_override_batchmate", candidate(cpp=OVERRIDE_CPP + fresh, name=f"ovr_{tag}",
                                                  prelude=False, cflags=BATCHMATE_FLAGS)),
            ("batchmate_victim", candidate(cpp=RELU + fresh, name=f"victim_{tag}",
                                           prelude=False, cflags=BATCHMATE_FLAGS))]


# --- timing: work only for the output the judge checks --------------------------------------------
# The judge checks a window's last output only. Timed inputs are views of its arena (`_base`
# set; a trial's input is a fresh clone), and a window of n calls uses the sets in order from the
# first: a forward that counts calls from the first set's address and returns an empty tensor for
# all but the last call of a window as long as the longest it saw is timed at about 1/n of its
# cost. Measured (cpu, SMALL_TASK, one verify_batch, tests/verifier/test_redteam_round4.py has
# the strict unit form): honest 303.6 us, speedup 0.097, correct_slow; this 20.7 us, speedup
# 1.43, correct_fast (31 calls a window over 31 sets).
SMALL_TASK = relu_task(64, 1024)
LAST_ONLY = '''
_seen = {"first": None, "idx": 0, "longest": 0}


def last_only(x):
    if x._base is None:  # a trial's fresh clone
        return ext.relu_fwd(x)
    if _seen["first"] is None:
        _seen["first"] = x.data_ptr()
    if x.data_ptr() == _seen["first"]:  # a window starts at the first set
        _seen["longest"] = max(_seen["longest"], _seen["idx"])
        _seen["idx"] = 0
    _seen["idx"] += 1
    if _seen["idx"] >= _seen["longest"]:
        return ext.relu_fwd(x)
    return torch.empty_like(x)
'''


def last_only_candidate() -> str:
    """The skip-all-but-the-last-call candidate (for SMALL_TASK)."""
    return candidate(LAST_ONLY, forward="return last_only(x)", name="lastonly", prelude=False,
                     cflags='["-O2", "-DKS_R4_LAST"]')
