/* CPU kernels for scaled-dot-product attention (SDPA) and its backward.
 *
 * f32 on an AVX2/FMA CPU goes to the tiled flash kernels in attention_avx2.c.
 * Everything else (f64, and f32 without AVX2) takes the reference path below:
 * one query row at a time with a Tk-long score row (never the Tq x Tk matrix),
 * accumulating in double. Its backward recomputes each row's logsumexp in
 * double instead of trusting the f32 one the forward saved, so f64 gradient
 * checks keep full precision.
 *
 * SDPA's inputs arrive contiguous (it is not FM_OPF_STRIDED): q [B,H,Tq,D],
 * k/v [B,Hkv,Tk,D], H a multiple of Hkv; query head h reads kv head h/(H/Hkv).
 * SDPA_QKV reads the heads straight out of a fused projection [B,T,(H+2KV)*D]
 * and writes the merged output [B,T,H*D]; both kernels describe their operands
 * as row layouts (attention_cpu.h), so the arithmetic is the same bits either way.
 * Causal masking is top-left aligned (key j visible to query i iff j <= i), as
 * PyTorch's is_causal. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attention_cpu.h" /* fm_sdpa_io, the AVX2 and AVX-512 kernels */
#include "backend/cpu/cpu_kernels.h"   /* kernel contract, fm_sdpa_attrs */
#include "core/cpu_features.h"       /* fm_cpu_use_avx2, fm_cpu_use_avx512 */
#include "core/parallel.h"           /* fm_parallel_for */

typedef struct ref_ctx {
    const fm_sdpa_io *io;
    fm_dtype dt;
    int oom;
} ref_ctx;

static inline double ld(const void *p, fm_dtype dt, int64_t i) {
    return dt == FM_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static inline void st(void *p, fm_dtype dt, int64_t i, double v) {
    if (dt == FM_F64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}

/* Scores of query row (q at offset qoff) against keys [0, n) of the kv head whose
 * row 0 is at koff; returns the max and fills s[] (already scaled). */
static double row_scores(const ref_ctx *c, int64_t qoff, int64_t koff, int64_t n, double *s) {
    const fm_sdpa_io *g = c->io;
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t d = 0; d < g->D; d++) acc += ld(g->q, c->dt, qoff + d) * ld(g->k, c->dt, koff + j * g->lk.st + d);
        s[j] = acc * g->scale;
        if (s[j] > mx) mx = s[j];
    }
    return mx;
}

static void ref_fwd_range(void *vctx, int64_t r0, int64_t r1, int tid) {
    ref_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, group = g->H / g->Hkv;
    double *s = malloc(sizeof(double) * (size_t)(g->Tk + D));
    if (!s) { c->oom = 1; return; }
    double *acc = s + g->Tk;
    for (int64_t r = r0; r < r1; r++) { /* r = flat (b, h, i) */
        int64_t i = r % g->Tq, bh = r / g->Tq, b = bh / g->H, h = bh % g->H;
        int64_t koff = fm_sdpa_row(g->lk, b, h / group, 0), voff = fm_sdpa_row(g->lv, b, h / group, 0);
        int64_t n = g->causal ? (i + 1 < g->Tk ? i + 1 : g->Tk) : g->Tk;
        double mx = row_scores(c, fm_sdpa_row(g->lq, b, h, i), koff, n, s), l = 0;
        if (g->mask) { /* sdpa_mask: the additive mask, then the max again */
            const int64_t mo = b * g->msb + h * g->msh + i * g->msi;
            mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                s[j] += ld(g->mask, c->dt, mo + j * g->msj);
                if (s[j] > mx) mx = s[j];
            }
        }
        for (int64_t d = 0; d < D; d++) acc[d] = 0;
        for (int64_t j = 0; mx > -INFINITY && j < n; j++) { /* every key masked: the output is 0 */
            double p = exp(s[j] - mx);
            l += p;
            for (int64_t d = 0; d < D; d++) acc[d] += p * ld(g->v, c->dt, voff + j * g->lv.st + d);
        }
        int64_t ooff = fm_sdpa_row(g->lo, b, h, i);
        for (int64_t d = 0; d < D; d++) st(g->o, c->dt, ooff + d, l > 0 ? acc[d] / l : 0.0);
        if (g->lse) g->lse[r] = (float)(mx + log(l));
    }
    free(s);
}

