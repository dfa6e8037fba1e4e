"""Red-team round 5: worker bodies for the sampling clock (tests/verifier/test_ip_sampler.py's
harness: a real process serving the judge's windows over its FIFOs).

Each is the `setup` of that worker: it defines `call(x)` and writes one line per call, "<mode>
<seconds>", to LOG, a file the judge never reads: what the calls really ran, for the test to
hold against the judge's verdict. SPIN is the run's own object (a loop of known cost),
`OWN_N` its count per call.
"""

from __future__ import annotations

from sampler_cases import pad_to

COMMON = """
import json, resource, shutil, time
import numpy as np
LOG = open({log!r}, "w")
lib = ctypes.CDLL({spin!r})  # the run's own object: loaded, as an extension is
lib.spin.argtypes, lib.spin.restype = [ctypes.c_long], ctypes.c_double
a = np.random.rand(200, 200)


def note(mode, t0):
    LOG.write(f"{{mode}} {{time.perf_counter() - t0}}\\n")
    LOG.flush()
"""

# Computes with numpy's BLAS until it sees a stop it never asked for: a ptrace stop is a
# voluntary context switch of the stopped thread (getrusage(RUSAGE_THREAD).ru_nvcsw), which a
# call that makes no system call never has. The sampling windows come after the timed ones, so
# from the first stop on every window is sampled: it computes in its own object from then on.
TRACER_AWARE = COMMON + """
watched = [False]
c = np.empty_like(a)


def call(x):
    t0 = time.perf_counter()
    if watched[0]:
        lib.spin({own_n})
        return note("own", t0)
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    np.matmul(a, a, out=c)  # into memory it has: no allocation, no system call
    if resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw != before:
        watched[0] = True
    note("lib", t0)
"""

# The library's object copied under a name of no library (its dependencies are loaded already,
# by numpy): every sample of its compute lands in a file outside site-packages whose name says
# nothing of BLAS, which the sampler counted as overhead (not compute), so too few compute
# samples were left to judge, and the run was never a fallback.
RENAMED_LIBRARY = COMMON + """
import numpy.linalg  # openblas and its gfortran are loaded by soname: the copy finds them
src = next(p for p in __import__("glob").glob(np.__path__[0] + "/../numpy.libs/*openblas*"))
shutil.copy(src, "libks_helper.so")
blas = ctypes.CDLL(__import__("os").path.abspath("libks_helper.so"))
gemm = blas.scipy_cblas_dgemm64_
L, D, P = ctypes.c_long, ctypes.c_double, ctypes.c_void_p
gemm.argtypes = [L, L, L, L, L, L, D, P, L, P, L, D, P, L]
c = np.empty_like(a)


def call(x):
    t0 = time.perf_counter()
    n = a.shape[0]
    gemm(101, 111, 111, n, n, n, 1.0, a.ctypes.data, n, a.ctypes.data, n, 0.0, c.ctypes.data, n)
    note("lib", t0)
"""

# numpy's BLAS does the work; the own object spins for 30% of that time after it, so its
# share of the compute samples is ~23%: under the 85% library share the rule allowed.
PADDED_CALL = """

def call(x):
    t0 = time.perf_counter()
    a @ a
    lib.spin(pad)
    note("padded", t0)
"""
PADDED = COMMON + pad_to("lambda: a @ a", 0.3) + PADDED_CALL

# The same, its own object spinning for half the library's time: ~33% of the compute samples.
PADDED_HALF = COMMON + pad_to("lambda: a @ a", 0.5) + PADDED_CALL

# The same copy, under the file name of the run's own object (in a folder of its own): the
# sampler knew its own objects by name only, so the library's samples were the candidate's.
OWN_NAMED_LIBRARY = RENAMED_LIBRARY.replace(
    'shutil.copy(src, "libks_helper.so")\nblas = ctypes.CDLL(__import__("os").path.abspath('
    '"libks_helper.so"))',
    '__import__("os").makedirs("alias", exist_ok=True)\n'
    'shutil.copy(src, "alias/" + __import__("os").path.basename({spin!r}))\n'
    'blas = ctypes.CDLL(__import__("os").path.abspath("alias/" + '
    '__import__("os").path.basename({spin!r})))')
assert OWN_NAMED_LIBRARY != RENAMED_LIBRARY
