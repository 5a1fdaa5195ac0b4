/* CUDA scaled-dot-product attention (forward + backward), fathom's own
 * flash-style kernels: no Tq x Tk matrix is ever stored; the forward keeps a
 * running max and sum per query row (online softmax) and saves the row's
 * logsumexp, and the backward recomputes probabilities from it. GQA (Hkv
 * dividing H) and top-left causal masking as on the CPU.
 *
 * Two implementations:
 *  - tiled (the default for f32/f16/bf16 and D <= 128): a block takes a tile of
 *    query rows (forward, dQ) or key rows (dK/dV) of one head and walks the other
 *    side in tiles of 32 rows staged in shared memory, one tile of K and V
 *    (forward, dQ) or of Q and dO (dK/dV) at a time, read by every row of the
 *    block. Within a tile lane j scores row j (a dot product over D from shared
 *    memory, rows padded by one float so the 32 lanes hit 32 banks), the softmax
 *    is updated once per tile (tile max, rescale, tile sum), and the weighted
 *    rows are accumulated with each lane owning D/32 output columns. Sums run in
 *    a fixed order: deterministic, no atomics. No tensor cores yet.
 *  - reference: one warp per query row (forward, dQ) or key row (dK, dV),
 *    straight from global memory; f64, D up to 256, and the comparison for the
 *    tiled kernels (tests/test_cuda.c runs both against the CPU and each other).
 *  - tensor cores (attention_mma.cu, for bf16/f16 with D in {32, 64, 96, 128}): the same
 *    scheme with mma.sync products; opt-in (FATHOM_CUDA_ATTENTION=mma) until it has run on
 *    a GPU.
 * fm_cuda_attention_set_tiled() or FATHOM_CUDA_ATTENTION=reference|tiled|mma choose.
 * The reference and tiled kernels ran on an H200 on 2026-12-04 (docs/CUDA.md); the
 * tensor-core ones have not run yet. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_internal.h"

#define MAX_PER_LANE 8 /* D <= 256 */
#define WARPS 4

typedef struct attn_geom {
    int64_t B, H, Hkv, Tq, Tk, D;
    int causal, dt;
    double scale;
} attn_geom;

template <typename T>
__device__ __forceinline__ void load_row(const void *p, int dt, int64_t off, int64_t D, T *r) {
    int lane = threadIdx.x & 31;
    for (int e = 0; e < MAX_PER_LANE; e++) {
        int64_t d = lane + 32 * e;
        r[e] = d < D ? fm_ld<T>(p, dt, off + d) : (T)0;
    }
}
template <typename T>
__device__ __forceinline__ T dot_row(const T *a, const void *p, int dt, int64_t off, int64_t D) {
    int lane = threadIdx.x & 31;
    T s = 0;
    for (int e = 0; e < MAX_PER_LANE; e++) {
        int64_t d = lane + 32 * e;
        if (d < D) s += a[e] * fm_ld<T>(p, dt, off + d);
    }
    return fm_warp_sum<T>(s);
}

template <typename T>
__global__ void sdpa_fwd(attn_geom g, const void *q, const void *k, const void *v, void *o, float *lse) {
    int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= g.B * g.H * g.Tq) return;
    int lane = threadIdx.x & 31;
    int64_t i = r % g.Tq, bh = r / g.Tq, b = bh / g.H, h = bh % g.H, group = g.H / g.Hkv;
    int64_t koff = (b * g.Hkv + h / group) * g.Tk * g.D;
    int64_t n = g.causal ? (i + 1 < g.Tk ? i + 1 : g.Tk) : g.Tk;
    T qr[MAX_PER_LANE], acc[MAX_PER_LANE];
    load_row<T>(q, g.dt, r * g.D, g.D, qr);
    for (int e = 0; e < MAX_PER_LANE; e++) acc[e] = 0;
    T m = (T)-INFINITY, l = 0, sc = (T)g.scale;
    for (int64_t j = 0; j < n; j++) {
        T s = dot_row<T>(qr, k, g.dt, koff + j * g.D, g.D) * sc;
        T mn = s > m ? s : m;
        T corr = exp(m - mn), p = exp(s - mn);
        l = l * corr + p;
        for (int e = 0; e < MAX_PER_LANE; e++) {
            int64_t d = lane + 32 * e;
            acc[e] = acc[e] * corr + (d < g.D ? p * fm_ld<T>(v, g.dt, koff + j * g.D + d) : (T)0);
        }
        m = mn;
    }
    for (int e = 0; e < MAX_PER_LANE; e++) {
        int64_t d = lane + 32 * e;
        if (d < g.D) fm_st<T>(o, g.dt, r * g.D + d, n ? acc[e] / l : (T)NAN);
    }
    if (lane == 0) lse[r] = (float)(m + log(l));
}

