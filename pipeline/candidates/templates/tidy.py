"""Only the code a candidate needs: preprocessor switches resolved, headers and macros by use.

Family templates share text across variants through `#define FLAG 0|1` and `#if FLAG` blocks;
an answer that teaches must not carry the branch it never takes, nor a macro, include or helper
it never uses. These functions rewrite the final C++ so what remains is exactly what runs.
"""

from __future__ import annotations

import re

_DEFINE_FLAG = re.compile(r"^\s*#define\s+(\w+)\s+([01])\s*$")
_IF = re.compile(r"^\s*#(if|elif)\s+(\w+)\s*$")


def resolve_switches(src: str) -> str:
    """Evaluate `#if/#elif/#else/#endif` on 0/1 literals and 0/1 flag macros; drop the flags."""
    flags: dict[str, str] = {}
    out: list[str] = []
    stack: list[list[bool]] = []  # [emitting, a branch was already taken, resolvable]
    for line in src.splitlines():
        m = _DEFINE_FLAG.match(line)
        if m and all(f[0] for f in stack):
            flags[m.group(1)] = m.group(2)
            continue
        if re.match(r"^\s*#undef\s+(\w+)\s*$", line) and line.split()[1] in flags:
            continue
        m = _IF.match(line)
        if m:
            word = m.group(2)
            value = flags.get(word, word if word in ("0", "1") else None)
            if value is None:
                raise ValueError(f"kernel text switches on an unknown macro: {line.strip()}")
            if m.group(1) == "if":
                stack.append([value == "1", value == "1"])
            else:
                take = not stack[-1][1] and value == "1"
                stack[-1] = [take, stack[-1][1] or take]
            continue
        if re.match(r"^\s*#else\b", line):
            stack[-1] = [not stack[-1][1], True]
            continue
        if re.match(r"^\s*#endif\b", line):
            stack.pop()
            continue
        if all(f[0] for f in stack):
            out.append(line)
    return "\n".join(out) + ("\n" if src.endswith("\n") else "")


def drop_unused_macros(src: str) -> str:
    """Remove `#define NAME ...` lines whose NAME never appears elsewhere."""
    lines = src.splitlines()
    keep = []
    for i, line in enumerate(lines):
        m = re.match(r"^\s*#define\s+(\w+)", line)
        if m:
            rest = "\n".join(lines[:i] + lines[i + 1:])
            if not re.search(rf"\b{m.group(1)}\b", rest):
                continue
        keep.append(line)
    return "\n".join(keep) + ("\n" if src.endswith("\n") else "")


CUDA_INCLUDES = [
    ("#include <torch/extension.h>", None),
    ("#include <c10/cuda/CUDAStream.h>", r"KS_STREAM|getCurrentCUDAStream"),
    ("#include <c10/cuda/CUDAException.h>", r"C10_CUDA_KERNEL_LAUNCH_CHECK"),
    ("#include <cuda_fp16.h>", r"__half|__float2half|__half2float"),
    ("#include <cuda_bf16.h>", r"__nv_bfloat16|__float2bfloat16|__bfloat162float"),
    ("#include <mma.h>", r"wmma::"),
    ("#include <cstdint>", None),
    ("#include <cmath>", None),
    ("#include <cfloat>", r"FLT_MAX|DBL_MAX|FLT_MIN|DBL_MIN|FLT_EPSILON"),
]
CPU_INCLUDES = [
    ("#include <torch/extension.h>", None),
    ("#include <cstdint>", None),
    ("#include <cmath>", None),
    ("#include <cfloat>", r"FLT_MAX|DBL_MAX|FLT_MIN|DBL_MIN|FLT_EPSILON"),
    ("#include <algorithm>", r"std::(min|max|fill|sort|copy|swap)\b"),
    ("#include <vector>", r"std::vector"),
]
CUDA_MACROS = [
    ("#define HD __host__ __device__ __forceinline__", r"\bHD\b"),
    ("#define KS_STREAM c10::cuda::getCurrentCUDAStream()", r"\bKS_STREAM\b"),
]
KS_BLOCKS = r"""
// Grid size for a grid-stride loop: enough blocks to fill the GPU, capped so huge tensors loop.
static inline unsigned int ks_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned int)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}
"""


