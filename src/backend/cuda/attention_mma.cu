/* Tensor-core attention for bf16/f16 (forward, dQ, dK/dV): the flash-attention
 * scheme of attention.cu's tiled kernels, with the products done by the warp-level
 * matrix instruction mma.sync.m16n8k16 (bf16 or f16 operands, f32 accumulators)
 * instead of CUDA-core dot products.
 *
 * Each warp owns 16 rows (queries in the forward and dQ kernels, keys in dK/dV),
 * held in registers as the instruction's A fragments; a block is 4 warps (64 rows)
 * and walks the other side in tiles of 64 rows staged in shared memory, once in row
 * order ([row][d], for products over d) and where a product runs over the tile's
 * rows, once transposed ([d][row]). A product's accumulator fragment (16 x 8 f32 per
 * warp) has, for its two n-tiles side by side, exactly the layout of an A fragment
 * over 16 k-values, so probabilities and dS feed the next product from registers
 * (packed to the input's 16-bit type, as FlashAttention-2 does). Rows of shared
 * tiles are padded by 8 elements: a row is then 4 banks further, so the 8 rows x 4
 * columns a fragment load touches fall in 32 different banks.
 *
 * Softmax runs in base 2 (the scale times log2(e) folded into one multiply), with a
 * running maximum per row and the row sums kept per thread until the end (the
 * rescaling factor is the same for the 4 threads that share a row). The forward
 * writes each row's logsumexp in natural log, the value the other kernels (and the
 * CPU) use. Causal masking is top-left (query i sees keys j <= i), as elsewhere.
 *
 * attention.cu chooses these for bf16/f16 with D in {32, 64, 96, 128}, Tk > 0 and
 * 16-byte aligned rows on sm_80 and later, when asked (FATHOM_CUDA_ATTENTION=mma or
 * fm_cuda_attention_set_tiled(2)): they have not run on a GPU yet, so the CUDA-core
 * tiled kernels, which have, stay the default. tests/test_cuda.c compares all three
 * kernels with the CPU and the tiled and tensor-core ones with the reference;
 * bench_gpu times them beside the tiled ones. docs/CUDA.md says what has run. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

#define MW 4        /* warps per block */
#define MR 16       /* rows per warp */
#define MT 64       /* rows per staged tile */
#define MPAD 8      /* padding of a staged row, in elements */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef struct mma_geom {
    int64_t B, H, Hkv, Tq, Tk;
    int causal;
    float scale; /* softmax scale (not yet times log2 e) */
} mma_geom;

template <bool BF>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap(); /* fm_cuda_sdpa_mma_fits refuses devices before sm_80 */
#else
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* two floats as one register of 16-bit operands, the first in the low half */
template <bool BF>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    uint32_t r;
    if (BF) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        r = *(uint32_t *)&v;
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        r = *(uint32_t *)&v;
    }
    return r;
}

template <bool BF>
__device__ __forceinline__ float to_f(uint16_t v) {
    if (BF) return __bfloat162float(__ushort_as_bfloat16(v));
    return __half2float(__ushort_as_half(v));
}
template <bool BF>
__device__ __forceinline__ uint16_t from_f(float v) {
    if (BF) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ uint32_t ld32(const uint16_t *p) { return *(const uint32_t *)p; }

/* rows [r0, r0 + MT) of a [rows, D] matrix into s[MT][D + MPAD]; rows past n are zeros */
template <int D>
__device__ __forceinline__ void stage(uint16_t *s, const uint16_t *src, int64_t r0, int64_t n) {
    constexpr int V = D / 8; /* 16-byte pieces per row */
    for (int e = threadIdx.x; e < MT * V; e += MW * 32) {
        const int r = e / V, c = (e % V) * 8;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r0 + r < n) x = *(const uint4 *)(src + (r0 + r) * D + c);
        *(uint4 *)(s + r * (D + MPAD) + c) = x;
    }
}
/* the same rows transposed: s[D][MT + MPAD] */
template <int D>
__device__ __forceinline__ void stage_t(uint16_t *s, const uint16_t *src, int64_t r0, int64_t n) {
    constexpr int V = D / 8;
    for (int e = threadIdx.x; e < MT * V; e += MW * 32) {
        const int r = e % MT, c = (e / MT) * 8; /* consecutive threads: consecutive rows, one column piece */
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r0 + r < n) x = *(const uint4 *)(src + (r0 + r) * D + c);
        const uint16_t *h = (const uint16_t *)&x;
        #pragma unroll
        for (int k = 0; k < 8; k++) s[(c + k) * (MT + MPAD) + r] = h[k];
    }
}