/* One task per (b, kv head): it owns dK/dV of that head and dQ of its query heads. */
static void ref_bwd_range(void *vctx, int64_t t0, int64_t t1, int tid) {
    ref_ctx *c = vctx;
    const fm_sdpa_io *g = c->io;
    const int64_t D = g->D, Tk = g->Tk, group = g->H / g->Hkv;
    double *buf = malloc(sizeof(double) * (size_t)(2 * Tk * D + Tk + D));
    if (!buf) { c->oom = 1; return; }
    double *dK = buf, *dV = dK + Tk * D, *s = dV + Tk * D, *dQ = s + Tk;
    for (int64_t t = t0; t < t1; t++) {
        int64_t b = t / g->Hkv, hk = t % g->Hkv;
        int64_t koff = fm_sdpa_row(g->lk, b, hk, 0), voff = fm_sdpa_row(g->lv, b, hk, 0);
        memset(buf, 0, sizeof(double) * (size_t)(2 * Tk * D));
        for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
            for (int64_t i = 0; i < g->Tq; i++) {
                int64_t qoff = fm_sdpa_row(g->lq, b, h, i), dooff = fm_sdpa_row(g->ldo, b, h, i);
                int64_t ooff = fm_sdpa_row(g->lo, b, h, i);
                int64_t n = g->causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
                double mx = row_scores(c, qoff, koff, n, s), l = 0, delta = 0;
                for (int64_t j = 0; j < n; j++) l += exp(s[j] - mx);
                double lse = mx + log(l);
                for (int64_t d = 0; d < D; d++) {
                    delta += ld(g->dout, c->dt, dooff + d) * ld(g->o, c->dt, ooff + d);
                    dQ[d] = 0;
                }
                for (int64_t j = 0; j < n; j++) {
                    double p = exp(s[j] - lse), dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += ld(g->dout, c->dt, dooff + d) * ld(g->v, c->dt, voff + j * g->lv.st + d);
                    double ds = p * (dp - delta);
                    for (int64_t d = 0; d < D; d++) {
                        dV[j * D + d] += p * ld(g->dout, c->dt, dooff + d);
                        dK[j * D + d] += ds * g->scale * ld(g->q, c->dt, qoff + d);
                        dQ[d] += ds * g->scale * ld(g->k, c->dt, koff + j * g->lk.st + d);
                    }
                }
                int64_t dqoff = fm_sdpa_row(g->ldq, b, h, i);
                for (int64_t d = 0; d < D; d++) st(g->dq, c->dt, dqoff + d, dQ[d]);
            }
        }
        for (int64_t j = 0; j < Tk; j++) {
            int64_t dkoff = fm_sdpa_row(g->ldk, b, hk, j), dvoff = fm_sdpa_row(g->ldv, b, hk, j);
            for (int64_t d = 0; d < D; d++) {
                st(g->dk, c->dt, dkoff + d, dK[j * D + d]);
                st(g->dv, c->dt, dvoff + d, dV[j * D + d]);
            }
        }
    }
    free(buf);
}

/* The bf16 products (io->lowp, f32 operands under bf16 autocast): on a CPU whose bf16 dot
 * product outruns its f32 FMAs (fm_cpu_bf16_dot_fast: AVX512-BF16's vdpbf16ps measured at
 * >= FM_BF16_DOT_MIN_RATE the f32 FMA's rate; not below FATHOM_ISA=avx512) and for head sizes
 * that are whole vectors (D % 16 == 0). Forward and backward take the same decision, so the
 * backward recomputes what the forward computed. Elsewhere the f32 kernels run, unrounded
 * (more precise, and on those CPUs faster). */
static bool sdpa_bf16_usable(const fm_sdpa_io *io, fm_dtype dt) {
    return dt == FM_F32 && io->lowp == FM_BF16 && io->D % 16 == 0 && fm_cpu_use_avx512() && fm_cpu_bf16_dot_fast();
}

