"""fp32 GEMMs that compete with cuBLAS: a 128x128 register-blocked SGEMM and a 3xTF32 tensor-core
GEMM, both for fp32 operands read through arbitrary strides (the matmul lowering's contract).

Torch's fp32 matmul does not use TF32, and the verifier compares fp32 outputs at atol = rtol =
1e-4, with an fp64 second opinion that accepts an output only when its error is 8x smaller than
that of inputs rounded to a 10-bit mantissa (`verifier/judge/device_compare.py`). Plain TF32 is
that rounding, so it fails; 3xTF32 splits each operand into a TF32 "big" part and a TF32 "small"
remainder and sums big*big + big*small + small*big on the tensor cores (the small*small term is
below fp32's rounding), which is fp32-accurate at about a third of the tensor cores' TF32 rate.

Each template is a device part (kernels, no torch) and the shared host launcher, so the tests can
run the very device text on the CPU (tests/pipeline/candidates/fake_cuda.py: threads as
std::threads, `__syncthreads` as a barrier, WMMA's TF32 fragments emulated). No inline PTX:
the verifier's static check refuses inline assembly in a candidate.
"""

from __future__ import annotations

import re

THREADS = 256

# Operand tiles: a ROWS x BK slice of an operand whose (row, k) element sits at
# P[row * sr + k * sk]; A is (m, k) and B is read as (n, k), so both land k-major in shared
# memory (S[k * LD + row]). Consecutive threads walk the operand's contiguous dimension, so a
# row-major A, a row-major B and a transposed nn.Linear weight all load coalesced.
FETCH = r"""
template <int ROWS, int BK, int PER>
__device__ __forceinline__ void K_fetch(const float* __restrict__ P, int64_t sr, int64_t sk,
        int64_t r0, int64_t k0, int64_t R, int64_t KD, float (&reg)[PER]) {
    #pragma unroll
    for (int l = 0; l < PER; ++l) {
        const int e = (int)threadIdx.x + l * 256;
        const int r = sk == 1 ? e / BK : e % ROWS, k = sk == 1 ? e % BK : e / ROWS;
        const int64_t gr = r0 + r, gk = k0 + k;
        reg[l] = (gr < R && gk < KD) ? P[gr * sr + gk * sk] : 0.f;
    }
}

template <int ROWS, int BK, int LD, int PER>
__device__ __forceinline__ void K_stash(float* S, int64_t sk, const float (&reg)[PER]) {
    #pragma unroll
    for (int l = 0; l < PER; ++l) {
        const int e = (int)threadIdx.x + l * 256;
        const int r = sk == 1 ? e / BK : e % ROWS, k = sk == 1 ? e % BK : e / ROWS;
        S[k * LD + r] = reg[l];
    }
}
"""

SGEMM128 = r"""
// 128x128 output tile per 256-thread block, BK = 8; shared memory is double-buffered and fed
// through registers (the next K slice is fetched from global memory while this one is
// multiplied, one barrier per slice). Each thread owns an 8x8 micro-tile as four 4x4 quadrants
// 64 apart, read from shared memory as float4: 16 loads feed 64 FMAs per k.
__global__ void __launch_bounds__(256) K_kernel(@ARGS@) {
    constexpr int BM = 128, BK = 8, LD = BM + 4, PER = BM * BK / 256;
    __shared__ __align__(16) float As[2][BK * LD];
    __shared__ __align__(16) float Bs[2][BK * LD];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BM;
    @SETUP@
    float ra[PER], rb[PER];
    @FETCH(0)@
    @STASH(0)@
    __syncthreads();
    float acc[8][8] = {};
    int buf = 0;
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) {
            @FETCH(k0 + BK)@
        }
        const float* as = As[buf];
        const float* bs = Bs[buf];
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            const float4 a0 = *reinterpret_cast<const float4*>(as + k * LD + ty * 4);
            const float4 a1 = *reinterpret_cast<const float4*>(as + k * LD + 64 + ty * 4);
            const float4 b0 = *reinterpret_cast<const float4*>(bs + k * LD + tx * 4);
            const float4 b1 = *reinterpret_cast<const float4*>(bs + k * LD + 64 + tx * 4);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] += a[i] * b[j];
        }
        if (more) {  // the other buffer was last read before the previous barrier
            @STASH(buf ^ 1)@
        }
        __syncthreads();
        buf ^= 1;
    }
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t r = row0 + (i / 4) * 64 + ty * 4 + i % 4;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int64_t c = col0 + (j / 4) * 64 + tx * 4 + j % 4;
            const float a = acc[i][j];
            @STORE@
        }
    }
}
"""

