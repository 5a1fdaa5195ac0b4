/* What each CPU kernel borrows from fathom's caching allocator for itself,
 * replayed on the meta device: the same sizes, in the same order, alive for
 * the same span of the call. Scratch from malloc (GEMM packing, attention rows,
 * fused partials) is not counted on the CPU either, so it is not here.
 *
 * Each block mirrors the CPU code it names; the meta-vs-CPU test
 * (tests/test_meta_device.c) trains fashion-mlp, fashion-cnn and a GPT on both
 * and fails on any byte of difference, so a change there shows up here. */
#include "backend/meta/meta_scratch.h"

#include "backend/conv_geom.h"

#include <string.h>

#include "core/parallel.h"
#include "core/tensor_internal.h" /* fm_view_raw */

/* n elements of dt (at least one): conv_shared.h scratch(), norm partials, cat offsets */
static fm_tensor *scratch(int64_t n, fm_dtype dt, fm_device dev) {
    int64_t shape[1] = {n > 0 ? n : 1};
    return fm_tensor_empty(1, shape, dt, dev);
}

/* Allocates n blocks in order, then frees them all: the kernels' pattern. */
static fm_status hold(fm_device dev, int n, const int64_t *elems, const fm_dtype *dts) {
    fm_tensor *t[5] = {0};
    fm_status st = FM_OK;
    for (int i = 0; i < n && st == FM_OK; i++)
        if (elems[i] >= 0 && !(t[i] = scratch(elems[i], dts[i], dev))) st = fm_last_status();
    for (int i = 0; i < n; i++) fm_tensor_release(t[i]);
    return st;
}

/* ---- conv2d_cpu.c ---- */

/* fm_conv_geom, fm_conv_geometry: backend/conv_geom.h, as conv2d_cpu.c reads it */

/* conv_chunk: samples per chunk for about 1 MiB of im2col columns */
static int64_t conv_chunk(const fm_conv_geom *g, size_t es) {
    int64_t per = g->K * g->P > 0 ? g->K * g->P : 1;
    int64_t nc = (int64_t)((1u << 20) / es) / per;
    if (nc < 1) nc = 1;
    if (nc > g->N) nc = g->N;
    return nc;
}

static bool conv_direct(const fm_conv_geom *g, int64_t nb) { return nb == 1 || g->P >= 256; }

/* conv2d_kernel: NHWC reorders the weights (+ columns unless pointwise); NCHW
 * takes columns and, unless direct, a staging block, both unless pointwise. */
static fm_status conv_fwd(const fm_op_call *c, fm_device dev) {
    const fm_conv2d_attrs *a = c->attrs;
    fm_tensor *x = c->in[0], *y = c->out[0];
    if (fm_tensor_numel(y) == 0) return FM_OK;
    fm_conv_geom g = fm_conv_geometry(&a->p, x, c->in[1], y);
    fm_dtype dt = x->dtype;
    int64_t nc = conv_chunk(&g, fm_dtype_size(dt));
    if (fm_conv2d_lowp_products(a, dt, g.K)) /* conv2d_fwd_lowp: bf16 weights and columns, an f32 staging block */
        return hold(dev, 3, (int64_t[]){g.O * g.K, g.K * nc * g.P, g.Og * nc * g.P}, (fm_dtype[]){FM_BF16, FM_BF16, FM_F32});
    if (fm_conv_dw_direct(&g, dt)) { /* conv_dw.c: a padded plane and the tap offsets per pool thread */
        const int64_t nt = fm_num_threads() < 1 ? 1 : fm_num_threads();
        return hold(dev, 2, (int64_t[]){nt * fm_conv_dw_scratch_floats(g.H, g.W, g.ph, g.pw, g.sw, g.kw), nt * g.kh * g.kw},
                    (fm_dtype[]){FM_F32, FM_I64});
    }
    if (g.nhwc) return hold(dev, 2, (int64_t[]){g.O * g.K, g.pointwise ? -1 : nc * g.P * g.K}, (fm_dtype[]){dt, dt});
    if (g.pointwise || fm_conv_grouped_avx2(&g, dt) || fm_conv_strided_avx2(&g, dt)) return FM_OK;
    return hold(dev, 2, (int64_t[]){g.K * nc * g.P, conv_direct(&g, nc) ? -1 : g.Og * nc * g.P}, (fm_dtype[]){dt, dt});
}

/* conv2d_backward_kernel: NHWC bias gradients sum through per-block f64
 * partials first; then the weight/input gradients' scratch as forward's (NHWC
 * with a second reordered weight block). */
