/* The graph's op table, part 2: layers (normalizations, embedding, convolution,
 * pooling, batch norm in inference form, attention and the fused transformer
 * helpers). Rules as in graph_ops.c: infer checks like the front end; run calls it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/ops.h"
#include "graph/graph_internal.h"

static fm_status need_float(const gtype *t, const char *what) {
    if (!fm_dtype_is_float(t->dt)) return fm_set_error(FM_ERR_INVALID, "%s must be floating-point, got %s", what, fm_dtype_name(t->dt));
    return FM_OK;
}

/* An optional input: absent, or of x's dtype and exactly `ndim` dims [d0, d1...]. */
static fm_status opt_vec(const gtype *t, const gtype *x, const char *what, int ndim, const int64_t *dims) {
    char s1[96], s2[96];
    if (t->ndim < 0) return FM_OK;
    if (t->dt != x->dt) return fm_set_error(FM_ERR_INVALID, "%s is %s but the input is %s", what, fm_dtype_name(t->dt), fm_dtype_name(x->dt));
    gtype want = {x->dt, ndim, {0}};
    memcpy(want.d, dims, (size_t)ndim * sizeof(int64_t));
    if (t->ndim != ndim || memcmp(t->d, dims, (size_t)ndim * sizeof(int64_t)))
        return fm_set_error(FM_ERR_INVALID, "%s has shape %s, expected %s", what, g_tshape(t, s1, sizeof s1), g_tshape(&want, s2, sizeof s2));
    return FM_OK;
}

#define RUN_DONE(expr) do { out[0] = (expr); return out[0] ? FM_OK : fm_last_status(); } while (0)

/* ---- norms ---- */