TF32X3 = r"""
// 3xTF32 on WMMA fragments (no inline PTX, which the verifier's static check refuses): a fragment
// of raw fp32 values becomes its TF32 rounding ("big") and the TF32 rounding of the remainder
// ("small"); element-wise, so the fragment's lane layout never matters.
template <class Frag>
__device__ __forceinline__ void K_split(Frag& big, Frag& small) {
    #pragma unroll
    for (int i = 0; i < big.num_elements; ++i) {
        const float x = big.x[i];
        big.x[i] = nvcuda::wmma::__float_to_tf32(x);
        small.x[i] = nvcuda::wmma::__float_to_tf32(x - big.x[i]);  // exact in fp32
    }
}

// TBMxTBM output tile per 256-thread block (8 warps as 2 x 4, each a (TBM/2)x(TBM/4) warp tile
// of 16x16x8 TF32 fragments), BK = 16, double-buffered shared memory fed through registers;
// rows padded by 8 floats (32-byte aligned fragment pointers). Per fragment pair:
// acc += a_small*b_big + a_big*b_small + a_big*b_big (small terms first; small*small is below
// fp32 rounding). The accumulators leave through a per-warp 16x16 staging tile, so the store
// sees (row, column) and can add the bias and fuse an epilogue.
__global__ void __launch_bounds__(256) K_kernel(@ARGS@) {
    using namespace nvcuda;
    constexpr int BM = TBM, BK = 16, LD = BM + 8, PER = BM * BK / 256, MI = BM / 32,
                  NI = BM / 64;
    __shared__ __align__(32) float As[2][BK * LD];
    __shared__ __align__(32) float Bs[2][BK * LD];
    __shared__ __align__(32) float stage[8][16 * 16];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp / 4) * (BM / 2), wn = (warp % 4) * (BM / 4);
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BM;
    @SETUP@
    float ra[PER], rb[PER];
    @FETCH(0)@
    @STASH(0)@
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[MI][NI];
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni) wmma::fill_fragment(acc[mi][ni], 0.f);
    int buf = 0;
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) {
            @FETCH(k0 + BK)@
        }
        const float* as = As[buf];
        const float* bs = Bs[buf];
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            // shared tiles are k-major: A (m x k) is column-major there, B (k x n) row-major
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major>
                ab[MI], am[MI];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>
                bb[NI], bm[NI];
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                wmma::load_matrix_sync(ab[mi], as + kk * LD + wm + mi * 16, LD);
                K_split(ab[mi], am[mi]);
            }
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                wmma::load_matrix_sync(bb[ni], bs + kk * LD + wn + ni * 16, LD);
                K_split(bb[ni], bm[ni]);
            }
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                #pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    wmma::mma_sync(acc[mi][ni], am[mi], bb[ni], acc[mi][ni]);
                    wmma::mma_sync(acc[mi][ni], ab[mi], bm[ni], acc[mi][ni]);
                    wmma::mma_sync(acc[mi][ni], ab[mi], bb[ni], acc[mi][ni]);
                }
        }
        if (more) {  // the other buffer was last read before the previous barrier
            @STASH(buf ^ 1)@
        }
        __syncthreads();
        buf ^= 1;
    }
    float* st = stage[warp];
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            wmma::store_matrix_sync(st, acc[mi][ni], 16, wmma::mem_row_major);
            __syncwarp();
            #pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int e = lane + 32 * i;
                const int64_t r = row0 + wm + mi * 16 + e / 16;
                const int64_t c = col0 + wn + ni * 16 + e % 16;
                const float a = st[e];
                @STORE@
            }
            __syncwarp();  // the staging tile is rewritten by the next fragment
        }
}
"""

