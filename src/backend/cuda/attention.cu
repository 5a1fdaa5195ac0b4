/* CUDA scaled-dot-product attention (forward + backward), fathom's own
 * flash-style kernels: no Tq x Tk matrix is ever stored; the forward keeps a
 * running max and sum per query row (online softmax) and saves the row's
 * logsumexp, and the backward recomputes probabilities from it.
 *
 * This is the correctness-first version: one warp per query row (forward, dQ)
 * or per key row (dK, dV), each lane holding D/32 elements, so every kernel is
 * deterministic and needs no atomics; GQA (Hkv dividing H) and top-left causal
 * masking as on the CPU. It is not yet tiled through shared memory or tensor
 * cores; docs/CUDA.md lists that as the next step, measured against torch SDPA
 * by tools/gpu-check.sh. D is limited to 256. */
#include <math.h>

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
    if (g.dt == FM_F64) sdpa_fwd<double><<<warp_blocks(rows), 32 * WARPS, 0, s>>>(g, fm_tensor_data(c->in[0]), fm_tensor_data(c->in[1]), fm_tensor_data(c->in[2]), fm_tensor_data(c->out[0]), lse);
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
    if (g.dt == FM_F64) {
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