/* delta[r] = dout_r . o_r */
template <typename T>
__global__ void sdpa_delta(attn_geom g, const void *dout, const void *o, float *delta) {
    int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= g.B * g.H * g.Tq) return;
    T a[MAX_PER_LANE];
    load_row<T>(dout, g.dt, r * g.D, g.D, a);
    T s = dot_row<T>(a, o, g.dt, r * g.D, g.D);
    if ((threadIdx.x & 31) == 0) delta[r] = (float)s;
}

template <typename T>
__global__ void sdpa_dq(attn_geom g, const void *dout, const void *q, const void *k, const void *v, const float *lse,
                        const float *delta, void *dq) {
    int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= g.B * g.H * g.Tq) return;
    int lane = threadIdx.x & 31;
    int64_t i = r % g.Tq, bh = r / g.Tq, b = bh / g.H, h = bh % g.H, group = g.H / g.Hkv;
    int64_t koff = (b * g.Hkv + h / group) * g.Tk * g.D;
    int64_t n = g.causal ? (i + 1 < g.Tk ? i + 1 : g.Tk) : g.Tk;
    T qr[MAX_PER_LANE], dor[MAX_PER_LANE], acc[MAX_PER_LANE];
    load_row<T>(q, g.dt, r * g.D, g.D, qr);
    load_row<T>(dout, g.dt, r * g.D, g.D, dor);
    for (int e = 0; e < MAX_PER_LANE; e++) acc[e] = 0;
    T sc = (T)g.scale, L = (T)lse[r], dl = (T)delta[r];
    for (int64_t j = 0; j < n; j++) {
        T s = dot_row<T>(qr, k, g.dt, koff + j * g.D, g.D) * sc;
        T p = exp(s - L);
        T dp = dot_row<T>(dor, v, g.dt, koff + j * g.D, g.D);
        T ds = p * (dp - dl) * sc;
        for (int e = 0; e < MAX_PER_LANE; e++) {
            int64_t d = lane + 32 * e;
            if (d < g.D) acc[e] += ds * fm_ld<T>(k, g.dt, koff + j * g.D + d);
        }
    }
    for (int e = 0; e < MAX_PER_LANE; e++) {
        int64_t d = lane + 32 * e;
        if (d < g.D) fm_st<T>(dq, g.dt, r * g.D + d, acc[e]);
    }
}

/* One warp per key row (b, kv head, j): sums over every query head of its group. */
template <typename T>
__global__ void sdpa_dkv(attn_geom g, const void *dout, const void *q, const void *k, const void *v, const float *lse,
                         const float *delta, void *dk, void *dv) {
    int64_t kr = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (kr >= g.B * g.Hkv * g.Tk) return;
    int lane = threadIdx.x & 31;
    int64_t j = kr % g.Tk, bk = kr / g.Tk, b = bk / g.Hkv, hk = bk % g.Hkv, group = g.H / g.Hkv;
    T kr_[MAX_PER_LANE], vr[MAX_PER_LANE], adk[MAX_PER_LANE], adv[MAX_PER_LANE];
    load_row<T>(k, g.dt, kr * g.D, g.D, kr_);
    load_row<T>(v, g.dt, kr * g.D, g.D, vr);
    for (int e = 0; e < MAX_PER_LANE; e++) adk[e] = adv[e] = 0;
    T sc = (T)g.scale;
    int64_t i0 = g.causal ? j : 0;
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        for (int64_t i = i0; i < g.Tq; i++) {
            int64_t r = (b * g.H + h) * g.Tq + i;
            T s = dot_row<T>(kr_, q, g.dt, r * g.D, g.D) * sc;
            T p = exp(s - (T)lse[r]);
            T dp = dot_row<T>(vr, dout, g.dt, r * g.D, g.D);
            T ds = p * (dp - (T)delta[r]) * sc;
            for (int e = 0; e < MAX_PER_LANE; e++) {
                int64_t d = lane + 32 * e;
                if (d < g.D) {
                    adv[e] += p * fm_ld<T>(dout, g.dt, r * g.D + d);
                    adk[e] += ds * fm_ld<T>(q, g.dt, r * g.D + d);
                }
            }
        }
    }
    for (int e = 0; e < MAX_PER_LANE; e++) {
        int64_t d = lane + 32 * e;
        if (d < g.D) {
            fm_st<T>(dk, g.dt, kr * g.D + d, adk[e]);
            fm_st<T>(dv, g.dt, kr * g.D + d, adv[e]);
        }
    }
}