/* A fragments of the warp's 16 rows [row0, row0 + 16) of a [rows, D] matrix in global memory */
template <int D>
__device__ __forceinline__ void load_a(uint32_t a[D / 16][4], const uint16_t *src, int64_t row0, int64_t n) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t r0 = row0 + g, r1 = row0 + g + 8;
    #pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const int c = kc * 16 + t * 2;
        a[kc][0] = r0 < n ? ld32(src + r0 * D + c) : 0u;
        a[kc][1] = r1 < n ? ld32(src + r1 * D + c) : 0u;
        a[kc][2] = r0 < n ? ld32(src + r0 * D + c + 8) : 0u;
        a[kc][3] = r1 < n ? ld32(src + r1 * D + c + 8) : 0u;
    }
}

/* acc[8][4] (the warp's 16 rows x the tile's 64 rows) += A (16 x D) . S^T where S is a
 * staged [MT][D + MPAD] tile: a product over d */
template <bool BF, int D>
__device__ __forceinline__ void mm_rows(float acc[8][4], const uint32_t a[D / 16][4], const uint16_t *s) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int j = 0; j < 8; j++)
        #pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            const uint16_t *p = s + (j * 8 + g) * (D + MPAD) + kc * 16 + t * 2;
            mma16816<BF>(acc[j], a[kc], ld32(p), ld32(p + 8));
        }
}

/* out[D/8][4] (16 rows x D) += P (16 x 64, accumulator layout, packed here) . S where S^T
 * is a staged [D][MT + MPAD] tile: a product over the tile's rows */
template <bool BF, int D>
__device__ __forceinline__ void mm_cols(float out[D / 8][4], const float p[8][4], const uint16_t *st) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        uint32_t a[4] = {pack2<BF>(p[2 * kc][0], p[2 * kc][1]), pack2<BF>(p[2 * kc][2], p[2 * kc][3]),
                         pack2<BF>(p[2 * kc + 1][0], p[2 * kc + 1][1]), pack2<BF>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
        #pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const uint16_t *q = st + (n * 8 + g) * (MT + MPAD) + kc * 16 + t * 2;
            mma16816<BF>(out[n], a, ld32(q), ld32(q + 8));
        }
    }
}