# The GEMM's pieces of the shared kernel text (conv_gemm.py has the convolution's).
GEMM = {
    "ARGS": ("const float* __restrict__ A, const float* __restrict__ B, "
             "const C_T* __restrict__ bias, C_T* __restrict__ C, int64_t M, int64_t N, int64_t K, "
             "int64_t sab, int64_t sam, int64_t sak, int64_t sbb, int64_t sbk, int64_t sbn, "
             "int64_t scb, int64_t scm, int64_t scn, float alpha, float beta"),
    "SETUP": "const int64_t bt = blockIdx.z;\n    A += bt * sab; B += bt * sbb;",
    "FETCH": ("K_fetch<BM, BK, PER>(A, sam, sak, row0, @K@, M, K, ra);\n"
              "            K_fetch<BM, BK, PER>(B, sbn, sbk, col0, @K@, N, K, rb);"),
    "STASH": ("K_stash<BM, BK, LD, PER>(As[@B@], sak, ra);\n"
              "            K_stash<BM, BK, LD, PER>(Bs[@B@], sbk, rb);"),
    "STORE": ("if (r < M && c < N) {\n"
              "                float v = alpha * a;\n"
              "                if (bias) v += beta * (float)bias[bt * scb + r * scm + c * scn];\n"
              "                C[(bt * M + r) * N + c] = (C_T)v;\n"
              "            }"),
}


def fill(text: str, pieces: dict[str, str]) -> str:
    """`text` with its @ARGS@/@SETUP@/@FETCH(k)@/@STASH(buf)@/@STORE@ slots filled."""
    text = text.replace("@ARGS@", pieces["ARGS"]).replace("@SETUP@", pieces["SETUP"])
    text = text.replace("@STORE@", pieces["STORE"])
    text = re.sub(r"@FETCH\(([^@]*)\)@", lambda m: pieces["FETCH"].replace("@K@", m.group(1)),
                  text)
    return re.sub(r"@STASH\(([^@]*)\)@", lambda m: pieces["STASH"].replace("@B@", m.group(1)),
                  text)


HOST = r"""
void NAME(torch::Tensor a, torch::Tensor b, torch::Tensor bias, torch::Tensor c, bool has_bias,
          int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sab, int64_t sam, int64_t sak,
          int64_t sbb, int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
          double alpha, double beta) {
    dim3 grid((unsigned int)((N + TILE - 1) / TILE), (unsigned int)((M + TILE - 1) / TILE),
              (unsigned int)batch);
    K_kernel<<<grid, 256, 0, KS_STREAM>>>((const float*)a.data_ptr(), (const float*)b.data_ptr(),
        has_bias ? (const C_T*)bias.data_ptr() : nullptr, (C_T*)c.data_ptr(), M, N, K, sab, sam,
        sak, sbb, sbk, sbn, scb, scm, scn, (float)alpha, (float)beta);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

# Below this many outputs a 128-wide tile leaves most of an H100's 132 SMs idle.
BIG = 1 << 20


def device_text(kind: str, tile: int, pieces: dict[str, str] | None = None) -> str:
    """The device part of `kind` ("sgemm128" or "tf32x3") at `tile` (prefix K_, C_T open), its
    slots filled with `pieces` (the GEMM's by default)."""
    if kind == "sgemm128":
        return FETCH + fill(SGEMM128, pieces or GEMM)
    if kind == "tf32x3":
        return FETCH + fill(TF32X3.replace("TBM", str(tile)), pieces or GEMM)
    raise ValueError(f"unknown fp32 GEMM kind {kind!r}")


def choose(variant: int, dtypes: tuple[str, str, str], outputs: int) -> tuple[str, int] | None:
    """(kind, tile) of this variant's fp32 GEMM, or None to keep the older templates."""
    if dtypes != ("float32", "float32", "float32") or outputs < 4096:
        return None
    if variant % 3 == 2:
        return "tf32x3", 128 if outputs >= BIG else 64
    if variant % 3 == 0 and outputs >= BIG:
        return "sgemm128", 128
    return None


def template(kind: str, tile: int) -> tuple[str, str, str]:
    """(CUDA text with K_/C_T/NAME open, how it works for the reasoning, variant name)."""
    src = device_text(kind, tile) + HOST.replace("TILE", str(tile))
    if kind == "sgemm128":
        return src, ("128x128 block tiles, BK=8, double-buffered shared memory fed through "
                     "registers, and an 8x8 register micro-tile per thread read as float4, so "
                     "16 shared loads feed 64 FMAs per k"), "sgemm128_reg8x8"
    return src, (f"tensor cores in fp32 accuracy (3xTF32): each operand fragment is split into "
                 "a TF32 part and a TF32 remainder and WMMA 16x16x8 sums big*big + big*small + "
                 f"small*big; {tile}x{tile} block tiles of 8 warps, BK=16, double-buffered "
                 "shared memory padded against bank conflicts"), f"tf32x3_{tile}"