/* ---------------- tiled kernels ---------------- */

#define TILE 32        /* rows of the staged side per tile: one per lane */
#define TMAX_E 4       /* D <= 128: columns per lane */
#define T_FWD_RPW 4    /* query rows per warp in the forward (16 per block) */
#define T_BWD_RPW 2    /* rows per warp in the backward kernels (8 per block) */

/* Stage rows [r0, r0 + n) of a [rows, D] matrix at offset `off` into sh (row pitch
 * `pitch` floats), zeros past `rows_valid`. Every thread of the block takes part. */
__device__ __forceinline__ void stage_rows(float *sh, int pitch, const void *p, int dt, int64_t off, int64_t r0, int n,
                                           int64_t rows_valid, int64_t D) {
    for (int64_t x = threadIdx.x; x < (int64_t)n * D; x += blockDim.x) {
        int64_t r = x / D, d = x % D;
        sh[r * pitch + d] = r0 + r < rows_valid ? fm_ld<float>(p, dt, off + (r0 + r) * D + d) : 0.0f;
    }
}

/* Forward: a block = T_FWD_RPW * WARPS query rows of one (b, h); K/V tiles in shared memory. */
__global__ void sdpa_fwd_tiled(attn_geom g, int64_t nqt, const void *q, const void *k, const void *v, void *o, float *lse) {
    extern __shared__ float sh[];
    const int BQ = T_FWD_RPW * WARPS, D = (int)g.D, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *qs = sh, *ks = qs + BQ * D, *vs = ks + TILE * (D + 1);
    const int64_t bh = blockIdx.x / nqt, q0 = (blockIdx.x % nqt) * BQ, b = bh / g.H, h = bh % g.H;
    const int64_t qoff = bh * g.Tq * g.D, koff = (b * g.Hkv + h / (g.H / g.Hkv)) * g.Tk * g.D;
    const float sc = (float)g.scale;
    stage_rows(qs, D, q, g.dt, qoff, q0, BQ, g.Tq, D);
    float m[T_FWD_RPW], l[T_FWD_RPW], acc[T_FWD_RPW][TMAX_E];
    int64_t nrow[T_FWD_RPW];
    #pragma unroll
    for (int rr = 0; rr < T_FWD_RPW; rr++) {
        const int64_t i = q0 + w * T_FWD_RPW + rr;
        m[rr] = -INFINITY;
        l[rr] = 0;
        #pragma unroll
        for (int e = 0; e < TMAX_E; e++) acc[rr][e] = 0;
        nrow[rr] = i >= g.Tq ? 0 : g.causal ? (i + 1 < g.Tk ? i + 1 : g.Tk) : g.Tk;
    }
    const int64_t kend = g.causal ? (q0 + BQ < g.Tk ? q0 + BQ : g.Tk) : g.Tk;
    for (int64_t k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads(); /* the previous tile is read by every warp */
        stage_rows(ks, D + 1, k, g.dt, koff, k0, TILE, g.Tk, D);
        stage_rows(vs, D, v, g.dt, koff, k0, TILE, g.Tk, D);
        __syncthreads();
        #pragma unroll
        for (int rr = 0; rr < T_FWD_RPW; rr++) {
            const int64_t n = nrow[rr];
            if (k0 >= n) continue; /* the same for the whole warp */
            const float *qr = qs + (w * T_FWD_RPW + rr) * D, *kr = ks + lane * (D + 1);
            float s = 0;
            for (int d = 0; d < D; d++) s += qr[d] * kr[d];
            const bool valid = k0 + lane < n;
            s = valid ? s * sc : -INFINITY;
            const float mn = fmaxf(m[rr], fm_warp_max<float>(s)); /* finite: lane 0 is valid */
            const float corr = expf(m[rr] - mn), p = valid ? expf(s - mn) : 0.0f;
            l[rr] = l[rr] * corr + fm_warp_sum<float>(p);
            #pragma unroll
            for (int e = 0; e < TMAX_E; e++) acc[rr][e] *= corr;
            const int nj = n - k0 < TILE ? (int)(n - k0) : TILE;
            for (int j = 0; j < nj; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                #pragma unroll
                for (int e = 0; e < TMAX_E; e++) {
                    const int d = lane + 32 * e;
                    if (d < D) acc[rr][e] += pj * vs[j * D + d];
                }
            }
            m[rr] = mn;
        }
    }
    #pragma unroll
    for (int rr = 0; rr < T_FWD_RPW; rr++) {
        const int64_t i = q0 + w * T_FWD_RPW + rr;
        if (i >= g.Tq) continue;
        #pragma unroll
        for (int e = 0; e < TMAX_E; e++) {
            const int d = lane + 32 * e;
            if (d < D) fm_st<float>(o, g.dt, qoff + i * g.D + d, nrow[rr] ? acc[rr][e] / l[rr] : NAN);
        }
        if (lane == 0) lse[bh * g.Tq + i] = m[rr] + logf(l[rr]);
    }
}