static fm_status inf_layer_norm(const gctx *c, const gtype *in, gtype *out) {
    int64_t nd = 0;
    double eps = 0;
    if (ga_int(c, "n_norm_dims", 1, &nd) || ga_float(c, "eps", 1e-5, &eps) || need_float(&in[0], "input")) return fm_last_status();
    if (nd < 1 || nd > in[0].ndim) return fm_set_error(FM_ERR_INVALID, "n_norm_dims %lld must be in [1, %d]", (long long)nd, in[0].ndim);
    if (!(eps >= 0)) return fm_set_error(FM_ERR_INVALID, "eps must be >= 0");
    const int64_t *last = in[0].d + in[0].ndim - nd;
    if (opt_vec(&in[1], &in[0], "weight", (int)nd, last) || opt_vec(&in[2], &in[0], "bias", (int)nd, last)) return fm_last_status();
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_layer_norm(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t nd = 0;
    double eps = 0;
    if (ga_int(c, "n_norm_dims", 1, &nd) || ga_float(c, "eps", 1e-5, &eps)) return fm_last_status();
    RUN_DONE(fm_layer_norm(in[0], (int)nd, in[1], in[2], eps));
}

static fm_status inf_rms_norm(const gctx *c, const gtype *in, gtype *out) {
    double eps = 0;
    if (ga_float(c, "eps", 1e-5, &eps) || need_float(&in[0], "input")) return fm_last_status();
    if (in[0].ndim < 1) return fm_set_error(FM_ERR_INVALID, "input needs at least 1 dim");
    if (opt_vec(&in[1], &in[0], "weight", 1, &in[0].d[in[0].ndim - 1])) return fm_last_status();
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_rms_norm(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    double eps = 0;
    if (ga_float(c, "eps", 1e-5, &eps)) return fm_last_status();
    RUN_DONE(fm_rms_norm(in[0], in[1], eps));
}

static fm_status inf_add_layer_norm(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    if (in[0].ndim != in[1].ndim || memcmp(in[0].d, in[1].d, (size_t)in[0].ndim * sizeof(int64_t)) || in[0].dt != in[1].dt)
        return fm_set_error(FM_ERR_INVALID, "x %s and h %s must have one shape and dtype", g_tshape(&in[0], s1, sizeof s1), g_tshape(&in[1], s2, sizeof s2));
    gtype ln_in[3] = {in[0], in[2], in[3]};
    int64_t nd = 1;
    if (ga_int(c, "n_norm_dims", 1, &nd) || nd != 1) return fm_set_error(FM_ERR_INVALID, "normalizes over the last dim only (n_norm_dims 1)");
    if (inf_layer_norm(c, ln_in, &out[1])) return fm_last_status();
    out[0] = in[0]; /* outputs: {sum = x + h, y = layer_norm(sum)}, as the front end */
    return FM_OK;
}

static fm_status run_add_layer_norm(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    double eps = 0;
    if (ga_float(c, "eps", 1e-5, &eps)) return fm_last_status();
    return fm_add_layer_norm(in[0], in[1], in[2], in[3], eps, &out[0], &out[1]);
}

/* ---- embedding, gather, index_select, one_hot ---- */

static fm_status inf_embedding(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    char s1[96];
    if (in[0].ndim != 2) return fm_set_error(FM_ERR_INVALID, "weight must be 2-D [V, D], got %s", g_tshape(&in[0], s1, sizeof s1));
    if (in[1].dt != FM_I64 && in[1].dt != FM_I32) return fm_set_error(FM_ERR_INVALID, "indices must be i64 or i32, got %s", fm_dtype_name(in[1].dt));
    if (in[1].ndim + 1 > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "indices have too many dims");
    out[0] = in[1];
    out[0].dt = in[0].dt;
    out[0].d[out[0].ndim++] = in[0].d[1];
    return FM_OK;
}

static fm_status run_embedding(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    (void)c;
    RUN_DONE(fm_embedding(in[0], in[1]));
}

static fm_status inf_index_select(const gctx *c, const gtype *in, gtype *out) {
    int64_t axis = 0;
    int ax = 0;
    if (ga_int(c, "axis", 0, &axis) || g_norm_axis(axis, in[0].ndim, &ax)) return fm_last_status();
    if (in[0].ndim < 1) return fm_set_error(FM_ERR_INVALID, "input needs at least 1 dim");
    if (in[1].ndim != 1 || (in[1].dt != FM_I64 && in[1].dt != FM_I32))
        return fm_set_error(FM_ERR_INVALID, "index must be a 1-D i64 or i32 tensor");
    out[0] = in[0];
    out[0].d[ax] = in[1].d[0];
    return FM_OK;
}

static fm_status run_index_select(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t axis = 0;
    if (ga_int(c, "axis", 0, &axis)) return fm_last_status();
    RUN_DONE(fm_index_select(in[0], (int)axis, in[1]));
}

static fm_status inf_gather(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    int64_t axis = 0;
    int ax = 0;
    if (ga_int(c, "axis", 0, &axis) || g_norm_axis(axis, in[0].ndim, &ax)) return fm_last_status();
    if (in[1].dt != FM_I64 && in[1].dt != FM_I32) return fm_set_error(FM_ERR_INVALID, "index must be i64 or i32");
    if (in[1].ndim != in[0].ndim) return fm_set_error(FM_ERR_INVALID, "index %s and input %s need the same number of dims",
                                                      g_tshape(&in[1], s1, sizeof s1), g_tshape(&in[0], s2, sizeof s2));
    for (int d = 0; d < in[0].ndim; d++)
        if (d != ax && in[1].d[d] > in[0].d[d]) return fm_set_error(FM_ERR_INVALID, "index %s exceeds input %s outside the axis",
                                                                    g_tshape(&in[1], s1, sizeof s1), g_tshape(&in[0], s2, sizeof s2));
    out[0] = in[1];
    out[0].dt = in[0].dt;
    return FM_OK;
}

static fm_status run_gather(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t axis = 0;
    if (ga_int(c, "axis", 0, &axis)) return fm_last_status();
    RUN_DONE(fm_gather(in[0], (int)axis, in[1]));
}

static fm_status inf_one_hot(const gctx *c, const gtype *in, gtype *out) {
    int64_t nc = 0;
    if (ga_int(c, "num_classes", -1, &nc)) return fm_last_status();
    if (nc < 1 || nc > (1 << 24)) return fm_set_error(FM_ERR_INVALID, "num_classes must be in [1, 2^24]");
    if (in[0].dt != FM_I64 && in[0].dt != FM_I32) return fm_set_error(FM_ERR_INVALID, "index must be i64 or i32");
    if (in[0].ndim + 1 > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "index has too many dims");
    out[0] = in[0];
    out[0].dt = FM_F32;
    out[0].d[out[0].ndim++] = nc;
    return FM_OK;
}

static fm_status run_one_hot(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t nc = 0;
    if (ga_int(c, "num_classes", -1, &nc)) return fm_last_status();
    RUN_DONE(fm_one_hot(in[0], nc));
}

/* ---- convolution, pooling, batch norm ---- */

static fm_status layout_of(const gctx *c, fm_layout *l) {
    const char *s = ga_string(c, "layout", "NCHW");
    if (s && !strcmp(s, "NCHW")) { *l = FM_NCHW; return FM_OK; }
    if (s && !strcmp(s, "NHWC")) { *l = FM_NHWC; return FM_OK; }
    return fm_set_error(FM_ERR_INVALID, "attribute 'layout' must be \"NCHW\" or \"NHWC\"");
}

/* A pair attribute: absent gives def, one number is used for both. */
static fm_status pair(const gctx *c, const char *name, int def, int lo, int out[2]) {
    int64_t v[2];
    int n = 0;
    if (ga_ints(c, name, v, &n, 2)) return fm_last_status();
    if (n < 0) { out[0] = out[1] = def; return FM_OK; }
    if (n == 1) v[1] = v[0];
    if (n == 0 || v[0] < lo || v[1] < lo || v[0] > 65536 || v[1] > 65536)
        return fm_set_error(FM_ERR_INVALID, "attribute '%s' must be 1 or 2 numbers in [%d, 65536]", name, lo);
    out[0] = (int)v[0];
    out[1] = (int)v[1];
    return FM_OK;
}

static fm_status conv_params(const gctx *c, fm_conv2d_params *p) {
    *p = fm_conv2d_default_params();
    int64_t groups = 0;
    if (pair(c, "stride", 1, 1, p->stride) || pair(c, "padding", 0, 0, p->padding) || pair(c, "dilation", 1, 1, p->dilation) ||
        ga_int(c, "groups", 1, &groups) || layout_of(c, &p->layout))
        return fm_last_status();
    if (groups < 1 || groups > 65536) return fm_set_error(FM_ERR_INVALID, "attribute 'groups' must be >= 1");
    p->groups = (int)groups;
    return FM_OK;
}

static fm_status inf_conv2d(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    fm_conv2d_params p;
    if (conv_params(c, &p) || need_float(&in[0], "input")) return fm_last_status();
    const gtype *x = &in[0], *w = &in[1];
    if (x->ndim != 4 || w->ndim != 4 || x->dt != w->dt)
        return fm_set_error(FM_ERR_INVALID, "input %s and weight %s must be 4-D of one dtype", g_tshape(x, s1, sizeof s1), g_tshape(w, s2, sizeof s2));
    bool nhwc = p.layout == FM_NHWC;
    int64_t N = x->d[0], C = nhwc ? x->d[3] : x->d[1], H = nhwc ? x->d[1] : x->d[2], W = nhwc ? x->d[2] : x->d[3], O = w->d[0];
    if (C % p.groups || O % p.groups || w->d[1] * p.groups != C)
        return fm_set_error(FM_ERR_INVALID, "weight %s does not fit input %s with groups %d", g_tshape(w, s1, sizeof s1), g_tshape(x, s2, sizeof s2), p.groups);
    if (opt_vec(&in[2], x, "bias", 1, &O)) return fm_last_status();
    int64_t o[2], hw[2] = {H, W};
    for (int i = 0; i < 2; i++) {
        int64_t span = (int64_t)p.dilation[i] * (w->d[2 + i] - 1) + 1;
        o[i] = (hw[i] + 2 * (int64_t)p.padding[i] - span) / p.stride[i] + 1;
        if (hw[i] + 2 * (int64_t)p.padding[i] < span || o[i] < 1)
            return fm_set_error(FM_ERR_INVALID, "kernel %s is larger than the padded input %s", g_tshape(w, s1, sizeof s1), g_tshape(x, s2, sizeof s2));
    }
    out[0] = (gtype){x->dt, 4, {N, nhwc ? o[0] : O, nhwc ? o[1] : o[0], nhwc ? O : o[1]}};
    return FM_OK;
}

static fm_status run_conv2d(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_conv2d_params p;
    if (conv_params(c, &p)) return fm_last_status();
    RUN_DONE(fm_conv2d(in[0], in[1], in[2], &p));
}

static fm_status pool_params(const gctx *c, fm_pool2d_params *p) {
    memset(p, 0, sizeof *p);
    int64_t cip = 0;
    if (pair(c, "kernel", 0, 1, p->kernel) || pair(c, "stride", 0, 1, p->stride) || pair(c, "padding", 0, 0, p->padding) ||
        ga_int(c, "count_include_pad", 1, &cip) || layout_of(c, &p->layout))
        return fm_last_status();
    if (!p->kernel[0]) return fm_set_error(FM_ERR_INVALID, "attribute 'kernel' is required");
    if (!p->stride[0]) { p->stride[0] = p->kernel[0]; p->stride[1] = p->kernel[1]; }
    p->count_include_pad = cip != 0;
    return FM_OK;
}

static fm_status inf_pool(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    fm_pool2d_params p;
    if (pool_params(c, &p) || need_float(&in[0], "input")) return fm_last_status();
    if (in[0].ndim != 4) return fm_set_error(FM_ERR_INVALID, "input must be 4-D, got %s", g_tshape(&in[0], s1, sizeof s1));
    bool nhwc = p.layout == FM_NHWC;
    out[0] = in[0];
    for (int i = 0; i < 2; i++) {
        int ax = (nhwc ? 1 : 2) + i;
        int64_t padded = in[0].d[ax] + 2 * (int64_t)p.padding[i];
        if (2 * p.padding[i] > p.kernel[i]) return fm_set_error(FM_ERR_INVALID, "padding must be at most half the kernel");
        if (padded < p.kernel[i]) return fm_set_error(FM_ERR_INVALID, "kernel is larger than the padded input %s", g_tshape(&in[0], s1, sizeof s1));
        out[0].d[ax] = (padded - p.kernel[i]) / p.stride[i] + 1;
    }
    return FM_OK;
}

static fm_status run_pool(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_pool2d_params p;
    if (pool_params(c, &p)) return fm_last_status();
    RUN_DONE((!strcmp(c->n->op, "max_pool2d") ? fm_max_pool2d : fm_avg_pool2d)(in[0], &p));
}

static fm_status inf_batch_norm(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    fm_layout l = FM_NCHW;
    double eps = 0;
    if (layout_of(c, &l) || ga_float(c, "eps", 1e-5, &eps) || need_float(&in[0], "input")) return fm_last_status();
    if (in[0].ndim < 2) return fm_set_error(FM_ERR_INVALID, "input must have at least 2 dims, got %s", g_tshape(&in[0], s1, sizeof s1));
    if (in[3].ndim < 0 || in[4].ndim < 0) return fm_set_error(FM_ERR_INVALID, "inference needs running_mean and running_var (inputs 3 and 4)");
    int64_t C = l == FM_NHWC ? in[0].d[in[0].ndim - 1] : in[0].d[1];
    for (int i = 1; i < 5; i++)
        if (opt_vec(&in[i], &in[0], (const char *[]){"", "weight", "bias", "running_mean", "running_var"}[i], 1, &C)) return fm_last_status();
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_batch_norm(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_layout l = FM_NCHW;
    double eps = 0;
    if (layout_of(c, &l) || ga_float(c, "eps", 1e-5, &eps)) return fm_last_status();
    RUN_DONE(fm_batch_norm(in[0], in[1], in[2], in[3], in[4], false, 0.1, eps, l));
}

/* ---- attention and the fused transformer helpers ---- */

static fm_status sdpa_flags(const gctx *c, bool *causal, double *scale) {
    int64_t cz = 0;
    if (ga_int(c, "causal", 0, &cz) || ga_float(c, "scale", 0, scale)) return fm_last_status();
    *causal = cz != 0;
    return FM_OK;
}

static fm_status inf_sdpa(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale) || need_float(&in[0], "q")) return fm_last_status();
    const gtype *q = &in[0], *k = &in[1], *v = &in[2];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || q->dt != k->dt || q->dt != v->dt)
        return fm_set_error(FM_ERR_INVALID, "q, k, v must be 4-D [B, H, T, D] of one dtype");
    if (memcmp(k->d, v->d, 4 * sizeof(int64_t)) || q->d[0] != k->d[0] || q->d[3] != k->d[3] || k->d[1] <= 0 || q->d[1] % k->d[1] ||
        k->d[2] <= 0 || q->d[3] <= 0)
        return fm_set_error(FM_ERR_INVALID, "q %s does not fit k/v %s (batch, head dim, kv heads dividing heads)", g_tshape(q, s1, sizeof s1),
                            g_tshape(k, s2, sizeof s2));
    out[0] = *q;
    return FM_OK;
}