/* writes the warp's 16 x D accumulator rows, times mul[0] (rows g) and mul[1] (rows g + 8) */
template <bool BF, int D>
__device__ __forceinline__ void store_rows(uint16_t *dst, const float acc[D / 8][4], int64_t row0, int64_t n, float mul0, float mul1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t r0 = row0 + g, r1 = row0 + g + 8;
    #pragma unroll
    for (int j = 0; j < D / 8; j++) {
        const int c = j * 8 + t * 2;
        if (r0 < n) *(uint32_t *)(dst + r0 * D + c) = pack2<BF>(acc[j][0] * mul0, acc[j][1] * mul0);
        if (r1 < n) *(uint32_t *)(dst + r1 * D + c) = pack2<BF>(acc[j][2] * mul1, acc[j][3] * mul1);
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* ---- forward: grid (query tiles, B * H) ---- */
template <bool BF, int D>
__global__ void __launch_bounds__(MW * 32) mma_fwd(mma_geom g, const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *o,
                                                   float *lse) {
    extern __shared__ __align__(16) uint16_t sm[];
    uint16_t *ks = sm, *vt = sm + MT * (D + MPAD);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H, hk = h / (g.H / g.Hkv);
    const int64_t qb0 = (int64_t)blockIdx.x * MW * MR, row0 = qb0 + w * MR;
    const uint16_t *qh = q + bh * g.Tq * D, *kh = k + (b * g.Hkv + hk) * g.Tk * D, *vh = v + (b * g.Hkv + hk) * g.Tk * D;
    uint32_t qa[D / 16][4];
    load_a<D>(qa, qh, row0, g.Tq);
    float acc[D / 8][4];
    #pragma unroll
    for (int j = 0; j < D / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const float sl2 = g.scale * LOG2E;
    const int64_t kend = g.causal && qb0 + MW * MR < g.Tk ? qb0 + MW * MR : g.Tk; /* keys any row of the block sees */
    const int64_t r0 = row0 + gi, r1 = row0 + gi + 8;
    for (int64_t k0 = 0; k0 < kend; k0 += MT) {
        __syncthreads();
        stage<D>(ks, kh, k0, g.Tk);
        stage_t<D>(vt, vh, k0, g.Tk);
        __syncthreads();
        if (g.causal && k0 > row0 + MR - 1) continue; /* no row of this warp sees the tile */
        float s[8][4];
        #pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        mm_rows<BF, D>(s, qa, ks);
        float mx0 = -INFINITY, mx1 = -INFINITY;
        #pragma unroll
        for (int j = 0; j < 8; j++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t key = k0 + j * 8 + t * 2 + (e & 1), r = e < 2 ? r0 : r1;
                const bool ok = key < g.Tk && (!g.causal || key <= r);
                s[j][e] = ok ? s[j][e] * sl2 : -INFINITY;
                if (e < 2) mx0 = fmaxf(mx0, s[j][e]);
                else mx1 = fmaxf(mx1, s[j][e]);
            }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        /* a row with nothing visible yet keeps -inf: exponents from 0 then, all terms 0 */
        const float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1;
        const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
        float ps0 = 0.f, ps1 = 0.f;
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            s[j][0] = exp2f(s[j][0] - b0);
            s[j][1] = exp2f(s[j][1] - b0);
            s[j][2] = exp2f(s[j][2] - b1);
            s[j][3] = exp2f(s[j][3] - b1);
            ps0 += s[j][0] + s[j][1];
            ps1 += s[j][2] + s[j][3];
        }
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
        m0 = n0;
        m1 = n1;
        #pragma unroll
        for (int j = 0; j < D / 8; j++) {
            acc[j][0] *= c0;
            acc[j][1] *= c0;
            acc[j][2] *= c1;
            acc[j][3] *= c1;
        }
        mm_cols<BF, D>(acc, s, vt);
    }
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    store_rows<BF, D>(o + bh * g.Tq * D, acc, row0, g.Tq, 1.f / l0, 1.f / l1);
    if (t == 0) {
        if (r0 < g.Tq) lse[bh * g.Tq + r0] = (m0 + log2f(l0)) * LN2;
        if (r1 < g.Tq) lse[bh * g.Tq + r1] = (m1 + log2f(l1)) * LN2;
    }
}

/* ---- dQ: grid (query tiles, B * H); delta[row] = dout_row . out_row ---- */
template <bool BF, int D>
__global__ void __launch_bounds__(MW * 32) mma_dq(mma_geom g, const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                                  const float *lse, const float *delta, uint16_t *dq) {
    extern __shared__ __align__(16) uint16_t sm[];
    uint16_t *ks = sm, *vs = ks + MT * (D + MPAD), *kt = vs + MT * (D + MPAD);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H, hk = h / (g.H / g.Hkv);
    const int64_t qb0 = (int64_t)blockIdx.x * MW * MR, row0 = qb0 + w * MR;
    const uint16_t *kh = k + (b * g.Hkv + hk) * g.Tk * D, *vh = v + (b * g.Hkv + hk) * g.Tk * D;
    uint32_t qa[D / 16][4], da[D / 16][4];
    load_a<D>(qa, q + bh * g.Tq * D, row0, g.Tq);
    load_a<D>(da, dout + bh * g.Tq * D, row0, g.Tq);
    const int64_t r0 = row0 + gi, r1 = row0 + gi + 8;
    const float sl2 = g.scale * LOG2E;
    const float L0 = r0 < g.Tq ? lse[bh * g.Tq + r0] * LOG2E : 0.f, L1 = r1 < g.Tq ? lse[bh * g.Tq + r1] * LOG2E : 0.f;
    const float d0 = r0 < g.Tq ? delta[bh * g.Tq + r0] : 0.f, d1 = r1 < g.Tq ? delta[bh * g.Tq + r1] : 0.f;
    float acc[D / 8][4];
    #pragma unroll
    for (int j = 0; j < D / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const int64_t kend = g.causal && qb0 + MW * MR < g.Tk ? qb0 + MW * MR : g.Tk;
    for (int64_t k0 = 0; k0 < kend; k0 += MT) {
        __syncthreads();
        stage<D>(ks, kh, k0, g.Tk);
        stage<D>(vs, vh, k0, g.Tk);
        stage_t<D>(kt, kh, k0, g.Tk);
        __syncthreads();
        if (g.causal && k0 > row0 + MR - 1) continue;
        float s[8][4], dp[8][4];
        #pragma unroll
        for (int j = 0; j < 8; j++)
            #pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.f;
        mm_rows<BF, D>(s, qa, ks);
        mm_rows<BF, D>(dp, da, vs);
        #pragma unroll
        for (int j = 0; j < 8; j++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t key = k0 + j * 8 + t * 2 + (e & 1), r = e < 2 ? r0 : r1;
                const bool ok = r < g.Tq && key < g.Tk && (!g.causal || key <= r);
                const float p = ok ? exp2f(s[j][e] * sl2 - (e < 2 ? L0 : L1)) : 0.f;
                s[j][e] = p * (dp[j][e] - (e < 2 ? d0 : d1)); /* dS / scale */
            }
        mm_cols<BF, D>(acc, s, kt);
    }
    store_rows<BF, D>(dq + bh * g.Tq * D, acc, row0, g.Tq, g.scale, g.scale);
}

/* ---- dK, dV: grid (key tiles, B * Hkv); every query head of the kv head's group ---- */
template <bool BF, int D>
__global__ void __launch_bounds__(MW * 32) mma_dkv(mma_geom g, const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                                   const float *lse, const float *delta, uint16_t *dk, uint16_t *dv) {
    extern __shared__ __align__(16) uint16_t sm[];
    uint16_t *qs = sm, *ds_ = qs + MT * (D + MPAD), *qt = ds_ + MT * (D + MPAD), *dt_ = qt + D * (MT + MPAD);
    float *ls = (float *)(dt_ + D * (MT + MPAD)), *dl = ls + MT;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    const int64_t bhk = blockIdx.y, b = bhk / g.Hkv, hk = bhk % g.Hkv, group = g.H / g.Hkv;
    const int64_t kb0 = (int64_t)blockIdx.x * MW * MR, row0 = kb0 + w * MR; /* the warp's 16 keys */
    const int64_t koff = bhk * g.Tk * D;
    uint32_t ka[D / 16][4], va[D / 16][4];
    load_a<D>(ka, k + koff, row0, g.Tk);
    load_a<D>(va, v + koff, row0, g.Tk);
    const int64_t j0 = row0 + gi, j1 = row0 + gi + 8;
    const float sl2 = g.scale * LOG2E;
    float ak[D / 8][4], av[D / 8][4];
    #pragma unroll
    for (int j = 0; j < D / 8; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) ak[j][e] = av[j][e] = 0.f;
    const int64_t qstart = g.causal ? kb0 - kb0 % MT : 0; /* queries before the block's first key see none of it */
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        const int64_t bh = b * g.H + h, qoff = bh * g.Tq * D;
        for (int64_t i0 = qstart; i0 < g.Tq; i0 += MT) {
            __syncthreads();
            stage<D>(qs, q + qoff, i0, g.Tq);
            stage<D>(ds_, dout + qoff, i0, g.Tq);
            stage_t<D>(qt, q + qoff, i0, g.Tq);
            stage_t<D>(dt_, dout + qoff, i0, g.Tq);
            for (int e = threadIdx.x; e < MT; e += MW * 32) {
                const int64_t i = i0 + e;
                ls[e] = i < g.Tq ? lse[bh * g.Tq + i] * LOG2E : 0.f;
                dl[e] = i < g.Tq ? delta[bh * g.Tq + i] : 0.f;
            }
            __syncthreads();
            if (g.causal && i0 + MT - 1 < row0) continue; /* every query of the tile is before the warp's keys */
            float s[8][4], dp[8][4];
            #pragma unroll
            for (int j = 0; j < 8; j++)
                #pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.f;
            mm_rows<BF, D>(s, ka, qs);  /* S^T: keys x queries */
            mm_rows<BF, D>(dp, va, ds_); /* dP^T */
            #pragma unroll
            for (int j = 0; j < 8; j++)
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = j * 8 + t * 2 + (e & 1);
                    const int64_t i = i0 + c, key = e < 2 ? j0 : j1;
                    const bool ok = i < g.Tq && key < g.Tk && (!g.causal || key <= i);
                    const float p = ok ? exp2f(s[j][e] * sl2 - ls[c]) : 0.f;
                    s[j][e] = p;
                    dp[j][e] = p * (dp[j][e] - dl[c]); /* dS^T / scale */
                }
            mm_cols<BF, D>(av, s, dt_);
            mm_cols<BF, D>(ak, dp, qt);
        }
    }
    store_rows<BF, D>(dk + koff, ak, row0, g.Tk, g.scale, g.scale);
    store_rows<BF, D>(dv + koff, av, row0, g.Tk, 1.f, 1.f);
}

static size_t smem_fwd(int D) { return (size_t)(MT * (D + MPAD) + D * (MT + MPAD)) * 2; }
static size_t smem_dq(int D) { return (size_t)(2 * MT * (D + MPAD) + D * (MT + MPAD)) * 2; }
static size_t smem_dkv(int D) { return (size_t)(2 * MT * (D + MPAD) + 2 * D * (MT + MPAD)) * 2 + 2 * MT * sizeof(float); }

/* kernels whose shared memory is past the 48 KiB default must ask for it once */
template <typename K>
static bool allow_smem(K kern, size_t bytes) {
    if (bytes <= 48 * 1024) return true;
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) == cudaSuccess;
}