static fm_status conv_bwd(const fm_op_call *c, fm_device dev) {
    const fm_conv2d_attrs *a = c->attrs;
    fm_tensor *dy = c->in[0], *x = c->in[1];
    if (fm_tensor_numel(dy) == 0) return FM_OK;
    fm_conv_geom g = fm_conv_geometry(&a->p, x, c->in[2], dy);
    fm_dtype dt = x->dtype;
    fm_status st = FM_OK;
    if (c->out[2] && g.nhwc) {
        int64_t nblk = (g.N * g.P + 255) / 256;
        if ((st = hold(dev, 1, (int64_t[]){nblk * g.O}, (fm_dtype[]){FM_F64}))) return st;
    }
    if (!c->out[0] && !c->out[1]) return FM_OK;
    int64_t nc = conv_chunk(&g, fm_dtype_size(dt));
    if (fm_conv2d_lowp_products(a, dt, g.K)) { /* conv2d_bwd_lowp */
        bool dx = c->out[0], dw = c->out[1];
        return hold(dev, 5,
                    (int64_t[]){dx ? g.O * g.K : -1, dw ? g.K * nc * g.P : -1, g.Og * nc * g.P, dx ? g.K * nc * g.P : -1,
                                dw && nc < g.N ? g.Og * g.K : -1},
                    (fm_dtype[]){FM_BF16, FM_BF16, FM_BF16, FM_F32, FM_F32});
    }
    if (g.nhwc)
        return hold(dev, 3, (int64_t[]){g.O * g.K, g.O * g.K, g.pointwise ? -1 : nc * g.P * g.K}, (fm_dtype[]){dt, dt, dt});
    if (g.pointwise) return FM_OK;
    return hold(dev, 2, (int64_t[]){g.K * nc * g.P, conv_direct(&g, nc) ? -1 : g.Og * nc * g.P}, (fm_dtype[]){dt, dt});
}

/* ---- batchnorm_cpu.c: a statistics block, and inside it (training, or any
 * backward) per-256-row partials when the channels are innermost ---- */

static fm_status batch_norm(const fm_op_call *c, fm_device dev, bool backward) {
    const fm_bn_attrs *a = c->attrs;
    const fm_tensor *x = c->in[backward ? 1 : 0];
    int64_t outer, C, inner = 1;
    if (a->layout == FM_NHWC) {
        C = x->shape[x->ndim - 1];
        outer = C ? fm_tensor_numel(x) / C : 0;
    } else {
        outer = x->shape[0];
        C = x->shape[1];
        for (int d = 2; d < x->ndim; d++) inner *= x->shape[d];
    }
    fm_tensor *st = scratch((backward ? 7 : 4) * C, FM_F64, dev);
    if (!st) return fm_last_status();
    fm_status s = FM_OK;
    if ((backward || a->training) && inner == 1 && outer != 0)
        s = hold(dev, 1, (int64_t[]){(outer + 255) / 256 * 2 * C}, (fm_dtype[]){FM_F64});
    fm_tensor_release(st);
    return s;
}

/* ---- norm_cpu.c norm_bwd: weight/bias gradient partials per chunk of rows ---- */

static fm_status norm_bwd(const fm_op_call *c, fm_device dev, bool rms) {
    const fm_tensor *x = c->in[1], *rstd = c->in[rms ? 3 : 4];
    const fm_tensor *dw = c->n_out > 1 ? c->out[1] : NULL, *db = !rms && c->n_out > 2 ? c->out[2] : NULL;
    int64_t M = fm_tensor_numel(rstd), N = M ? fm_tensor_numel(x) / M : 0;
    if (M == 0 || N == 0) return FM_OK;
    int64_t rows = (M + 63) / 64;
    if (rows < 32) rows = 32;
    int64_t part_n = (M + rows - 1) / rows * N;
    return hold(dev, 2, (int64_t[]){dw ? part_n : -1, db ? part_n : -1}, (fm_dtype[]){x->dtype, x->dtype});
}

/* conv2d_fused_kernel (conv_fused_cpu.c, which names its blocks): the direct kernels'
 * blocks, or the reference path's unpooled output and conv2d's scratch under it. */
static fm_status conv_fused(const fm_op_call *c, fm_device dev) {
    int64_t f[4], ts[4];
    const int n = fm_cpu_conv2d_fused_scratch(c, f, ts);
    if (n >= 0) return hold(dev, n, f, (fm_dtype[]){FM_F32, FM_F32, FM_F32, FM_F32});
    fm_tensor *y = c->out[0], *t = NULL;
    if (ts[0] >= 0 && !(t = fm_tensor_empty(4, ts, y->dtype, dev))) return fm_last_status();
    const fm_conv2d_fused_attrs *a = c->attrs;
    fm_conv2d_attrs ca = {a->p, FM_F32};
    fm_op_call cc = {.op = FM_OP_CONV2D, .n_in = 3, .n_out = 1, .in = {c->in[0], c->in[1], c->in[2]}, .out = {t ? t : y}, .attrs = &ca};
    fm_status st = conv_fwd(&cc, dev);
    fm_tensor_release(t);
    return st;
}