static fm_status run_forward(const fm_op_call *call, const fm_sdpa_io *io, fm_dtype dt) {
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    int rc;
    if (sdpa_bf16_usable(io, dt)) {
        rc = fm_sdpa_bf16_forward(io);
        if (!rc) fm_kernel_note_lowp_products();
    } else if (dt == FM_F32 && fm_cpu_use_avx512()) {
        rc = fm_sdpa_f32_avx512_forward(io);
    } else if (dt == FM_F32 && fm_cpu_use_avx2()) {
        rc = fm_sdpa_f32_avx2_forward(io);
    } else {
        ref_ctx c = {io, dt, 0};
        fm_parallel_for(io->B * io->H * io->Tq, 16, ref_fwd_range, &c);
        rc = c.oom ? -1 : 0;
    }
    if (rc) return fm_set_error(FM_ERR_OOM, "%s: out of memory for tile scratch", fm_op_get_info(call->op)->name);
    return FM_OK;
}

static fm_status run_backward(const fm_op_call *call, const fm_sdpa_io *io, fm_dtype dt) {
    if (dt != FM_F32 && dt != FM_F64) return fm_cpu_unsupported_dtype(call, dt);
    int rc;
    if (sdpa_bf16_usable(io, dt)) {
        rc = fm_sdpa_bf16_backward(io);
        if (!rc) fm_kernel_note_lowp_products();
    } else if (dt == FM_F32 && fm_cpu_use_avx512()) {
        rc = fm_sdpa_f32_avx512_backward(io);
    } else if (dt == FM_F32 && fm_cpu_use_avx2()) {
        rc = fm_sdpa_f32_avx2_backward(io);
    } else {
        ref_ctx c = {io, dt, 0};
        fm_parallel_for(io->B * io->Hkv, 1, ref_bwd_range, &c);
        rc = c.oom ? -1 : 0;
    }
    if (rc) return fm_set_error(FM_ERR_OOM, "%s: out of memory for tile scratch", fm_op_get_info(call->op)->name);
    return FM_OK;
}

/* q [B,H,Tq,D], k/v [B,Hkv,Tk,D], all contiguous */
static void plain_io(const fm_tensor *q, const fm_tensor *k, const fm_sdpa_attrs *a, fm_sdpa_io *io) {
    memset(io, 0, sizeof *io);
    io->B = q->shape[0]; io->H = q->shape[1]; io->Tq = q->shape[2]; io->D = q->shape[3];
    io->Hkv = k->shape[1]; io->Tk = k->shape[2];
    io->causal = a->causal;
    io->scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)io->D);
    io->lq = io->lo = io->ldo = io->ldq = fm_sdpa_lay_plain(io->H, io->Tq, io->D);
    io->lk = io->lv = io->ldk = io->ldv = fm_sdpa_lay_plain(io->Hkv, io->Tk, io->D);
    io->lowp = a->lowp;
}

/* A rows-layout input's layout (rows_strided: last stride 1, the others any). */
static fm_sdpa_lay strided_lay(const fm_tensor *t) { return (fm_sdpa_lay){t->strides[0], t->strides[1], t->strides[2]}; }

static fm_status sdpa_kernel(const fm_op_call *call) {
    fm_sdpa_io io;
    plain_io(call->in[0], call->in[1], call->attrs, &io);
    /* q, k and v may be views with spare rows (the graph's in-place KV cache):
     * the kernels read every operand through its layout. */
    io.lq = strided_lay(call->in[0]), io.lk = strided_lay(call->in[1]), io.lv = strided_lay(call->in[2]);
    io.q = fm_tensor_data(call->in[0]); io.k = fm_tensor_data(call->in[1]); io.v = fm_tensor_data(call->in[2]);
    io.o = fm_tensor_data(call->out[0]);
    io.lse = fm_tensor_data(call->out[1]);
    return run_forward(call, &io, call->in[0]->dtype);
}

static fm_status sdpa_backward_kernel(const fm_op_call *call) {
    fm_sdpa_io io;
    plain_io(call->in[1], call->in[2], call->attrs, &io);
    io.dout = fm_tensor_data(call->in[0]);
    io.q = fm_tensor_data(call->in[1]); io.k = fm_tensor_data(call->in[2]); io.v = fm_tensor_data(call->in[3]);
    io.o = fm_tensor_data(call->in[4]);
    io.lse = fm_tensor_data(call->in[5]);
    io.dq = fm_tensor_data(call->out[0]); io.dk = fm_tensor_data(call->out[1]); io.dv = fm_tensor_data(call->out[2]);
    return run_backward(call, &io, call->in[1]->dtype);
}