static fm_status run_sdpa(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale)) return fm_last_status();
    RUN_DONE(fm_scaled_dot_product_attention(in[0], in[1], in[2], causal, scale));
}

/* causal_attention: q [B, H, T, D] against k, v [B, KV, L, D] with L >= T, the
 * queries being the last T positions (a KV cache's layout): query i sees keys
 * j <= L - T + i. One graph serves a prompt (L == T) and each decode step. */
static fm_status inf_causal_attention(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    if (inf_sdpa(c, in, out)) return fm_last_status();
    if (in[1].d[2] < in[0].d[2])
        return fm_set_error(FM_ERR_INVALID, "keys %s are fewer than the queries (%lld)", g_tshape(&in[1], s1, sizeof s1), (long long)in[0].d[2]);
    return FM_OK;
}

/* The general case (L > T > 1): scores with an additive mask, softmax, values;
 * kv heads repeated for grouped-query attention. */
static fm_tensor *masked_attention(fm_tensor *q, fm_tensor *k, fm_tensor *v, double scale) {
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], KV = k->shape[1], L = k->shape[2];
    fm_tensor *ke = NULL, *ve = NULL, *kt = NULL, *s = NULL, *mask = NULL, *sm = NULL, *p = NULL, *y = NULL;
    fm_tensor *src[2] = {k, v}, **dst[2] = {&ke, &ve};
    for (int i = 0; i < 2; i++) {
        fm_tensor *u = fm_unsqueeze(src[i], 2), *e = u ? fm_expand(u, 5, (int64_t[]){B, KV, H / KV, L, D}) : NULL;
        *dst[i] = e ? fm_reshape(e, 4, (int64_t[]){B, H, L, D}) : NULL;
        fm_tensor_release_n(2, u, e);
    }
    float *m = malloc(sizeof(float) * (size_t)(T * L));
    if (m) {
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < L; j++) m[i * L + j] = j <= L - T + i ? 0.0f : -INFINITY;
        fm_tensor *h = fm_tensor_from_data(m, 2, (int64_t[]){T, L}, FM_F32);
        mask = h ? fm_tensor_to(h, fm_tensor_device(q)) : NULL;
        fm_tensor_release(h);
        free(m);
    }
    fm_tensor *mc = mask && mask->dtype != q->dtype ? fm_to_dtype(mask, q->dtype) : fm_tensor_retain(mask);
    if (ke && ve && mc && (kt = fm_transpose(ke, 2, 3)) && (s = fm_matmul(q, kt)) &&
        (sm = fm_mul_scalar(s, scale > 0 ? scale : 1.0 / sqrt((double)D)))) {
        fm_tensor_release(s);
        s = fm_add(sm, mc);
        p = s ? fm_softmax(s, 3) : NULL;
        y = p ? fm_matmul(p, ve) : NULL;
    }
    fm_tensor_release_n(8, ke, ve, kt, s, mask, mc, sm, p);
    return y;
}

