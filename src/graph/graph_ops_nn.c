/* The graph's op table, part 2: layers (normalizations, embedding, convolution,
 * pooling, batch norm in inference form, bias+GELU; attention is in graph_ops_attn.c). Rules as in graph_ops.c: infer checks like the front end; run calls it. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/conv_geom.h" /* fm_pool_out_len */
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

/* ---- embedding, gather, scatter, scatter_nd, index_select, one_hot ---- */

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

/* scatter (torch.scatter / scatter_reduce, ONNX ScatterElements): in = {t, index, src},
 * attributes axis and reduce (none, add, mul, amax, amin); scatter_nd (ONNX ScatterND):
 * in = {t, indices [..., k], updates}, attribute reduce. Both give t's type. */
static fm_status scatter_attrs(const gctx *c, int ndim, int *ax, fm_scatter_reduce *r) {
    int64_t axis = 0;
    if (ax && (ga_int(c, "axis", 0, &axis) || g_norm_axis(axis, ndim, ax))) return fm_last_status();
    return fm_scatter_reduce_parse(ga_string(c, "reduce", "none"), r);
}

static fm_status scatter_types(const gtype *in) {
    if (in[1].dt != FM_I64 && in[1].dt != FM_I32) return fm_set_error(FM_ERR_INVALID, "index must be i64 or i32, got %s", fm_dtype_name(in[1].dt));
    if (in[2].dt != in[0].dt) return fm_set_error(FM_ERR_INVALID, "src is %s but the input %s", fm_dtype_name(in[2].dt), fm_dtype_name(in[0].dt));
    return in[0].ndim ? FM_OK : fm_set_error(FM_ERR_INVALID, "the input must have at least one dim");
}

