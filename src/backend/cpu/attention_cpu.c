/* CPU kernels for scaled-dot-product attention (SDPA) and its backward.
 *
 * f32 on an AVX2/FMA CPU goes to the tiled flash kernels in attention_avx2.c.
 * Everything else (f64, and f32 without AVX2) takes the reference path below:
 * one query row at a time with a Tk-long score row (never the Tq x Tk matrix),
 * accumulating in double. Its backward recomputes each row's logsumexp in
 * double instead of trusting the f32 one the forward saved, so f64 gradient
 * checks keep full precision.
 *
 * Inputs arrive contiguous (SDPA is not FM_OPF_STRIDED): q [B,H,Tq,D],
 * k/v [B,Hkv,Tk,D], H a multiple of Hkv; query head h reads kv head h/(H/Hkv).
 * Causal masking is top-left aligned (key j visible to query i iff j <= i), as
 * PyTorch's is_causal. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h" /* kernel contract, fm_sdpa_attrs */
#include "core/cpu_features.h"       /* fm_cpu_use_avx2 */
#include "core/parallel.h"           /* fm_parallel_for */

/* attention_avx2.c (f32 only); they return -1 when scratch memory ran out. */
int fm_sdpa_f32_avx2_forward(const float *q, const float *k, const float *v, float *o, float *lse, int64_t B,
                             int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, int causal, float scale);
int fm_sdpa_f32_avx2_backward(const float *dout, const float *q, const float *k, const float *v, const float *o,
                              const float *lse, float *dq, float *dk, float *dv, int64_t B, int64_t H, int64_t Hkv,
                              int64_t Tq, int64_t Tk, int64_t D, int causal, float scale);

typedef struct ref_ctx {
    int64_t B, H, Hkv, Tq, Tk, D;
    int causal;
    double scale;
    fm_dtype dt;
    const void *q, *k, *v, *o, *dout;
    void *out, *dq, *dk, *dv;
    float *lse;
    int oom;
} ref_ctx;

static inline double ld(const void *p, fm_dtype dt, int64_t i) {
    return dt == FM_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static inline void st(void *p, fm_dtype dt, int64_t i, double v) {
    if (dt == FM_F64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}

/* Scores of query row (q at flat offset qoff) against keys [0, n) of kv offset koff;
 * returns the max and fills s[] (already scaled). */
static double row_scores(const ref_ctx *c, int64_t qoff, int64_t koff, int64_t n, double *s) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t d = 0; d < c->D; d++) acc += ld(c->q, c->dt, qoff + d) * ld(c->k, c->dt, koff + j * c->D + d);
        s[j] = acc * c->scale;
        if (s[j] > mx) mx = s[j];
    }
    return mx;
}

static void ref_fwd_range(void *vctx, int64_t r0, int64_t r1, int tid) {
    ref_ctx *c = vctx;
    const int64_t D = c->D, group = c->H / c->Hkv;
    double *s = malloc(sizeof(double) * (size_t)(c->Tk + D));
    if (!s) { c->oom = 1; return; }
    double *acc = s + c->Tk;
    for (int64_t r = r0; r < r1; r++) { /* r = flat (b, h, i) */
        int64_t i = r % c->Tq, bh = r / c->Tq, b = bh / c->H, h = bh % c->H;
        int64_t koff = (b * c->Hkv + h / group) * c->Tk * D;
        int64_t n = c->causal ? (i + 1 < c->Tk ? i + 1 : c->Tk) : c->Tk;
        double mx = row_scores(c, r * D, koff, n, s), l = 0;
        for (int64_t d = 0; d < D; d++) acc[d] = 0;
        for (int64_t j = 0; j < n; j++) {
            double p = exp(s[j] - mx);
            l += p;
            for (int64_t d = 0; d < D; d++) acc[d] += p * ld(c->v, c->dt, koff + j * D + d);
        }
        for (int64_t d = 0; d < D; d++) st(c->out, c->dt, r * D + d, acc[d] / l);
        c->lse[r] = (float)(mx + log(l));
    }
    free(s);
}