static fm_status run_causal_attention(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale)) return fm_last_status();
    int64_t T = in[0]->shape[2], L = in[1]->shape[2];
    if (T == L || T == 1) RUN_DONE(fm_scaled_dot_product_attention(in[0], in[1], in[2], T == L && T > 1, scale));
    RUN_DONE(masked_attention(in[0], in[1], in[2], scale));
}

static fm_status qkv_heads(const gctx *c, const gtype *x, int64_t *H, int64_t *KV, int64_t *D) {
    char s1[96];
    if (ga_int(c, "n_head", 0, H) || ga_int(c, "n_kv_head", *H, KV) || need_float(x, "qkv")) return fm_last_status();
    if (x->ndim != 3 || *H < 1 || *KV < 1 || *H % *KV || x->d[2] % (*H + 2 * *KV) || x->d[2] == 0 || x->d[1] < 1)
        return fm_set_error(FM_ERR_INVALID, "qkv %s must be [B, T, (n_head + 2 n_kv_head) D] with n_kv_head dividing n_head",
                            g_tshape(x, s1, sizeof s1));
    *D = x->d[2] / (*H + 2 * *KV);
    return FM_OK;
}

static fm_status inf_sdpa_qkv(const gctx *c, const gtype *in, gtype *out) {
    int64_t H = 0, KV = 0, D = 0;
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale) || qkv_heads(c, &in[0], &H, &KV, &D)) return fm_last_status();
    out[0] = (gtype){in[0].dt, 3, {in[0].d[0], in[0].d[1], H * D}};
    return FM_OK;
}