static fm_status inner_scratch(const fm_op_call *c, fm_device dev) {
    int64_t n[4];
    fm_dtype dt[4];
    switch (c->op) {
    case FM_OP_CONV2D_FUSED: return conv_fused(c, dev);
    case FM_OP_QCONV2D_INT8: /* qconv_cpu.c: codes, NHWC codes, columns and staging (or per-thread ones) */
        return hold(dev, fm_cpu_qconv8_scratch(c, n, dt), n, dt);
    case FM_OP_QLINEAR_INT8: /* quant_cpu.c: the activation codes */
        return hold(dev, 1, (int64_t[]){fm_cpu_qlinear8_scratch(c)}, (fm_dtype[]){FM_U8});
    case FM_OP_CONV2D: return conv_fwd(c, dev);
    case FM_OP_CONV2D_BACKWARD: return conv_bwd(c, dev);
    case FM_OP_BATCH_NORM: return batch_norm(c, dev, false);
    case FM_OP_BATCH_NORM_BACKWARD: return batch_norm(c, dev, true);
    case FM_OP_LAYER_NORM_BACKWARD: return norm_bwd(c, dev, false);
    case FM_OP_RMS_NORM_BACKWARD: return norm_bwd(c, dev, true);
    case FM_OP_CAT: /* cat_kernel: offsets in a block past 64 inputs */
        return c->n_in > 64 ? hold(dev, 1, (int64_t[]){c->n_in}, (fm_dtype[]){FM_I64}) : FM_OK;
    default: return FM_OK;
    }
}

/* ---- lowp_cpu.c: ops flagged FM_OPF_F32_ONLY widen bf16/f16 tensors to f32
 * copies around the f32 kernel (SDPA an eighth of the batch at a time) ---- */

static bool lowp(const fm_tensor *t) { return t && (t->dtype == FM_BF16 || t->dtype == FM_F16); }

static fm_status lowp_call(const fm_op_call *c, fm_device dev) {
    fm_op_call w = *c;
    fm_tensor *tmp[FM_CALL_MAX_IN + FM_CALL_MAX_OUT] = {0};
    fm_status st = FM_OK;
    for (int i = 0; i < c->n_in + c->n_out && st == FM_OK; i++) {
        fm_tensor *t = i < c->n_in ? c->in[i] : c->out[i - c->n_in];
        if (!lowp(t)) continue;
        if (!(tmp[i] = fm_tensor_empty(t->ndim, t->shape, FM_F32, dev))) st = fm_last_status();
        else if (i < c->n_in) w.in[i] = tmp[i];
        else w.out[i - c->n_in] = tmp[i];
    }
    if (st == FM_OK) st = inner_scratch(&w, dev);
    for (int i = 0; i < FM_CALL_MAX_IN + FM_CALL_MAX_OUT; i++) fm_tensor_release(tmp[i]);
    return st;
}

static fm_tensor *batch_view(fm_tensor *t, int64_t n) {
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    shape[0] = n;
    return fm_view_raw(t, t->ndim, shape, t->strides, t->offset);
}

static fm_status lowp_kernel(const fm_op_call *c, fm_device dev) {
    int64_t B;
    if (!fm_call_batch_slices(c, &B)) return lowp_call(c, dev);
    /* every slice but the last is the first's size: the first one's scratch is the largest */
    const int64_t step = (B + 7) / 8;
    fm_op_call s = *c;
    fm_status st = FM_OK;
    for (int i = 0; i < c->n_in + c->n_out && st == FM_OK; i++) {
        fm_tensor **slot = i < c->n_in ? &s.in[i] : &s.out[i - c->n_in];
        if (!(*slot = batch_view(*slot, step))) st = fm_last_status();
    }
    if (st == FM_OK) st = lowp_call(&s, dev);
    for (int i = 0; i < c->n_in; i++) if (s.in[i] != c->in[i]) fm_tensor_release(s.in[i]);
    for (int i = 0; i < c->n_out; i++) if (s.out[i] != c->out[i]) fm_tensor_release(s.out[i]);
    return st;
}

static bool g_count = true;
void fm_meta_count_scratch(bool on) { g_count = on; }

fm_status fm_meta_kernel_scratch(const fm_op_call *c, fm_device dev) {
    if (!g_count) return FM_OK;
    bool any = false;
    if ((fm_op_get_info(c->op)->flags & FM_OPF_F32_ONLY) && !c->var_in) {
        for (int i = 0; i < c->n_in; i++) any |= lowp(c->in[i]);
        for (int i = 0; i < c->n_out; i++) any |= lowp(c->out[i]);
    }
    return any ? lowp_kernel(c, dev) : inner_scratch(c, dev);
}