/* dQ: a block = T_BWD_RPW * WARPS query rows of one (b, h); K/V tiles in shared memory.
 * dq_i = scale * sum_j p_ij (dout_i . v_j - delta_i) k_j. */
__global__ void sdpa_dq_tiled(attn_geom g, int64_t nqt, const void *dout, const void *q, const void *k, const void *v,
                              const float *lse, const float *delta, void *dq) {
    extern __shared__ float sh[];
    const int BQ = T_BWD_RPW * WARPS, D = (int)g.D, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *qs = sh, *dos = qs + BQ * D, *ks = dos + BQ * D, *vs = ks + TILE * (D + 1);
    const int64_t bh = blockIdx.x / nqt, q0 = (blockIdx.x % nqt) * BQ, b = bh / g.H, h = bh % g.H;
    const int64_t qoff = bh * g.Tq * g.D, koff = (b * g.Hkv + h / (g.H / g.Hkv)) * g.Tk * g.D;
    const float sc = (float)g.scale;
    stage_rows(qs, D, q, g.dt, qoff, q0, BQ, g.Tq, D);
    stage_rows(dos, D, dout, g.dt, qoff, q0, BQ, g.Tq, D);
    float acc[T_BWD_RPW][TMAX_E], L[T_BWD_RPW], dl[T_BWD_RPW];
    int64_t nrow[T_BWD_RPW];
    #pragma unroll
    for (int rr = 0; rr < T_BWD_RPW; rr++) {
        const int64_t i = q0 + w * T_BWD_RPW + rr;
        #pragma unroll
        for (int e = 0; e < TMAX_E; e++) acc[rr][e] = 0;
        nrow[rr] = i >= g.Tq ? 0 : g.causal ? (i + 1 < g.Tk ? i + 1 : g.Tk) : g.Tk;
        L[rr] = i < g.Tq ? lse[bh * g.Tq + i] : 0.0f;
        dl[rr] = i < g.Tq ? delta[bh * g.Tq + i] : 0.0f;
    }
    const int64_t kend = g.causal ? (q0 + BQ < g.Tk ? q0 + BQ : g.Tk) : g.Tk;
    for (int64_t k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();
        stage_rows(ks, D + 1, k, g.dt, koff, k0, TILE, g.Tk, D);
        stage_rows(vs, D + 1, v, g.dt, koff, k0, TILE, g.Tk, D);
        __syncthreads();
        #pragma unroll
        for (int rr = 0; rr < T_BWD_RPW; rr++) {
            const int64_t n = nrow[rr];
            if (k0 >= n) continue;
            const float *qr = qs + (w * T_BWD_RPW + rr) * D, *dr = dos + (w * T_BWD_RPW + rr) * D;
            const float *kr = ks + lane * (D + 1), *vr = vs + lane * (D + 1);
            float s = 0, dp = 0;
            for (int d = 0; d < D; d++) {
                s += qr[d] * kr[d];
                dp += dr[d] * vr[d];
            }
            const float p = k0 + lane < n ? expf(s * sc - L[rr]) : 0.0f;
            const float ds = p * (dp - dl[rr]) * sc;
            const int nj = n - k0 < TILE ? (int)(n - k0) : TILE;
            for (int j = 0; j < nj; j++) {
                const float dsj = __shfl_sync(0xffffffffu, ds, j);
                #pragma unroll
                for (int e = 0; e < TMAX_E; e++) {
                    const int d = lane + 32 * e;
                    if (d < D) acc[rr][e] += dsj * ks[j * (D + 1) + d];
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < T_BWD_RPW; rr++) {
        const int64_t i = q0 + w * T_BWD_RPW + rr;
        if (i >= g.Tq) continue;
        #pragma unroll
        for (int e = 0; e < TMAX_E; e++) {
            const int d = lane + 32 * e;
            if (d < D) fm_st<float>(dq, g.dt, qoff + i * g.D + d, acc[rr][e]);
        }
    }
}

/* dK, dV: a block = T_BWD_RPW * WARPS key rows of one (b, kv head); Q/dO tiles (and their
 * lse, delta) of every query head of the group in shared memory.
 * dv_j = sum_i p_ij dout_i;  dk_j = scale * sum_i p_ij (dout_i . v_j - delta_i) q_i. */
__global__ void sdpa_dkv_tiled(attn_geom g, int64_t nkt, const void *dout, const void *q, const void *k, const void *v,
                               const float *lse, const float *delta, void *dk, void *dv) {
    extern __shared__ float sh[];
    const int BK = T_BWD_RPW * WARPS, D = (int)g.D, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *krs = sh, *vrs = krs + BK * D, *qs = vrs + BK * D, *dos = qs + TILE * (D + 1);
    float *ls = dos + TILE * (D + 1), *dls = ls + TILE;
    const int64_t bk = blockIdx.x / nkt, kb0 = (blockIdx.x % nkt) * BK, b = bk / g.Hkv, hk = bk % g.Hkv;
    const int64_t group = g.H / g.Hkv, koff = bk * g.Tk * g.D;
    const float sc = (float)g.scale;
    stage_rows(krs, D, k, g.dt, koff, kb0, BK, g.Tk, D);
    stage_rows(vrs, D, v, g.dt, koff, kb0, BK, g.Tk, D);
    float adk[T_BWD_RPW][TMAX_E], adv[T_BWD_RPW][TMAX_E];
    #pragma unroll
    for (int rr = 0; rr < T_BWD_RPW; rr++)
        #pragma unroll
        for (int e = 0; e < TMAX_E; e++) adk[rr][e] = adv[rr][e] = 0;
    /* causal: query i sees key j when i >= j, so tiles wholly before the block's first key are skipped */
    const int64_t i_first = g.causal ? kb0 - kb0 % TILE : 0;
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        const int64_t bh = b * g.H + h, qoff = bh * g.Tq * g.D;
        for (int64_t i0 = i_first; i0 < g.Tq; i0 += TILE) {
            __syncthreads();
            stage_rows(qs, D + 1, q, g.dt, qoff, i0, TILE, g.Tq, D);
            stage_rows(dos, D + 1, dout, g.dt, qoff, i0, TILE, g.Tq, D);
            if (threadIdx.x < TILE) {
                const int64_t i = i0 + threadIdx.x;
                ls[threadIdx.x] = i < g.Tq ? lse[bh * g.Tq + i] : 0.0f;
                dls[threadIdx.x] = i < g.Tq ? delta[bh * g.Tq + i] : 0.0f;
            }
            __syncthreads();
            const int ni = g.Tq - i0 < TILE ? (int)(g.Tq - i0) : TILE;
            #pragma unroll
            for (int rr = 0; rr < T_BWD_RPW; rr++) {
                const int64_t j = kb0 + w * T_BWD_RPW + rr;
                if (j >= g.Tk || (g.causal && i0 + TILE <= j)) continue; /* no query of this tile sees key j */
                const float *kr = krs + (w * T_BWD_RPW + rr) * D, *vr = vrs + (w * T_BWD_RPW + rr) * D;
                const float *qr = qs + lane * (D + 1), *dr = dos + lane * (D + 1);
                float s = 0, dp = 0;
                for (int d = 0; d < D; d++) {
                    s += qr[d] * kr[d];
                    dp += dr[d] * vr[d];
                }
                const int64_t i = i0 + lane;
                const bool valid = i < g.Tq && (!g.causal || i >= j);
                const float p = valid ? expf(s * sc - ls[lane]) : 0.0f;
                const float ds = p * (dp - dls[lane]) * sc;
                for (int ii = 0; ii < ni; ii++) {
                    const float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
                    #pragma unroll
                    for (int e = 0; e < TMAX_E; e++) {
                        const int d = lane + 32 * e;
                        if (d < D) {
                            adv[rr][e] += pi * dos[ii * (D + 1) + d];
                            adk[rr][e] += dsi * qs[ii * (D + 1) + d];
                        }
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < T_BWD_RPW; rr++) {
        const int64_t j = kb0 + w * T_BWD_RPW + rr;
        if (j >= g.Tk) continue;
        #pragma unroll
        for (int e = 0; e < TMAX_E; e++) {
            const int d = lane + 32 * e;
            if (d < D) {
                fm_st<float>(dk, g.dt, koff + j * g.D + d, adk[rr][e]);
                fm_st<float>(dv, g.dt, koff + j * g.D + d, adv[rr][e]);
            }
        }
    }
}

/* -1: not chosen yet (FATHOM_CUDA_ATTENTION at first use), 0 reference, 1 tiled on CUDA
 * cores (the default), 2 tensor cores where they fit (attention_mma.cu), else tiled. */
static int g_tiled = -1;

extern "C" void fm_cuda_attention_set_tiled(int mode) { g_tiled = mode < 0 ? 0 : mode > 2 ? 2 : mode; }

static void choose(void) {
    if (g_tiled < 0) {
        const char *e = getenv("FATHOM_CUDA_ATTENTION");
        /* the tensor-core kernels are opt-in until they have run on a GPU (docs/CUDA.md) */
        g_tiled = e && !strcmp(e, "reference") ? 0 : e && !strcmp(e, "mma") ? 2 : 1;
    }
}

static bool use_tiled(const attn_geom *g) {
    choose();
    return g_tiled && g->dt != FM_F64 && g->D <= 32 * TMAX_E;
}

static bool use_mma(const attn_geom *g, const void *const *ptrs, int n) {
    choose();
    return g_tiled == 2 && fm_cuda_sdpa_mma_fits(g->dt, g->D, g->Tk, ptrs, n);
}

static fm_status geom(const fm_op_call *c, attn_geom *g) {
    const fm_tensor *q = c->in[c->op == FM_OP_SDPA ? 0 : 1], *k = c->in[c->op == FM_OP_SDPA ? 1 : 2];
    const fm_sdpa_attrs *a = (const fm_sdpa_attrs *)c->attrs;
    g->B = q->shape[0]; g->H = q->shape[1]; g->Tq = q->shape[2]; g->D = q->shape[3];
    g->Hkv = k->shape[1]; g->Tk = k->shape[2];
    g->causal = a->causal;
    g->scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)g->D);
    g->dt = q->dtype;
    if (q->dtype != FM_F32 && q->dtype != FM_F64 && q->dtype != FM_F16 && q->dtype != FM_BF16)
        return fm_cuda_unsupported_dtype(c, q->dtype);
    if (g->D > 32 * MAX_PER_LANE)
        return fm_set_error(FM_ERR_UNSUPPORTED, "%s: head dimension %lld exceeds the cuda kernel's limit of %d",
                            fm_cuda_op_name(c), (long long)g->D, 32 * MAX_PER_LANE);
    return FM_OK;
}

static unsigned warp_blocks(int64_t rows) { return (unsigned)((rows + WARPS - 1) / WARPS); }

static fm_status k_sdpa(const fm_op_call *c) {
    attn_geom g;
    fm_status st = geom(c, &g);
    if (st) return st;
    int64_t rows = g.B * g.H * g.Tq;
    if (rows == 0) return FM_OK;
    cudaStream_t s = fm_cuda_stream();
    float *lse = (float *)fm_tensor_data(c->out[1]);
    const void *ptrs[4] = {fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]), fm_tensor_data(c->out[0])};
    if (use_mma(&g, ptrs, 4)) {
        st = fm_cuda_sdpa_mma_fwd(g.dt, g.B, g.H, g.Hkv, g.Tq, g.Tk, g.D, g.causal, g.scale, ptrs[0], ptrs[1], ptrs[2], (void *)ptrs[3], lse);
        if (st) return st;
    } else if (use_tiled(&g)) {
        const int64_t BQ = T_FWD_RPW * WARPS, nqt = (g.Tq + BQ - 1) / BQ;
        const size_t smem = (size_t)(BQ * g.D + TILE * (g.D + 1) + TILE * g.D) * sizeof(float);
        sdpa_fwd_tiled<<<(unsigned)(g.B * g.H * nqt), 32 * WARPS, smem, s>>>(g, nqt, fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]), fm_tensor_data(c->out[0]), lse);
    } else if (g.dt == FM_F64) sdpa_fwd<double><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]), fm_tensor_data(c->out[0]), lse);
    else sdpa_fwd<float><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]), fm_tensor_data(c->out[0]), lse);
    return fm_cuda_check_launch("scaled_dot_product_attention");
}