static fm_status run_sdpa_qkv(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t H = 0, KV = 0;
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale) || ga_int(c, "n_head", 0, &H) || ga_int(c, "n_kv_head", H, &KV)) return fm_last_status();
    RUN_DONE(fm_sdpa_qkv(in[0], (int)H, (int)KV, causal, scale));
}

static fm_status inf_qkv_split(const gctx *c, const gtype *in, gtype *out) {
    int64_t H = 0, KV = 0, D = 0;
    if (qkv_heads(c, &in[0], &H, &KV, &D)) return fm_last_status();
    int64_t B = in[0].d[0], T = in[0].d[1];
    out[0] = (gtype){in[0].dt, 4, {B, H, T, D}};
    out[1] = out[2] = (gtype){in[0].dt, 4, {B, KV, T, D}};
    return FM_OK;
}

static fm_status run_qkv_split(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t H = 0, KV = 0;
    if (ga_int(c, "n_head", 0, &H) || ga_int(c, "n_kv_head", H, &KV)) return fm_last_status();
    return fm_qkv_split_heads(in[0], (int)H, (int)KV, &out[0], &out[1], &out[2]);
}

static fm_status inf_bias_gelu(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    if (need_float(&in[0], "input") || in[0].ndim < 1) return fm_set_error(FM_ERR_INVALID, "input must be floating-point with >= 1 dim");
    if (in[1].ndim < 0) return fm_set_error(FM_ERR_INVALID, "bias is required");
    if (opt_vec(&in[1], &in[0], "bias", 1, &in[0].d[in[0].ndim - 1])) return fm_last_status();
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_bias_gelu(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    (void)c;
    RUN_DONE(fm_bias_gelu_tanh(in[0], in[1]));
}

const g_op_spec g_ops_nn[] = {
    {"layer_norm", 1, 3, 1, "n_norm_dims,eps", inf_layer_norm, run_layer_norm, NULL},
    {"rms_norm", 1, 2, 1, "eps", inf_rms_norm, run_rms_norm, NULL},
    {"add_layer_norm", 4, 4, 2, "n_norm_dims,eps", inf_add_layer_norm, run_add_layer_norm, NULL},
    {"embedding", 2, 2, 1, "", inf_embedding, run_embedding, NULL},
    {"index_select", 2, 2, 1, "axis", inf_index_select, run_index_select, NULL},
    {"gather", 2, 2, 1, "axis", inf_gather, run_gather, NULL},
    {"one_hot", 1, 1, 1, "num_classes", inf_one_hot, run_one_hot, NULL},
    {"conv2d", 2, 3, 1, "stride,padding,dilation,groups,layout", inf_conv2d, run_conv2d, NULL},
    {"max_pool2d", 1, 1, 1, "kernel,stride,padding,layout", inf_pool, run_pool, NULL},
    {"avg_pool2d", 1, 1, 1, "kernel,stride,padding,count_include_pad,layout", inf_pool, run_pool, NULL},
    {"batch_norm", 5, 5, 1, "eps,layout", inf_batch_norm, run_batch_norm, NULL},
    {"scaled_dot_product_attention", 3, 3, 1, "causal,scale", inf_sdpa, run_sdpa, NULL},
    {"causal_attention", 3, 3, 1, "scale", inf_causal_attention, run_causal_attention, NULL},
    {"sdpa_qkv", 1, 1, 1, "n_head,n_kv_head,causal,scale", inf_sdpa_qkv, run_sdpa_qkv, NULL},
    {"qkv_split_heads", 1, 1, 3, "n_head,n_kv_head", inf_qkv_split, run_qkv_split, NULL},
    {"bias_gelu_tanh", 2, 2, 1, "", inf_bias_gelu, run_bias_gelu, NULL},
};
const int g_n_ops_nn = (int)(sizeof g_ops_nn / sizeof g_ops_nn[0]);