def header(body: str, cuda: bool) -> str:
    """The includes, macros and shared helpers that `body` uses, nothing else."""
    lines = [inc for inc, use in (CUDA_INCLUDES if cuda else CPU_INCLUDES)
             if use is None or re.search(use, body)]
    if cuda:
        lines += [m for m, use in CUDA_MACROS if re.search(use, body)]
    text = "\n".join(lines) + "\n"
    if cuda and re.search(r"\bks_blocks\s*\(", body):
        text += KS_BLOCKS
    return text


def cpu_inline(body: str) -> str:
    """CPU helpers are plain `inline` functions (the CUDA text's `HD` qualifier)."""
    return re.sub(r"\bHD\s+", "inline ", body)


# A target attribute on each kernel rather than -mprefer-vector-width=512 (not on the verifier's
# flag allowlist) or a `#pragma GCC target` (a pragma that reaches past the candidate's code
# keeps it out of a shared compile unit). Inline helpers and OpenMP's outlined loop bodies take
# the kernel's option; hosts without AVX-512 ignore it.
WIDE = '__attribute__((target("prefer-vector-width=512")))  // full-width vectors on AVX-512'


def wide_vectors(body: str) -> str:
    """Every top-level `void` kernel definition of `body` marked to use 512-bit vectors."""
    return re.sub(r"^(void \w+\()", WIDE + "\n\\1", body, flags=re.M)


# glibc's vector math library (libmvec, linked through libm's AS_NEEDED group) has 8- and
# 16-lane versions of these; declaring them `simd` lets `#pragma omp simd` loops call them.
VECTOR_MATH = ("expf", "logf", "log1pf", "expm1f", "tanhf", "sinf", "cosf", "erff", "exp2f",
               "log2f", "log10f", "tanf", "sinhf", "coshf", "atanf")


def vector_math(body: str) -> str:
    """`simd` declarations of the single-precision libm functions `body` calls."""
    used = [f for f in VECTOR_MATH if re.search(rf"\b{f}\s*\(", body)]
    if not used:
        return ""
    decls = "\n".join(f'extern "C" __attribute__((simd("notinbranch"))) float {f}(float) noexcept;'
                      for f in used)
    return ("// vector variants of the libm calls below (glibc libmvec), for the simd loops\n"
            + decls + "\n")


# fmaxf/fminf are library calls unless -ffinite-math-only, and GCC does not if-convert a select
# in a loop that also calls a vector math function, so either keeps a simd loop scalar. These
# bit-selects vectorise, and propagate a NaN as torch.maximum and clamp do.
_SELECT = """static inline {t} ks_{f}({t} a, {t} b) {{
    {i} ia, ib, r; {t} o;
    __builtin_memcpy(&ia, &a, sizeof a); __builtin_memcpy(&ib, &b, sizeof b);
    const {i} m = -({i})((a != a) | (a {op} b));
    r = (ia & m) | (ib & ~m);
    __builtin_memcpy(&o, &r, sizeof o); return o;
}}
"""
_SELECTS = {f: _SELECT.format(f=f, t=t, i=i, op=op) for f, t, i, op in (
    ("fmaxf", "float", "int32_t", ">"), ("fminf", "float", "int32_t", "<"),
    ("fmax", "double", "int64_t", ">"), ("fmin", "double", "int64_t", "<"))}


def vector_selects(body: str) -> tuple[str, str]:
    """`body` with fmax/fmin calls turned into inline selects, and the selects' definitions."""
    used = [f for f in _SELECTS if re.search(rf"(?<![\w:.]){f}\s*\(", body)]
    for f in used:
        body = re.sub(rf"(?<![\w:.]){f}(\s*\()", rf"ks_{f}\1", body)
    return body, "".join(_SELECTS[f] for f in used)


