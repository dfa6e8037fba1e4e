"""Convolution as an implicit GEMM on the fp32 GEMM kernels of sgemm.py (CUDA, fp32).

Per group: C (out-channels of the group x output positions) = W (cog x cig*Kd*Kh*Kw, the weight
as stored) @ X', where X' (k, p) is gathered from the input on the fly (im2col without the
buffer): k decodes to (ci, kd, kh, kw), p to (n, od, oh, ow), and a position outside the padded
input reads 0. Consecutive threads gather consecutive output positions (neighbouring `ow`), so
the gather coalesces for stride 1. A transposed convolution is the same GEMM: its weight
(Ci, Co/groups, k...) read as (co, (ci, k...)), and an input position enters where
(o + pad - k * dil) divides by the stride. The store writes NCDHW directly, with the bias (and any fused
elementwise epilogue) applied in registers. Direct loops do a multiply-add per load; here each
value in shared memory feeds 8 (SGEMM) or 16-32 (3xTF32 tensor cores) multiply-adds.
"""

from __future__ import annotations

from pipeline.candidates.templates import sgemm

GEOM = r"""
struct K_CG {
    int Ci, Co, Di, Hi, Wi, Do, Ho, Wo, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw, dd, dh, dw;
    int cig, cog, KK, S, NP;  // Ci/groups, Co/groups, cig*Kd*Kh*Kw, Do*Ho*Wo, N*S
};

// X'(k, p) for k0 + k, p0 + r: consecutive threads take consecutive positions p (rows first),
// matching K_stash's layout for a k-strided operand.
template <int ROWS, int BK, int PER>
__device__ __forceinline__ void K_gather(const float* __restrict__ x, const K_CG& geo, int grp,
        int64_t p0, int64_t k0, float (&reg)[PER]) {
    #pragma unroll
    for (int l = 0; l < PER; ++l) {
        const int e = (int)threadIdx.x + l * 256;
        const int p = (int)p0 + e % ROWS, k = (int)k0 + e / ROWS;
        float v = 0.f;
        if (p < geo.NP && k < geo.KK) {
            int t = p;
            const int ow = t % geo.Wo; t /= geo.Wo;
            const int oh = t % geo.Ho; t /= geo.Ho;
            const int od = t % geo.Do; const int n = t / geo.Do;
            int u = k;
            const int kw = u % geo.Kw; u /= geo.Kw;
            const int kh = u % geo.Kh; u /= geo.Kh;
            const int kd = u % geo.Kd; const int ci = u / geo.Kd;
@INDEX@
            if (hit && id >= 0 && id < geo.Di && ih >= 0 && ih < geo.Hi && iw >= 0
                && iw < geo.Wi)
                v = x[(((int64_t)(n * geo.Ci + grp * geo.cig + ci) * geo.Di + id) * geo.Hi + ih)
                      * geo.Wi + iw];
        }
        reg[l] = v;
    }
}

// The transposed weight (Ci, Co/groups, Kd, Kh, Kw) read as A (co of the group, k = (ci, kdhw)):
// k fastest, as K_stash lays out a k-contiguous operand.
template <int ROWS, int BK, int PER>
__device__ __forceinline__ void K_wfetch(const float* __restrict__ w, const K_CG& geo, int grp,
        int64_t r0, int64_t k0, float (&reg)[PER]) {
    const int kdhw = geo.Kd * geo.Kh * geo.Kw;
    #pragma unroll
    for (int l = 0; l < PER; ++l) {
        const int e = (int)threadIdx.x + l * 256;
        const int r = (int)r0 + e / BK, k = (int)k0 + e % BK;
        reg[l] = (r < geo.cog && k < geo.KK)
            ? w[((int64_t)(grp * geo.cig + k / kdhw) * geo.cog + r) * kdhw + k % kdhw] : 0.f;
    }
}
"""

# Where output position (od, oh, ow) reads the input for kernel tap (kd, kh, kw).
INDEX = r"""            const int id = od * geo.sd - geo.pd + kd * geo.dd;
            const int ih = oh * geo.sh - geo.ph + kh * geo.dh;
            const int iw = ow * geo.sw - geo.pw + kw * geo.dw;
            const bool hit = true;"""
# transposed: output o takes input (o + pad - k * dil) / stride where that divides exactly
INDEX_T = r"""            const int td = od + geo.pd - kd * geo.dd, th = oh + geo.ph - kh * geo.dh;
            const int tw = ow + geo.pw - kw * geo.dw;
            const bool hit = td >= 0 && th >= 0 && tw >= 0 && td % geo.sd == 0
                             && th % geo.sh == 0 && tw % geo.sw == 0;
            const int id = td / geo.sd, ih = th / geo.sh, iw = tw / geo.sw;"""