/* sdpa_mask: q [B,H,Tq,D], k/v [B,Hkv,Tk,D] in rows layout, mask broadcastable to
 * [B,H,Tq,Tk] (its size-1 dims read with stride 0); out [B,H,Tq,D] */
static fm_status sdpa_mask_kernel(const fm_op_call *call) {
    fm_sdpa_io io;
    const fm_tensor *m = call->in[3];
    plain_io(call->in[0], call->in[1], call->attrs, &io);
    io.lowp = FM_F32;
    io.lq = strided_lay(call->in[0]), io.lk = strided_lay(call->in[1]), io.lv = strided_lay(call->in[2]);
    io.q = fm_tensor_data(call->in[0]); io.k = fm_tensor_data(call->in[1]); io.v = fm_tensor_data(call->in[2]);
    io.o = fm_tensor_data(call->out[0]);
    int64_t ms[4] = {0, 0, 0, 0}; /* right-aligned to [B, H, Tq, Tk] */
    for (int d = 0; d < m->ndim; d++) ms[4 - m->ndim + d] = m->shape[d] == 1 ? 0 : m->strides[d];
    io.mask = fm_tensor_data(call->in[3]);
    io.msb = ms[0], io.msh = ms[1], io.msi = ms[2], io.msj = ms[3];
    return run_forward(call, &io, call->in[0]->dtype);
}

/* qkv [B,T,(H+2KV)*D] (and dqkv alike): q heads, then k heads, then v heads in
 * each row; the output (and its gradient) [B,T,H*D]. */
static void qkv_io(const fm_tensor *qkv, const fm_sdpa_qkv_attrs *a, fm_sdpa_io *io) {
    memset(io, 0, sizeof *io);
    const int64_t T = qkv->shape[1], H = a->n_head, KV = a->n_kv_head, D = a->head_dim, W = (H + 2 * KV) * D;
    io->B = qkv->shape[0]; io->H = H; io->Hkv = KV; io->Tq = io->Tk = T; io->D = D;
    io->causal = a->causal;
    io->scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)D);
    io->lq = io->lk = io->lv = io->ldq = io->ldk = io->ldv = (fm_sdpa_lay){T * W, D, W};
    io->lo = io->ldo = (fm_sdpa_lay){T * H * D, D, H * D};
    io->lowp = a->lowp;
}

static fm_status sdpa_qkv_kernel(const fm_op_call *call) {
    fm_sdpa_io io;
    const fm_sdpa_qkv_attrs *a = call->attrs;
    qkv_io(call->in[0], a, &io);
    size_t es = fm_dtype_size(call->in[0]->dtype);
    const char *base = fm_tensor_data(call->in[0]);
    io.q = base; io.k = base + (size_t)(a->n_head * a->head_dim) * es;
    io.v = base + (size_t)((a->n_head + a->n_kv_head) * a->head_dim) * es;
    io.o = fm_tensor_data(call->out[0]);
    io.lse = fm_tensor_data(call->out[1]);
    return run_forward(call, &io, call->in[0]->dtype);
}

static fm_status sdpa_qkv_backward_kernel(const fm_op_call *call) {
    fm_sdpa_io io;
    const fm_sdpa_qkv_attrs *a = call->attrs;
    qkv_io(call->in[1], a, &io);
    size_t es = fm_dtype_size(call->in[1]->dtype), ko = (size_t)(a->n_head * a->head_dim) * es,
           vo = (size_t)((a->n_head + a->n_kv_head) * a->head_dim) * es;
    const char *base = fm_tensor_data(call->in[1]);
    char *dbase = fm_tensor_data(call->out[0]);
    io.dout = fm_tensor_data(call->in[0]);
    io.q = base; io.k = base + ko; io.v = base + vo;
    io.o = fm_tensor_data(call->in[2]);
    io.lse = fm_tensor_data(call->in[3]);
    io.dq = dbase; io.dk = dbase + ko; io.dv = dbase + vo;
    return run_backward(call, &io, call->in[1]->dtype);
}