template <bool BF, int D>
static fm_status run_fwd(const mma_geom *g, const void *q, const void *k, const void *v, void *o, float *lse) {
    const size_t sm = smem_fwd(D);
    if (!allow_smem(mma_fwd<BF, D>, sm)) return fm_set_error(FM_ERR_UNSUPPORTED, "sdpa (tensor cores): %zu bytes of shared memory refused", sm);
    dim3 grid((unsigned)((g->Tq + MW * MR - 1) / (MW * MR)), (unsigned)(g->B * g->H));
    mma_fwd<BF, D><<<grid, MW * 32, sm, fm_cuda_stream()>>>(*g, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, (uint16_t *)o, lse);
    return FM_OK;
}

template <bool BF, int D>
static fm_status run_bwd(const mma_geom *g, const void *dout, const void *q, const void *k, const void *v, const float *lse,
                         const float *delta, void *dq, void *dk, void *dv) {
    const size_t s1 = smem_dq(D), s2 = smem_dkv(D);
    if (!allow_smem(mma_dq<BF, D>, s1) || !allow_smem(mma_dkv<BF, D>, s2))
        return fm_set_error(FM_ERR_UNSUPPORTED, "sdpa backward (tensor cores): %zu/%zu bytes of shared memory refused", s1, s2);
    cudaStream_t s = fm_cuda_stream();
    dim3 gq((unsigned)((g->Tq + MW * MR - 1) / (MW * MR)), (unsigned)(g->B * g->H));
    dim3 gk((unsigned)((g->Tk + MW * MR - 1) / (MW * MR)), (unsigned)(g->B * g->Hkv));
    mma_dq<BF, D><<<gq, MW * 32, s1, s>>>(*g, (const uint16_t *)dout, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, lse, delta,
                                         (uint16_t *)dq);
    mma_dkv<BF, D><<<gk, MW * 32, s2, s>>>(*g, (const uint16_t *)dout, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, lse,
                                          delta, (uint16_t *)dk, (uint16_t *)dv);
    return FM_OK;
}

