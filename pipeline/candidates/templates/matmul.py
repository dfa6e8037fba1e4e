"""Matrix multiplication: mm, addmm (linear), bmm, baddbmm, mv, as one strided batched GEMM.

C[b] = alpha * A[b] @ B[b] + beta * bias, every operand addressed through its own strides, so a
transposed weight (`linear` traces to `addmm(bias, x, w.t())`) or a broadcast batch needs no copy.
CUDA variants: (0) 16x16 shared-memory tiles, one output per thread; (1) 64x64 block tiles with a
4x4 register micro-tile per thread (each shared value feeds 4 FMAs); (2) tensor cores through
WMMA 16x16x16 fragments for fp16/bf16 inputs with fp32 accumulation. fp32 GEMMs (sgemm.py):
(0) a 128x128 SGEMM with 8x8 register micro-tiles when large, (2) 3xTF32 tensor cores. CPU:
OpenMP over rows with an i-k-j loop so the inner loop streams a row of B.
"""

from __future__ import annotations

from pipeline.candidates.templates import epilogue, sgemm
from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, ctype

_TILE16 = r"""
__global__ void K_kernel(const A_T* __restrict__ A, const B_T* __restrict__ B,
                         const C_T* __restrict__ bias, C_T* __restrict__ C, int64_t M, int64_t N,
                         int64_t K, int64_t sab, int64_t sam, int64_t sak, int64_t sbb,
                         int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
                         float alpha, float beta) {
    __shared__ float As[16][16];
    __shared__ float Bs[16][17];  // +1 column: no bank conflicts on the transposed read
    const int64_t bt = blockIdx.z;
    const int64_t row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    A += bt * sab; B += bt * sbb;
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
        const int64_t ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? (float)A[row * sam + ka * sak] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? (float)B[kb * sbk + col * sbn] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < 16; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) {
        float v = alpha * acc;
        if (bias) v += beta * (float)bias[bt * scb + row * scm + col * scn];
        C[(bt * M + row) * N + col] = (C_T)v;
    }
}

void NAME(torch::Tensor a, torch::Tensor b, torch::Tensor bias, torch::Tensor c, bool has_bias,
          int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sab, int64_t sam, int64_t sak,
          int64_t sbb, int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
          double alpha, double beta) {
    dim3 block(16, 16), grid((unsigned int)((N + 15) / 16), (unsigned int)((M + 15) / 16),
                             (unsigned int)batch);
    K_kernel<<<grid, block, 0, KS_STREAM>>>((const A_T*)a.data_ptr(), (const B_T*)b.data_ptr(),
        has_bias ? (const C_T*)bias.data_ptr() : nullptr, (C_T*)c.data_ptr(), M, N, K, sab, sam,
        sak, sbb, sbk, sbn, scb, scm, scn, (float)alpha, (float)beta);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_TILE64 = r"""
// 64x64 output tile per 256-thread block, BK = 16; each thread owns a 4x4 micro-tile.
__global__ void __launch_bounds__(256) K_kernel(const A_T* __restrict__ A,
        const B_T* __restrict__ B, const C_T* __restrict__ bias, C_T* __restrict__ C, int64_t M,
        int64_t N, int64_t K, int64_t sab, int64_t sam, int64_t sak, int64_t sbb, int64_t sbk,
        int64_t sbn, int64_t scb, int64_t scm, int64_t scn, float alpha, float beta) {
    __shared__ float As[16][64 + 4];  // stored k-major so the micro-tile reads are contiguous
    __shared__ float Bs[16][64 + 4];
    const int64_t bt = blockIdx.z;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
    A += bt * sab; B += bt * sbb;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
        #pragma unroll
        for (int l = 0; l < 4; ++l) {  // 1024 elements of each tile, 4 per thread
            const int e = tid + l * 256;
            const int am = e / 16, ak = e % 16;  // A tile: 64 rows x 16 k
            const int64_t gr = row0 + am, gk = k0 + ak;
            As[ak][am] = (gr < M && gk < K) ? (float)A[gr * sam + gk * sak] : 0.f;
            const int bk = e / 64, bn = e % 64;  // B tile: 16 k x 64 cols
            const int64_t gk2 = k0 + bk, gc = col0 + bn;
            Bs[bk][bn] = (gk2 < K && gc < N) ? (float)B[gk2 * sbk + gc * sbn] : 0.f;
        }
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < 16; ++k) {
            float a[4], b[4];
            #pragma unroll
            for (int i = 0; i < 4; ++i) { a[i] = As[k][ty * 4 + i]; b[i] = Bs[k][tx * 4 + i]; }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int64_t r = row0 + ty * 4 + i;
        if (r >= M) continue;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t c = col0 + tx * 4 + j;
            if (c >= N) continue;
            float v = alpha * acc[i][j];
            if (bias) v += beta * (float)bias[bt * scb + r * scm + c * scn];
            C[(bt * M + r) * N + c] = (C_T)v;
        }
    }
}