# The `simd_fastmath` strategy's exp and tanh: inline polynomials GCC vectorises at the full
# vector width (a libmvec call is an out-of-line function per vector; torch's own CPU exp is a
# polynomial too). exp: 2^n * 2^f with n = round(x * log2 e) (an int conversion, which
# -ffast-math cannot fold away) and a degree-6 minimax polynomial for 2^f on [-0.5, 0.5]:
# relative error about 2e-7 for x in [-87, 88] (clamped beyond, where fp32 under/overflows).
_FAST = {
    "expf": """static inline float ks_expf(float x) {
    x = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);
    const float t = x * 1.44269504088896341f;
    const int32_t n = (int32_t)(t + 128.5f) - 128;  // round(t): t + 128.5 > 0 truncates down
    const float f = t - (float)n;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    int32_t bits;
    __builtin_memcpy(&bits, &p, sizeof bits);
    bits += n * (1 << 23);  // scale by 2^n through the exponent field
    __builtin_memcpy(&p, &bits, sizeof p);
    return p;
}
""",
    "tanhf": """static inline float ks_tanhf(float x) {
    const float e = ks_expf(-2.0f * std::fabs(x));  // in (0, 1]: no overflow for large |x|
    return std::copysign((1.0f - e) / (1.0f + e), x);
}
""",
    # log1p: w = 1 + x split as 2^e * m with m in [sqrt(1/2), sqrt(2)) through the exponent
    # field, log m = 2 atanh(s) with s = (m - 1) / (m + 1) (|s| < 0.172: five odd terms reach
    # 1e-8); the rounding of 1 + x costs at most 6e-8 absolute, far inside fp32 tolerances
    "log1pf": """static inline float ks_log1pf(float x) {
    const float w = 1.0f + x;
    int32_t bits;
    __builtin_memcpy(&bits, &w, sizeof bits);
    const int32_t e = ((bits - 0x3f3504f3) >> 23);  // m = w / 2^e lands in [sqrt(1/2), sqrt(2))
    bits -= e * (1 << 23);
    float m;
    __builtin_memcpy(&m, &bits, sizeof m);
    const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    float p = 0.11111111111f;
    p = p * s2 + 0.14285714286f;
    p = p * s2 + 0.2f;
    p = p * s2 + 0.33333333333f;
    p = p * s2 + 1.0f;
    const float v = (float)e * 0.69314718056f + 2.0f * s * p;
    return w > 0.0f ? v : (w == 0.0f ? -INFINITY : NAN);  // log1p's own edge cases
}
""",
    # sin and cos: j = round(x * 2/pi), r = x - j * pi/2 in three parts (Cody-Waite), the
    # minimax polynomials of sin and cos on [-pi/4, pi/4] (Cephes' coefficients), and the
    # quadrant j mod 4 picks which one and its sign, with selects and no branch
    "sincosf": """static inline void ks_sincosf(float x, float* sn, float* cs) {
    const float j = __builtin_rintf(x * 0.63661977236758134f);
    const float r = ((x - j * 1.5703125f) - j * 4.837512969970703125e-4f)
                    - j * 7.54978995489188216e-8f;
    const float r2 = r * r;
    const float ps = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f
                                                              + r2 * -1.9515295891e-4f));
    const float pc = 1.0f - 0.5f * r2 + r2 * r2 * (4.166664568298827e-2f + r2 * (
        -1.388731625493765e-3f + r2 * 2.443315711809948e-5f));
    const int32_t q = (int32_t)(j - 4.0f * __builtin_floorf(j * 0.25f));  // j mod 4, in [0, 4)
    const float s = (q & 1) ? pc : ps, c = (q & 1) ? ps : pc;
    *sn = (q & 2) ? -s : s;
    *cs = ((q + 1) & 2) ? -c : c;
}
""",
    "sinf": """static inline float ks_sinf(float x) {
    float s, c;
    ks_sincosf(x, &s, &c);
    return s;
}
""",
    "cosf": """static inline float ks_cosf(float x) {
    float s, c;
    ks_sincosf(x, &s, &c);
    return c;
}
""",
}
_NEEDS = {"tanhf": ("expf",), "sinf": ("sincosf",), "cosf": ("sincosf",)}
_ORDER = ("expf", "tanhf", "log1pf", "sincosf", "sinf", "cosf")


def fast_math(body: str) -> tuple[str, str]:
    """`body` with expf/tanhf/log1pf/sinf/cosf calls turned into the inline polynomials, and
    their definitions (each after what it calls)."""
    used = {f for f in _FAST if f != "sincosf" and re.search(rf"(?<![\w:.]){f}\s*\(", body)}
    for f in used:
        body = re.sub(rf"(?<![\w:.]){f}(\s*\()", rf"ks_{f}\1", body)
    for f in list(used):
        used.update(_NEEDS.get(f, ()))
    return body, "".join(_FAST[f] for f in _ORDER if f in used)