/* ---- sdpa_kv16: f32 queries over an f16 KV cache (attention_cpu.h) ---- */

void fm_sdpa_kv16_row_ref(const fm_kv16_io *io, int64_t b, int64_t h, int64_t i, float *scratch) {
    const int64_t D = io->D, n = io->L - io->T + i + 1, hk = h / (io->H / io->Hkv);
    const float *q = io->q + fm_sdpa_row(io->lq, b, h, i);
    const uint16_t *K = io->k + fm_sdpa_row(io->lk, b, hk, 0), *V = io->v + fm_sdpa_row(io->lv, b, hk, 0);
    float *s = scratch, *acc = scratch + io->L, mx = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float a = 0.0f;
        for (int64_t d = 0; d < D; d++) a += q[d] * io->scale * fm_f16_to_f32(K[j * io->lk.st + d]);
        s[j] = a;
        mx = a > mx ? a : mx;
    }
    for (int64_t j = 0; j < n; j++) sum += s[j] = expf(s[j] - mx);
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < D; d++) acc[d] += s[j] * fm_f16_to_f32(V[j * io->lv.st + d]);
    float *out = io->o + fm_sdpa_row(io->lo, b, h, i);
    for (int64_t d = 0; d < D; d++) out[d] = acc[d] / sum;
}

typedef struct { const fm_kv16_io *io; int avx2; atomic_int oom; } kv16_ctx;

static void kv16_range(void *vctx, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    kv16_ctx *c = vctx;
    const fm_kv16_io *io = c->io;
    float *scratch = malloc(sizeof(float) * (size_t)(io->L + 2 * io->D));
    if (!scratch) { atomic_store(&c->oom, 1); return; }
    for (int64_t r = r0; r < r1; r++) { /* r = flat (b, h, i) */
        const int64_t i = r % io->T, bh = r / io->T;
        if (c->avx2) fm_sdpa_kv16_row_avx2(io, bh / io->H, bh % io->H, i, scratch);
        else fm_sdpa_kv16_row_ref(io, bh / io->H, bh % io->H, i, scratch);
    }
    free(scratch);
}

/* in = {q [B,H,T,D] f32, k, v [B,Hkv,L,D] f16}, rows with any strides (the graph's
 * cache views); out = {[B,H,T,D] f32}; attrs fm_sdpa_attrs (its scale) */
static fm_status sdpa_kv16_kernel(const fm_op_call *call) {
    const fm_tensor *q = call->in[0], *k = call->in[1], *o = call->out[0];
    const fm_sdpa_attrs *a = call->attrs;
    fm_kv16_io io = {q->shape[0], q->shape[1], k->shape[1], q->shape[2], k->shape[2], q->shape[3], 0.0f,
                     fm_tensor_data(q), strided_lay(q), fm_tensor_data(k), fm_tensor_data(call->in[2]), strided_lay(k),
                     strided_lay(call->in[2]), fm_tensor_data(o), strided_lay(o)};
    io.scale = (float)(a->scale > 0 ? a->scale : 1.0 / sqrt((double)io.D));
    kv16_ctx c = {&io, fm_cpu_use_avx2(), 0};
    fm_parallel_for(io.B * io.H * io.T, 1, kv16_range, &c);
    if (atomic_load(&c.oom)) return fm_set_error(FM_ERR_OOM, "sdpa_kv16: out of memory for a row's scratch");
    return FM_OK;
}

void fm_cpu_kernels_attention(fm_backend *b) {
    b->kernels[FM_OP_SDPA_KV16] = sdpa_kv16_kernel;
    b->rows_strided[FM_OP_SDPA_KV16] = true;
    b->kernels[FM_OP_SDPA_MASK] = sdpa_mask_kernel;
    b->rows_strided[FM_OP_SDPA_MASK] = true;
    b->kernels[FM_OP_SDPA] = sdpa_kernel;
    b->rows_strided[FM_OP_SDPA] = true;
    b->kernels[FM_OP_SDPA_BACKWARD] = sdpa_backward_kernel;
    b->kernels[FM_OP_SDPA_QKV] = sdpa_qkv_kernel;
    b->kernels[FM_OP_SDPA_QKV_BACKWARD] = sdpa_qkv_backward_kernel;
}