void NAME(torch::Tensor a, torch::Tensor b, torch::Tensor bias, torch::Tensor c, bool has_bias,
          int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sab, int64_t sam, int64_t sak,
          int64_t sbb, int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
          double alpha, double beta) {
    dim3 grid((unsigned int)((N + 63) / 64), (unsigned int)((M + 63) / 64), (unsigned int)batch);
    K_kernel<<<grid, 256, 0, KS_STREAM>>>((const A_T*)a.data_ptr(), (const B_T*)b.data_ptr(),
        has_bias ? (const C_T*)bias.data_ptr() : nullptr, (C_T*)c.data_ptr(), M, N, K, sab, sam,
        sak, sbb, sbk, sbn, scb, scm, scn, (float)alpha, (float)beta);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_WMMA = r"""
// Tensor cores: a 128-thread block (4 warps) computes a 32x32 tile; each warp one 16x16
// accumulator fragment, fed from shared-memory tiles converted to the fragment element type.
__global__ void K_kernel(const A_T* __restrict__ A, const B_T* __restrict__ B,
                         const C_T* __restrict__ bias, C_T* __restrict__ C, int64_t M, int64_t N,
                         int64_t K, int64_t sab, int64_t sam, int64_t sak, int64_t sbb,
                         int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
                         float alpha, float beta) {
    using namespace nvcuda;
    __shared__ FRAG_T As[32][16 + 8];
    __shared__ FRAG_T Bs[16][32 + 8];
    __shared__ float Cs[32][32 + 4];
    const int64_t bt = blockIdx.z;
    const int tid = threadIdx.x, warp = tid / 32;
    const int wm = (warp / 2) * 16, wn = (warp % 2) * 16;
    const int64_t row0 = blockIdx.y * 32, col0 = blockIdx.x * 32;
    A += bt * sab; B += bt * sbb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
        for (int e = tid; e < 32 * 16; e += 128) {
            const int am = e / 16, ak = e % 16;
            const int64_t gr = row0 + am, gk = k0 + ak;
            As[am][ak] = (FRAG_T)((gr < M && gk < K) ? (float)A[gr * sam + gk * sak] : 0.f);
            const int bk = e / 32, bn = e % 32;
            const int64_t gk2 = k0 + bk, gc = col0 + bn;
            Bs[bk][bn] = (FRAG_T)((gk2 < K && gc < N) ? (float)B[gk2 * sbk + gc * sbn] : 0.f);
        }
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, FRAG_T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, FRAG_T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, &As[wm][0], 16 + 8);
        wmma::load_matrix_sync(fb, &Bs[0][wn], 32 + 8);
        wmma::mma_sync(acc, fa, fb, acc);
        __syncthreads();
    }
    wmma::store_matrix_sync(&Cs[wm][wn], acc, 32 + 4, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < 32 * 32; e += 128) {
        const int64_t r = row0 + e / 32, c = col0 + e % 32;
        if (r < M && c < N) {
            float v = alpha * Cs[e / 32][e % 32];
            if (bias) v += beta * (float)bias[bt * scb + r * scm + c * scn];
            C[(bt * M + r) * N + c] = (C_T)v;
        }
    }
}

void NAME(torch::Tensor a, torch::Tensor b, torch::Tensor bias, torch::Tensor c, bool has_bias,
          int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sab, int64_t sam, int64_t sak,
          int64_t sbb, int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
          double alpha, double beta) {
    dim3 grid((unsigned int)((N + 31) / 32), (unsigned int)((M + 31) / 32), (unsigned int)batch);
    K_kernel<<<grid, 128, 0, KS_STREAM>>>((const A_T*)a.data_ptr(), (const B_T*)b.data_ptr(),
        has_bias ? (const C_T*)bias.data_ptr() : nullptr, (C_T*)c.data_ptr(), M, N, K, sab, sam,
        sak, sbb, sbk, sbn, scb, scm, scn, (float)alpha, (float)beta);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_CPU = r"""
void NAME(torch::Tensor a, torch::Tensor b, torch::Tensor bias_, torch::Tensor c, bool has_bias,
          int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sab, int64_t sam, int64_t sak,
          int64_t sbb, int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
          double alpha, double beta) {
    const A_T* A = (const A_T*)a.data_ptr();
    const B_T* B = (const B_T*)b.data_ptr();
    const C_T* bias = has_bias ? (const C_T*)bias_.data_ptr() : nullptr;
    C_T* C = (C_T*)c.data_ptr();
    #pragma omp parallel
    {
        std::vector<double> row(N);
        #pragma omp for schedule(static)
        for (int64_t br = 0; br < batch * M; ++br) {
            const int64_t bt = br / M, i = br % M;
            std::fill(row.begin(), row.end(), 0.0);
            if (sbn == 1) {
                for (int64_t k = 0; k < K; ++k) {  // i-k-j: the inner loop streams a row of B
                    const double av = (double)A[bt * sab + i * sam + k * sak];
                    const B_T* brow = B + bt * sbb + k * sbk;
                    for (int64_t j = 0; j < N; ++j) row[j] += av * (double)brow[j];
                }
            } else {
                // B is k-contiguous (e.g. a transposed nn.Linear weight): dot products walk
                // both operands along k instead of striding through B.
                const A_T* arow = A + bt * sab + i * sam;
                for (int64_t j = 0; j < N; ++j) {
                    const B_T* bcol = B + bt * sbb + j * sbn;
                    double s = 0.0;
                    for (int64_t k = 0; k < K; ++k) s += (double)arow[k * sak] * (double)bcol[k * sbk];
                    row[j] = s;
                }
            }
            for (int64_t j = 0; j < N; ++j) {
                double v = alpha * row[j];
                if (bias) v += beta * (double)bias[bt * scb + i * scm + j * scn];
                C[(bt * M + i) * N + j] = (C_T)v;
            }
        }
    }
}
"""

_CPU_PACKED = r"""
void NAME(torch::Tensor a, torch::Tensor b, torch::Tensor bias_, torch::Tensor c, bool has_bias,
          int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sab, int64_t sam, int64_t sak,
          int64_t sbb, int64_t sbk, int64_t sbn, int64_t scb, int64_t scm, int64_t scn,
          double alpha, double beta) {
    const A_T* A = (const A_T*)a.data_ptr();
    const B_T* B = (const B_T*)b.data_ptr();
    const C_T* bias = has_bias ? (const C_T*)bias_.data_ptr() : nullptr;
    C_T* C = (C_T*)c.data_ptr();
    // B packed once per batch into a dense K x N panel, so every inner loop reads it with stride
    // 1 whatever B's layout (a transposed nn.Linear weight included)
    std::vector<float> Bp((size_t)K * N);
    for (int64_t bt = 0; bt < batch; ++bt) {
        if (bt == 0 || sbb != 0) {
            #pragma omp parallel for schedule(static)
            for (int64_t k = 0; k < K; ++k)
                for (int64_t j = 0; j < N; ++j) Bp[k * N + j] = (float)B[bt * sbb + k * sbk + j * sbn];
        }
        #pragma omp parallel for schedule(static)
        for (int64_t i0 = 0; i0 < M; i0 += 4) {
            // 4 rows of C at a time: each packed B row loaded once feeds 4 FMAs per element
            const int64_t rows = std::min<int64_t>(4, M - i0);
            std::vector<float> acc(4 * N, 0.f);
            for (int64_t k0 = 0; k0 < K; k0 += KB) {  // a KB x N panel of B stays in cache
                const int64_t k1 = std::min<int64_t>(K, k0 + KB);
                for (int64_t k = k0; k < k1; ++k) {
                    const float* __restrict__ brow = Bp.data() + k * N;
                    for (int64_t r = 0; r < rows; ++r) {
                        const float av = (float)A[bt * sab + (i0 + r) * sam + k * sak];
                        float* __restrict__ out = acc.data() + r * N;
                        #pragma omp simd
                        for (int64_t j = 0; j < N; ++j) out[j] += av * brow[j];
                    }
                }
            }
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = i0 + r;
                #pragma omp simd
                for (int64_t j = 0; j < N; ++j) {
                    float v = (float)alpha * acc[r * N + j];
                    if (bias) v += (float)beta * (float)bias[bt * scb + i * scm + j * scn];
                    C[(bt * M + i) * N + j] = (C_T)v;
                }
            }
        }
    }
}
"""

_DECL = ("void NAME(torch::Tensor a, torch::Tensor b, torch::Tensor bias, torch::Tensor c, "
         "bool has_bias, int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sab, "
         "int64_t sam, int64_t sak, int64_t sbb, int64_t sbk, int64_t sbn, int64_t scb, "
         "int64_t scm, int64_t scn, double alpha, double beta)")


def _bias_strides(meta: dict, batch: int, m: int, n: int, batched: bool) -> tuple[int, int, int]:
    """Strides of a bias broadcast to (batch, M, N); 0 on broadcast dims."""
    shape, stride = list(meta["shape"]), list(meta["stride"])
    target = [batch, m, n] if batched else [m, n]
    while len(shape) < len(target):
        shape.insert(0, 1)
        stride.insert(0, 0)
    st = [0 if s == 1 and t != 1 else x for s, x, t in zip(shape, stride, target, strict=True)]
    for s, t in zip(shape, target, strict=True):
        if s not in (1, t):
            raise NoTemplate(f"bias of shape {meta['shape']} does not broadcast")
    return (st[0], st[1], st[2]) if batched else (0, st[0], st[1])


def lower_matmul(b: Builder, node: Node) -> None:
    """Emit a GEMM kernel for mm / addmm / bmm / baddbmm / mv."""
    base = node.base
    alpha, beta = node.a("alpha", 1), node.a("beta", 1)
    bias = None
    if base == "mm":
        a_ref, b_ref = node.named["self"], node.named["mat2"]
    elif base == "addmm":
        bias, a_ref, b_ref = node.named["self"], node.named["mat1"], node.named["mat2"]
    elif base == "bmm":
        a_ref, b_ref = node.named["self"], node.named["mat2"]
    elif base == "baddbmm":
        bias, a_ref, b_ref = node.named["self"], node.named["batch1"], node.named["batch2"]
    elif base == "mv":
        a_ref, b_ref = node.named["self"], node.named["vec"]
    else:
        raise NoTemplate(f"matmul op {node.target}")
    if isinstance(alpha, dict) or isinstance(beta, dict):
        raise NoTemplate("non-literal alpha/beta")
    am, bm = b.meta(a_ref), b.meta(b_ref)
    batched = base in ("bmm", "baddbmm")
    if batched:
        batch, m, k = am["shape"]
        n = bm["shape"][2]
        sab, sam, sak = am["stride"]
        sbb, sbk, sbn = bm["stride"]
    else:
        batch = 1
        m, k = am["shape"]
        sab, sam, sak = 0, *am["stride"]
        if base == "mv":
            n, sbb, sbk, sbn = 1, 0, bm["stride"][0], 0
        else:
            n = bm["shape"][1]
            sbb, sbk, sbn = 0, *bm["stride"]
    out_dtype = node.dtype
    if bias is not None:
        bmeta = b.meta(bias)
        scb, scm, scn = _bias_strides(bmeta, batch, m, n, batched)
        bias_var = b.val(bias)
        if bmeta["dtype"] != out_dtype:
            raise NoTemplate("bias dtype differs from the output")
    else:
        scb = scm = scn = 0
        bias_var = b.val(a_ref)
    a_t, b_t, c_t = ctype(am["dtype"]), ctype(bm["dtype"]), ctype(out_dtype)
    half = am["dtype"] in ("float16", "bfloat16") and bm["dtype"] == am["dtype"]
    k_name = f"gemm{len(b.kernels)}"
    if b.simd:
        kb = 64 if b.cpu_strategy == "simd" else 256  # the K block: a tuning parameter
        tpl = _CPU_PACKED.replace("KB", str(kb))
        how = (f"B packed once per batch into a dense K x N fp32 panel; OpenMP over blocks of 4 "
               f"rows of C, K blocked by {kb} so the B panel stays in cache, and a vectorised "
               "(`omp simd`) fp32 inner loop along N in which each B element feeds 4 rows")
        variant = f"cpu_packed_kb{kb}"
    elif not b.cuda:
        tpl, how = _CPU, ("OpenMP over the output rows with a double row accumulator; i-k-j "
                          "order when B's rows are contiguous, k-contiguous dot products when B "
                          "is a transposed weight, so the innermost loop never strides")
        variant = "cpu_ikj"
    elif fast := sgemm.choose(b.variant, (am["dtype"], bm["dtype"], out_dtype), batch * m * n):
        tpl, how, variant = sgemm.template(*fast)
    elif half and b.variant % 3 != 1:
        frag = "__half" if am["dtype"] == "float16" else "__nv_bfloat16"
        tpl = _WMMA.replace("FRAG_T", frag)
        how = ("tensor cores via WMMA 16x16x16 fragments (fp32 accumulation); 4 warps per 32x32 "
               "block tile, operands staged through shared memory")
        variant = "wmma"
    elif b.variant % 2 == 1 and m * n >= 4096:
        tpl, how = _TILE64, ("64x64 block tiles with BK=16 and a 4x4 register micro-tile per "
                             "thread, so every shared-memory value feeds four FMAs")
        variant = "tile64_reg4x4"
    else:
        tpl, how = _TILE16, ("16x16 shared-memory tiles: each thread loads one A and one B "
                             "element per K-step and accumulates one output in a register")
        variant = "tile16"
    src = (tpl.replace("K_", f"{k_name}_").replace("A_T", a_t).replace("B_T", b_t)
           .replace("C_T", c_t))
    src, fused_root, fused_note = epilogue.apply(b, node, src, k_name)
    op = {"addmm": "linear/addmm", "baddbmm": "baddbmm"}.get(base, base)
    # sizes as "M = ..." (not "C[1x64x32]"): in the kernel's comment they become expressions
    # such as x.size(0), which an "x"-joined shape would run together
    def scaled(factor: object, term: str) -> str:
        return term if factor == 1 else f"{factor} * {term}"

    note = (f"{op}: C = {scaled(alpha, 'A @ B')}"
            + (f" + {scaled(beta, 'bias')}" if bias is not None else "")
            + f" with batch {batch}, M = {m}, N = {n}, K = {k}; operands are read through their "
              f"strides (A {am['stride']}, B {bm['stride']}) so transposed views need no copy; "
              f"{how}{fused_note}.")
    name = b.add_kernel("matmul", k_name, src, _DECL, note)
    out = b.alloc(node.shape, out_dtype)
    b.call(name, b.val(a_ref), b.val(b_ref), bias_var, out, str(bias is not None), str(batch),
           str(m), str(n), str(k), str(sab), str(sam), str(sak), str(sbb), str(sbk), str(sbn),
           str(scb), str(scm), str(scn), repr(float(alpha)), repr(float(beta)))
    b.env[node.name] = out
    if fused_root:
        b.env[fused_root] = out
    b.params.setdefault("matmul", []).append({"variant": variant, "M": m, "N": n, "K": k,
                                              "batch": batch})


LOWERINGS = {k: lower_matmul for k in ("mm", "addmm", "bmm", "baddbmm", "mv")}