static fm_status inf_scatter(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    int ax;
    fm_scatter_reduce r;
    if (scatter_types(in) || scatter_attrs(c, in[0].ndim, &ax, &r)) return fm_last_status();
    bool ok = in[1].ndim == in[0].ndim && in[2].ndim == in[0].ndim;
    for (int d = 0; ok && d < in[0].ndim; d++) ok = (d == ax || in[1].d[d] <= in[0].d[d]) && in[1].d[d] <= in[2].d[d];
    if (!ok) return fm_set_error(FM_ERR_INVALID, "index %s does not fit input %s and src (one rank; index no larger than src, nor than the input off axis %d)",
                                 g_tshape(&in[1], s1, sizeof s1), g_tshape(&in[0], s2, sizeof s2), ax);
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_scatter(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int ax;
    fm_scatter_reduce r;
    if (scatter_attrs(c, in[0]->ndim, &ax, &r)) return fm_last_status();
    RUN_DONE(fm_scatter(in[0], ax, in[1], in[2], r));
}

static fm_status inf_scatter_nd(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96], s3[96];
    fm_scatter_reduce r;
    if (scatter_types(in) || scatter_attrs(c, 0, NULL, &r)) return fm_last_status();
    const int ni = in[1].ndim, nt = in[0].ndim;
    const int64_t k = ni ? in[1].d[ni - 1] : 0;
    bool ok = k >= 1 && k <= nt && in[2].ndim == ni - 1 + nt - k;
    for (int d = 0; ok && d < ni - 1; d++) ok = in[2].d[d] == in[1].d[d];
    for (int d = (int)k; ok && d < nt; d++) ok = in[2].d[ni - 1 + d - k] == in[0].d[d];
    if (!ok) return fm_set_error(FM_ERR_INVALID, "indices %s and updates %s do not fit input %s (indices [..., k], k <= the input's rank; "
                                 "updates indices.shape[:-1] + input.shape[k:])", g_tshape(&in[1], s1, sizeof s1),
                                 g_tshape(&in[2], s2, sizeof s2), g_tshape(&in[0], s3, sizeof s3));
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_scatter_nd(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_scatter_reduce r;
    if (scatter_attrs(c, 0, NULL, &r)) return fm_last_status();
    RUN_DONE(fm_scatter_nd(in[0], in[1], in[2], r));
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

/* topk (torch.topk, ONNX TopK): attributes k, axis (-1), largest (1); out = {values (x's
 * type), indices i64}, x's shape with k along the axis, always sorted. */
static fm_status topk_attrs(const gctx *c, int ndim, int64_t *k, int *ax, bool *largest) {
    int64_t axis = -1, lg = 1;
    if (ga_int(c, "k", -1, k) || ga_int(c, "axis", -1, &axis) || ga_int(c, "largest", 1, &lg) || g_norm_axis(axis, ndim, ax))
        return fm_last_status();
    *largest = lg != 0;
    return FM_OK;
}

static fm_status inf_topk(const gctx *c, const gtype *in, gtype *out) {
    int64_t k;
    int ax;
    bool lg = true;
    if (!in[0].ndim) return fm_set_error(FM_ERR_INVALID, "the input must have at least one dim");
    if (topk_attrs(c, in[0].ndim, &k, &ax, &lg)) return fm_last_status();
    if (k < 0 || k > in[0].d[ax])
        return fm_set_error(FM_ERR_INVALID, "k = %" PRId64 " is outside [0, %" PRId64 "], the size of axis %d", k, in[0].d[ax], ax);
    out[0] = in[0];
    out[0].d[ax] = k;
    out[1] = out[0];
    out[1].dt = FM_I64;
    return FM_OK;
}

static fm_status run_topk(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t k;
    int ax;
    bool lg = true;
    if (topk_attrs(c, in[0]->ndim, &k, &ax, &lg)) return fm_last_status();
    return fm_topk(in[0], k, ax, lg, &out[0], &out[1]);
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

fm_status g_conv_params(const gctx *c, fm_conv2d_params *p) { return conv_params(c, p); }

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

fm_status g_inf_conv2d(const gctx *c, const gtype *in, gtype *out) { return inf_conv2d(c, in, out); }

/* conv_transpose2d (x, w [Cin, Cout/groups, kH, kW], [b]): conv2d's attributes (NCHW) and
 * output_padding (0; 1 or 2 numbers, each below its stride). */
static fm_status convt_params(const gctx *c, fm_conv2d_params *p, int op[2]) {
    if (conv_params(c, p) || pair(c, "output_padding", 0, 0, op)) return fm_last_status();
    return p->layout == FM_NCHW ? FM_OK : fm_set_error(FM_ERR_INVALID, "conv_transpose2d takes NCHW only");
}

static fm_status inf_conv_transpose2d(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    fm_conv2d_params p;
    int op[2];
    if (convt_params(c, &p, op) || need_float(&in[0], "input")) return fm_last_status();
    const gtype *x = &in[0], *w = &in[1];
    if (x->ndim != 4 || w->ndim != 4 || x->dt != w->dt)
        return fm_set_error(FM_ERR_INVALID, "input %s and weight %s must be 4-D of one dtype", g_tshape(x, s1, sizeof s1), g_tshape(w, s2, sizeof s2));
    const int64_t O = w->d[1] * p.groups;
    if (opt_vec(&in[2], x, "bias", 1, &O)) return fm_last_status();
    out[0] = (gtype){x->dt, 4, {0}};
    return fm_conv_transpose2d_shape(x->d, w->d, in[2].ndim < 0 ? -1 : O, &p, op, out[0].d);
}

static fm_status run_conv_transpose2d(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_conv2d_params p;
    int op[2];
    if (convt_params(c, &p, op)) return fm_last_status();
    RUN_DONE(fm_conv_transpose2d(in[0], in[1], in[2], &p, op));
}

static fm_status run_conv2d(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_conv2d_params p;
    if (conv_params(c, &p)) return fm_last_status();
    RUN_DONE(fm_conv2d(in[0], in[1], in[2], &p));
}

/* ew_chain (fuse-elementwise): "ops" the step codes (fm_ew_step_op), "args" two floats
 * per step (a, b). */
static fm_status chain_steps(const gctx *c, fm_ew_step *st, int *n) {
    int64_t ops[FM_EW_CHAIN_MAX];
    if (ga_ints(c, "ops", ops, n, FM_EW_CHAIN_MAX)) return fm_last_status();
    const gattr *a = g_node_attr(c->n, "args");
    if (*n < 1 || !a || a->type != FM_ATTR_FLOATS || a->n != 2 * *n)
        return fm_set_error(FM_ERR_INVALID, "attributes 'ops' (1 to %d step codes) and 'args' (two floats a step) are required", FM_EW_CHAIN_MAX);
    for (int i = 0; i < *n; i++) {
        if (ops[i] < 0 || ops[i] >= FM_EW_OP_COUNT) return fm_set_error(FM_ERR_INVALID, "step %d: unknown step code %lld", i, (long long)ops[i]);
        st[i] = (fm_ew_step){(fm_ew_step_op)ops[i], (float)a->floats[2 * i], (float)a->floats[2 * i + 1]};
    }
    return FM_OK;
}

static fm_status inf_ew_chain(const gctx *c, const gtype *in, gtype *out) {
    fm_ew_step st[FM_EW_CHAIN_MAX];
    int n;
    if (chain_steps(c, st, &n)) return fm_last_status();
    if (in[0].dt != FM_F32) return fm_set_error(FM_ERR_INVALID, "input must be f32, got %s", fm_dtype_name(in[0].dt));
    out[0] = in[0];
    return FM_OK;
}

/* One step as the op it stands for (devices without the chain kernel). */
static fm_tensor *chain_step_op(fm_tensor *v, fm_tensor *x, const fm_ew_step *s) {
    switch (s->op) {
    case FM_EW_ADD: return fm_add_scalar(v, s->a);
    case FM_EW_MUL: return fm_mul_scalar(v, s->a);
    case FM_EW_SUB: return fm_add_scalar(v, -(double)s->a); /* v - a == v + (-a) exactly */
    case FM_EW_RSUB: {
        fm_tensor *n = fm_neg(v), *y = n ? fm_add_scalar(n, s->a) : NULL;
        fm_tensor_release(n);
        return y;
    }
    case FM_EW_DIV: case FM_EW_RDIV: {
        fm_tensor *k = fm_tensor_full(0, NULL, s->a, FM_F32, fm_tensor_device(v)), *y = NULL;
        if (k) y = s->op == FM_EW_DIV ? fm_div(v, k) : fm_div(k, v);
        fm_tensor_release(k);
        return y;
    }
    case FM_EW_CLAMP: return fm_clamp(v, s->a, s->b);
    case FM_EW_RELU: return fm_relu(v);
    case FM_EW_SIGMOID: return fm_sigmoid(v);
    case FM_EW_TANH: return fm_tanh(v);
    case FM_EW_MUL_X: return fm_mul(v, x);
    case FM_EW_ADD_X: return fm_add(v, x);
    case FM_EW_ROUND: return fm_round(v);
    default: fm_set_error(FM_ERR_INVALID, "ew_chain: unknown step"); return NULL;
    }
}

/* The chain kernel where the device has it (CPU, check); elsewhere one op a step. */
static fm_status run_ew_chain(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_ew_step st[FM_EW_CHAIN_MAX];
    int n;
    if (chain_steps(c, st, &n)) return fm_last_status();
    fm_device_type dev = fm_tensor_device(in[0]).type;
    if (g_cpu_kernels(dev)) RUN_DONE(fm_ew_chain(in[0], n, st));
    fm_tensor *v = fm_tensor_retain(in[0]);
    for (int i = 0; v && i < n; i++) {
        fm_tensor *t = chain_step_op(v, in[0], &st[i]);
        fm_tensor_release(v);
        v = t;
    }
    RUN_DONE(v);
}

/* conv2d_fused (fuse-conv-act): conv2d's attributes, relu (0/1), max (the cap after
 * it, ReLU6's 6; none when absent) and pool (0/1: none; k: a k x k max pool at stride
 * k, no padding) */
static fm_status fused_params(const gctx *c, int64_t *relu, int64_t *pool) {
    if (ga_int(c, "relu", 0, relu) || ga_int(c, "pool", 0, pool)) return fm_last_status();
    if ((*relu != 0 && *relu != 1) || *pool < 0 || *pool > 64)
        return fm_set_error(FM_ERR_INVALID, "attribute 'relu' must be 0 or 1 and 'pool' in [0, 64], got %lld and %lld", (long long)*relu, (long long)*pool);
    return FM_OK;
}

static fm_status inf_conv2d_fused(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    int64_t relu, pool;
    fm_conv2d_params p;
    if (fused_params(c, &relu, &pool) || conv_params(c, &p) || inf_conv2d(c, in, out)) return fm_last_status();
    if (in[0].dt != FM_F32 && in[0].dt != FM_F64) return fm_set_error(FM_ERR_INVALID, "input must be f32 or f64, got %s", fm_dtype_name(in[0].dt));
    for (int i = 0, ax = p.layout == FM_NHWC ? 1 : 2; pool > 1 && i < 2; i++) {
        if (out[0].d[ax + i] < pool)
            return fm_set_error(FM_ERR_INVALID, "pool %lld is larger than the conv output %s", (long long)pool, g_tshape(&out[0], s1, sizeof s1));
        out[0].d[ax + i] /= pool;
    }
    return FM_OK;
}

/* The fused kernel where the device has it (CPU, check); elsewhere the three ops. */
static fm_status run_conv2d_fused(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_conv2d_params p;
    int64_t relu, pool;
    double hi;
    if (conv_params(c, &p) || fused_params(c, &relu, &pool) || ga_float(c, "max", INFINITY, &hi)) return fm_last_status();
    fm_device_type dev = fm_tensor_device(in[0]).type;
    if (g_cpu_kernels(dev)) { /* with the weights packed at load (g_prepare), when they are */
        ptrdiff_t i = c->n - c->g->nodes;
        fm_tensor *packed = c->g->prep && i >= 0 && i < c->g->n_prep ? c->g->prep[i] : NULL;
        RUN_DONE(fm_conv2d_fused_capped(in[0], in[1], in[2], packed, &p, relu != 0, hi, (int)pool));
    }
    fm_tensor *y = fm_conv2d(in[0], in[1], in[2], &p), *t = NULL;
    if (y && relu) t = fm_relu(y), fm_tensor_release(y), y = t;
    if (y && hi < INFINITY) t = fm_clamp(y, -INFINITY, hi), fm_tensor_release(y), y = t;
    if (y && pool > 1) {
        fm_pool2d_params q = {.kernel = {(int)pool, (int)pool}, .stride = {(int)pool, (int)pool}, .layout = p.layout};
        t = fm_max_pool2d(y, &q), fm_tensor_release(y), y = t;
    }
    RUN_DONE(y);
}

static fm_status pool_params(const gctx *c, fm_pool2d_params *p) {
    memset(p, 0, sizeof *p);
    int64_t cip = 0, ceil_mode = 0;
    if (pair(c, "kernel", 0, 1, p->kernel) || pair(c, "stride", 0, 1, p->stride) || pair(c, "padding", 0, 0, p->padding) ||
        ga_int(c, "count_include_pad", 1, &cip) || ga_int(c, "ceil_mode", 0, &ceil_mode) || layout_of(c, &p->layout))
        return fm_last_status();
    p->ceil_mode = ceil_mode != 0;
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
        out[0].d[ax] = fm_pool_out_len(in[0].d[ax], p.kernel[i], p.stride[i], p.padding[i], p.ceil_mode);
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
    {"scatter", 3, 3, 1, "axis,reduce", inf_scatter, run_scatter, NULL},
    {"scatter_nd", 3, 3, 1, "reduce", inf_scatter_nd, run_scatter_nd, NULL},
    {"one_hot", 1, 1, 1, "num_classes", inf_one_hot, run_one_hot, NULL},
    {"topk", 1, 1, 2, "k,axis,largest", inf_topk, run_topk, NULL},
    {"conv2d", 2, 3, 1, "stride,padding,dilation,groups,layout", inf_conv2d, run_conv2d, NULL},
    {"conv_transpose2d", 2, 3, 1, "stride,padding,dilation,groups,layout,output_padding", inf_conv_transpose2d, run_conv_transpose2d, NULL},
    {"conv2d_fused", 2, 3, 1, "stride,padding,dilation,groups,layout,relu,pool,max", inf_conv2d_fused, run_conv2d_fused, NULL},
    {"max_pool2d", 1, 1, 1, "kernel,stride,padding,layout,ceil_mode", inf_pool, run_pool, NULL},
    {"avg_pool2d", 1, 1, 1, "kernel,stride,padding,count_include_pad,layout,ceil_mode", inf_pool, run_pool, NULL},
    {"batch_norm", 5, 5, 1, "eps,layout", inf_batch_norm, run_batch_norm, NULL},
    {"bias_gelu_tanh", 2, 2, 1, "", inf_bias_gelu, run_bias_gelu, NULL},
    {"ew_chain", 1, 1, 1, "ops,args", inf_ew_chain, run_ew_chain, NULL},
};
const int g_n_ops_nn = (int)(sizeof g_ops_nn / sizeof g_ops_nn[0]);