static mma_geom mk(int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int causal, double scale) {
    mma_geom g = {B, H, Hkv, Tq, Tk, causal, (float)scale};
    return g;
}

extern "C" bool fm_cuda_sdpa_mma_fits(int dt, int64_t D, int64_t Tk, const void *const *ptrs, int n) {
    if ((dt != FM_BF16 && dt != FM_F16) || Tk <= 0 || (D != 32 && D != 64 && D != 96 && D != 128)) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (major < 8) return false; /* mma.sync with bf16 operands: sm_80 and later */
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] % 16) return false;
    return true;
}

#define MMA_DISPATCH(call)                                                                                             \
    switch (D) {                                                                                                       \
    case 32: return bf ? call(true, 32) : call(false, 32);                                                            \
    case 64: return bf ? call(true, 64) : call(false, 64);                                                            \
    case 96: return bf ? call(true, 96) : call(false, 96);                                                            \
    default: return bf ? call(true, 128) : call(false, 128);                                                          \
    }                                                                                                                  \
    return FM_OK

extern "C" fm_status fm_cuda_sdpa_mma_fwd(int dt, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, int causal,
                                          double scale, const void *q, const void *k, const void *v, void *o, float *lse) {
    const mma_geom g = mk(B, H, Hkv, Tq, Tk, causal, scale);
    const bool bf = dt == FM_BF16;
#define FWD(BFv, Dv) run_fwd<BFv, Dv>(&g, q, k, v, o, lse)
    MMA_DISPATCH(FWD);
#undef FWD
}

extern "C" fm_status fm_cuda_sdpa_mma_bwd(int dt, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, int causal,
                                          double scale, const void *dout, const void *q, const void *k, const void *v,
                                          const float *lse, const float *delta, void *dq, void *dk, void *dv) {
    const mma_geom g = mk(B, H, Hkv, Tq, Tk, causal, scale);
    const bool bf = dt == FM_BF16;
#define BWD(BFv, Dv) run_bwd<BFv, Dv>(&g, dout, q, k, v, lse, delta, dq, dk, dv)
    MMA_DISPATCH(BWD);
#undef BWD
}