/* SDPA_BACKWARD in = {dout, q, k, v, out, lse}; out = {dq, dk, dv}. */
static fm_status k_sdpa_bwd(const fm_op_call *c) {
    attn_geom g;
    fm_status st = geom(c, &g);
    if (st) return st;
    int64_t rows = g.B * g.H * g.Tq, krows = g.B * g.Hkv * g.Tk;
    cudaStream_t s = fm_cuda_stream();
    if (rows == 0 || krows == 0) return FM_OK;
    float *delta = (float *)fm_cuda_scratch_alloc((size_t)rows * sizeof(float));
    if (!delta) return fm_last_status();
    const void *dout = fm_tensor_data(c->in[0]), *q = fm_tensor_data(c->in[1]), *k = fm_tensor_data(c->in[2]);
    const void *v = fm_tensor_data(c->in[3]), *o = fm_tensor_data(c->in[4]);
    const float *lse = (const float *)fm_tensor_data(c->in[5]);
    const void *ptrs[7] = {dout, q, k, v, fm_tensor_data(c->out[0]), fm_tensor_data(c->out[1]), fm_tensor_data(c->out[2])};
    if (use_mma(&g, ptrs, 7)) {
        sdpa_delta<float><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, dout, o, delta);
        st = fm_cuda_sdpa_mma_bwd(g.dt, g.B, g.H, g.Hkv, g.Tq, g.Tk, g.D, g.causal, g.scale, dout, q, k, v, lse, delta, (void *)ptrs[4],
                                  (void *)ptrs[5], (void *)ptrs[6]);
        if (st) { fm_cuda_scratch_free(delta); return st; }
    } else if (use_tiled(&g)) {
        const int64_t BR = T_BWD_RPW * WARPS, nqt = (g.Tq + BR - 1) / BR, nkt = (g.Tk + BR - 1) / BR;
        const size_t smem_q = (size_t)(2 * BR * g.D + 2 * TILE * (g.D + 1)) * sizeof(float);
        const size_t smem_k = (size_t)(2 * BR * g.D + 2 * TILE * (g.D + 1) + 2 * TILE) * sizeof(float);
        sdpa_delta<float><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, dout, o, delta);
        sdpa_dq_tiled<<<(unsigned)(g.B * g.H * nqt), 32 * WARPS, smem_q, s>>>(g, nqt, dout, q, k, v, lse, delta, fm_tensor_data(c->out[0]));
        sdpa_dkv_tiled<<<(unsigned)(g.B * g.Hkv * nkt), 32 * WARPS, smem_k, s>>>(g, nkt, dout, q, k, v, lse, delta, fm_tensor_data(c->out[1]), fm_tensor_data(c->out[2]));
    } else if (g.dt == FM_F64) {
        sdpa_delta<double><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, dout, o, delta);
        sdpa_dq<double><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, dout, q, k, v, lse, delta, fm_tensor_data(c->out[0]));
        sdpa_dkv<double><<<warp_blocks(krows), 32 * WARPS, 0, s>>>(g, dout, q, k, v, lse, delta, fm_tensor_data(c->out[1]), fm_tensor_data(c->out[2]));
    } else {
        sdpa_delta<float><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, dout, o, delta);
        sdpa_dq<float><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, dout, q, k, v, lse, delta, fm_tensor_data(c->out[0]));
        sdpa_dkv<float><<<warp_blocks(krows), 32 * WARPS, 0, s>>>(g, dout, q, k, v, lse, delta, fm_tensor_data(c->out[1]), fm_tensor_data(c->out[2]));
    }
    fm_cuda_scratch_free(delta);
    return fm_cuda_check_launch("sdpa_backward");
}

extern "C" void fm_cuda_kernels_attention(fm_backend *b) {
    b->kernels[FM_OP_SDPA] = k_sdpa;
    b->kernels[FM_OP_SDPA_BACKWARD] = k_sdpa_bwd;
}