PIECES = {
    "ARGS": ("const float* __restrict__ x, const float* __restrict__ w, "
             "const float* __restrict__ bias, C_T* __restrict__ out, K_CG geo"),
    "SETUP": ("const int grp = blockIdx.z;\n"
              "    const int64_t M = geo.cog, K = geo.KK;\n"
              "    const float* wg = w + (int64_t)grp * geo.cog * geo.KK;  // W rows of the group"),
    "FETCH": ("K_fetch<BM, BK, PER>(wg, K, 1, row0, @K@, M, K, ra);\n"
              "            K_gather<BM, BK, PER>(x, geo, grp, col0, @K@, rb);"),
    "STASH": ("K_stash<BM, BK, LD, PER>(As[@B@], 1, ra);\n"
              "            K_stash<BM, BK, LD, PER>(Bs[@B@], 0, rb);"),
    "STORE": ("if (r < M && c < geo.NP) {\n"
              "                const int64_t n = c / geo.S, co = (int64_t)grp * geo.cog + r;\n"
              "                float v = a;\n"
              "                if (bias) v += bias[co];\n"
              "                out[(n * geo.Co + co) * geo.S + (c - n * geo.S)] = (C_T)v;\n"
              "            }"),
}

# Transposed: the same GEMM with the transposed weight's A and the stride-divisibility gather.
PIECES_T = dict(PIECES, SETUP="const int grp = blockIdx.z;\n"
                "    const int64_t M = geo.cog, K = geo.KK;",
                FETCH="K_wfetch<BM, BK, PER>(w, geo, grp, row0, @K@, ra);\n"
                "            K_gather<BM, BK, PER>(x, geo, grp, col0, @K@, rb);")

HOST = r"""
void NAME(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor out, bool has_bias,
          std::vector<int64_t> d) {
    // d: N, Ci, Co, Di, Hi, Wi, Do, Ho, Wo, Kd, Kh, Kw, stride, padding, dilation (d/h/w), groups
    const int64_t cig = d[1] / d[21], cog = d[2] / d[21], S = d[6] * d[7] * d[8];
    TORCH_CHECK(d[0] * S < INT32_MAX && x.numel() < INT32_MAX, "implicit GEMM: 32-bit indices");
    K_CG geo{(int)d[1], (int)d[2], (int)d[3], (int)d[4], (int)d[5], (int)d[6], (int)d[7],
             (int)d[8], (int)d[9], (int)d[10], (int)d[11], (int)d[12], (int)d[13], (int)d[14],
             (int)d[15], (int)d[16], (int)d[17], (int)d[18], (int)d[19], (int)d[20], (int)cig,
             (int)cog, (int)(cig * d[9] * d[10] * d[11]), (int)S, (int)(d[0] * S)};
    dim3 grid((unsigned int)((geo.NP + TILE - 1) / TILE), (unsigned int)((cog + TILE - 1) / TILE),
              (unsigned int)d[21]);
    K_kernel<<<grid, 256, 0, KS_STREAM>>>((const float*)x.data_ptr(), (const float*)w.data_ptr(),
        has_bias ? (const float*)bias.data_ptr() : nullptr, (C_T*)out.data_ptr(), geo);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

# Out-channels per group below this leave most of a 64-row tile idle (depthwise: 1 row of 64);
# the direct templates serve those.
MIN_COG = 16


def choose(variant: int, dtypes: tuple[str, str], transposed: bool, cog: int,
           outputs: int) -> tuple[str, int, bool] | None:
    """(kind, tile, transposed) of this variant's implicit GEMM, or None to keep the direct
    templates."""
    if dtypes != ("float32", "float32") or cog < MIN_COG:
        return None
    tile = 128 if cog > 64 and outputs >= sgemm.BIG else 64
    if variant % 3 == 2:
        return "tf32x3", tile, transposed
    if variant % 3 == 0 and outputs >= sgemm.BIG:
        return "sgemm128", 128, transposed
    return None


def device_text(kind: str, tile: int, transposed: bool = False) -> str:
    """The device part (prefix K_, C_T open): geometry, gathers and the GEMM kernel."""
    geom = GEOM if transposed else GEOM[:GEOM.index("// The transposed weight")]
    geom = geom.replace("@INDEX@", INDEX_T if transposed else INDEX)
    return geom + sgemm.device_text(kind, tile, PIECES_T if transposed else PIECES)


def template(kind: str, tile: int, transposed: bool = False) -> tuple[str, str, str]:
    """(CUDA text with K_/C_T/NAME open, how it works for the reasoning, variant name)."""
    src = device_text(kind, tile, transposed) + HOST.replace("TILE", str(tile))
    core = ("128x128 SGEMM tiles with an 8x8 register micro-tile per thread" if kind == "sgemm128"
            else f"3xTF32 tensor-core tiles of {tile}x{tile} (mma.sync m16n8k8, fp32-accurate)")
    weight = ("the transposed weight read as (out-channel, in-channel x kernel)" if transposed
              else "the weight as stored")
    how = (f"an implicit GEMM per group: {weight} is the A operand, the input patches "
           "are gathered into shared memory on the fly (no im2col buffer), with " + core
           + ", double-buffered shared memory, and the NCDHW store with the bias in registers")
    return src, how, f"igemm_{kind}_{tile}"
