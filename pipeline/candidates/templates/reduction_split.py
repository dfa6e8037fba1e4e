"""Split reductions (CUDA): few outputs over a long reduced range, e.g. a loss's mean over every
element, which one block per output would leave on one SM of an H100's 132.

Two passes, deterministic (no atomics): grid (outputs, S) blocks each reduce one chunk of R with
grid-stride loads, a warp-shuffle tree and one shared-memory pass, and write one partial; then
one block per output combines its S partials the same way and applies the finish (a mean's
division by R, a norm's root). S is chosen at run time for about eight blocks per SM.
"""

from __future__ import annotations

# Past this many outputs one block per output already fills the GPU; below this R a second
# pass costs more than it saves.
MAX_OUTPUTS = 1024
MIN_R = 32768


def wanted(nout: int, r: int, has_idx: bool) -> bool:
    """Whether a CUDA reduction of `nout` outputs over `r` values should split R."""
    return not has_idx and nout <= MAX_OUTPUTS and r >= MIN_R


def source(kname: str, in_t: str, out_t: str, init: str, mapx: str, fin: str, src_ptr: str,
           threads: int) -> tuple[str, str]:
    """(both kernels and the host function, a note) for a value reduction (no index)."""
    tree = f"""
    for (int off = 16; off > 0; off >>= 1) {kname}_combine(v, __shfl_down_sync(0xffffffffu, v, off));
    if (lane == 0) sv[warp] = v;
    __syncthreads();
    if (warp == 0) {{
        v = lane < (int)((blockDim.x + 31) >> 5) ? sv[lane] : (acc_t)({init});
        for (int off = 16; off > 0; off >>= 1) {kname}_combine(v, __shfl_down_sync(0xffffffffu, v, off));
"""
    text = f"""
__global__ void {kname}_part(const {in_t}* __restrict__ in, acc_t* __restrict__ part,
                             int64_t outer, int64_t R, int64_t inner, int64_t chunk) {{
    __shared__ acc_t sv[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t o = blockIdx.x;
    {src_ptr}
    const int64_t r1 = R < (int64_t)(blockIdx.y + 1) * chunk ? R : (int64_t)(blockIdx.y + 1) * chunk;
    acc_t v = {init};
    for (int64_t r = (int64_t)blockIdx.y * chunk + threadIdx.x; r < r1; r += blockDim.x) {{
        const acc_t x = (acc_t)base[r * inner];
        {kname}_combine(v, {mapx});
    }}{tree}        if (lane == 0) part[o * gridDim.y + blockIdx.y] = v;
    }}
}}

__global__ void {kname}_kernel(const acc_t* __restrict__ part, {out_t}* __restrict__ out,
                               int64_t S, int64_t R) {{
    __shared__ acc_t sv[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t o = blockIdx.x;
    acc_t v = {init};
    for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {kname}_combine(v, part[o * S + s]);
{tree}        if (lane == 0) out[o] = ({out_t})(({fin}));
    }}
}}

void NAME(torch::Tensor x, torch::Tensor out, torch::Tensor, int64_t outer, int64_t R,
          int64_t inner) {{
    const int64_t nout = outer * inner;
    // about eight blocks per SM in all, each over at least 4096 values
    int64_t S = std::min<int64_t>((R + 4095) / 4096, std::max<int64_t>(1, 1056 / nout));
    S = std::max<int64_t>(S, 1);
    const int64_t chunk = (R + S - 1) / S;
    auto part = torch::empty({{nout * S}}, x.options().dtype(
        sizeof(acc_t) == 8 ? torch::kDouble : torch::kFloat));
    {kname}_part<<<dim3((unsigned int)nout, (unsigned int)S), {threads}, 0, KS_STREAM>>>(
        (const {in_t}*)x.data_ptr(), (acc_t*)part.data_ptr(), outer, R, inner, chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    {kname}_kernel<<<(unsigned int)nout, 256, 0, KS_STREAM>>>(
        (const acc_t*)part.data_ptr(), ({out_t}*)out.data_ptr(), S, R);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
    how = (f"a split reduction: (outputs x S) blocks of {threads} threads each reduce one chunk "
           "of R (grid-stride loads, warp shuffles, one shared-memory pass) into a partial, then "
           "one block per output combines its S partials, so every SM works even for one output")
    return text, how