/* One task per (b, kv head): it owns dK/dV of that head and dQ of its query heads. */
static void ref_bwd_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    ref_ctx *c = vctx;
    const int64_t D = c->D, Tk = c->Tk, group = c->H / c->Hkv;
    double *buf = malloc(sizeof(double) * (size_t)(2 * Tk * D + Tk + D));
    if (!buf) { c->oom = 1; return; }
    double *dK = buf, *dV = dK + Tk * D, *s = dV + Tk * D, *dQ = s + Tk;
    for (int64_t t = t0; t < t1; t++) {
        int64_t b = t / c->Hkv, koff = t * Tk * D;
        memset(buf, 0, sizeof(double) * (size_t)(2 * Tk * D));
        for (int64_t h = (t % c->Hkv) * group; h < (t % c->Hkv + 1) * group; h++) {
            for (int64_t i = 0; i < c->Tq; i++) {
                int64_t r = (b * c->H + h) * c->Tq + i, qoff = r * D;
                int64_t n = c->causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
                double mx = row_scores(c, qoff, koff, n, s), l = 0, delta = 0;
                for (int64_t j = 0; j < n; j++) l += exp(s[j] - mx);
                double lse = mx + log(l);
                for (int64_t d = 0; d < D; d++) {
                    delta += ld(c->dout, c->dt, qoff + d) * ld(c->o, c->dt, qoff + d);
                    dQ[d] = 0;
                }
                for (int64_t j = 0; j < n; j++) {
                    double p = exp(s[j] - lse), dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += ld(c->dout, c->dt, qoff + d) * ld(c->v, c->dt, koff + j * D + d);
                    double ds = p * (dp - delta);
                    for (int64_t d = 0; d < D; d++) {
                        dV[j * D + d] += p * ld(c->dout, c->dt, qoff + d);
                        dK[j * D + d] += ds * c->scale * ld(c->q, c->dt, qoff + d);
                        dQ[d] += ds * c->scale * ld(c->k, c->dt, koff + j * D + d);
                    }
                }
                for (int64_t d = 0; d < D; d++) st(c->dq, c->dt, qoff + d, dQ[d]);
            }
        }
        for (int64_t e = 0; e < Tk * D; e++) {
            st(c->dk, c->dt, koff + e, dK[e]);
            st(c->dv, c->dt, koff + e, dV[e]);
        }
    }
    free(buf);
}

static void geom(const fm_op_call *call, ref_ctx *c) {
    const fm_tensor *q = call->in[call->op == FM_OP_SDPA ? 0 : 1], *k = call->in[call->op == FM_OP_SDPA ? 1 : 2];
    const fm_sdpa_attrs *a = call->attrs;
    c->B = q->shape[0]; c->H = q->shape[1]; c->Tq = q->shape[2]; c->D = q->shape[3];
    c->Hkv = k->shape[1]; c->Tk = k->shape[2];
    c->causal = a->causal;
    c->scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)c->D);
    c->dt = q->dtype;
}

static fm_status sdpa_kernel(const fm_op_call *call) {
    ref_ctx c;
    memset(&c, 0, sizeof c);
    geom(call, &c);
    if (c.dt != FM_F32 && c.dt != FM_F64) return fm_cpu_unsupported_dtype(call, c.dt);
    float *lse = fm_tensor_data(call->out[1]);
    int rc = 0;
    if (c.dt == FM_F32 && fm_cpu_use_avx2()) {
        rc = fm_sdpa_f32_avx2_forward(fm_tensor_data(call->in[0]), fm_tensor_data(call->in[1]),
                                      fm_tensor_data(call->in[2]), fm_tensor_data(call->out[0]), lse, c.B, c.H,
                                      c.Hkv, c.Tq, c.Tk, c.D, c.causal, (float)c.scale);
    } else {
        c.q = fm_tensor_data(call->in[0]); c.k = fm_tensor_data(call->in[1]); c.v = fm_tensor_data(call->in[2]);
        c.out = fm_tensor_data(call->out[0]);
        c.lse = lse;
        fm_parallel_for(c.B * c.H * c.Tq, 16, ref_fwd_range, &c);
        rc = c.oom ? -1 : 0;
    }
    if (rc) return fm_set_error(FM_ERR_OOM, "scaled_dot_product_attention: out of memory for tile scratch");
    return FM_OK;
}

static fm_status sdpa_backward_kernel(const fm_op_call *call) {
    ref_ctx c;
    memset(&c, 0, sizeof c);
    geom(call, &c);
    if (c.dt != FM_F32 && c.dt != FM_F64) return fm_cpu_unsupported_dtype(call, c.dt);
    int rc = 0;
    if (c.dt == FM_F32 && fm_cpu_use_avx2()) {
        rc = fm_sdpa_f32_avx2_backward(fm_tensor_data(call->in[0]), fm_tensor_data(call->in[1]),
                                       fm_tensor_data(call->in[2]), fm_tensor_data(call->in[3]),
                                       fm_tensor_data(call->in[4]), fm_tensor_data(call->in[5]),
                                       fm_tensor_data(call->out[0]), fm_tensor_data(call->out[1]),
                                       fm_tensor_data(call->out[2]), c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.causal,
                                       (float)c.scale);
    } else {
        c.dout = fm_tensor_data(call->in[0]);
        c.q = fm_tensor_data(call->in[1]); c.k = fm_tensor_data(call->in[2]); c.v = fm_tensor_data(call->in[3]);
        c.o = fm_tensor_data(call->in[4]);
        c.dq = fm_tensor_data(call->out[0]); c.dk = fm_tensor_data(call->out[1]); c.dv = fm_tensor_data(call->out[2]);
        fm_parallel_for(c.B * c.Hkv, 1, ref_bwd_range, &c);
        rc = c.oom ? -1 : 0;
    }
    if (rc) return fm_set_error(FM_ERR_OOM, "sdpa_backward: out of memory for tile scratch");
    return FM_OK;
}

void fm_cpu_kernels_attention(fm_backend *b) {
    b->kernels[FM_OP_SDPA] = sdpa_kernel;
    b->kernels[FM_OP_SDPA_BACKWARD] = sdpa_backward_kernel;
}
