/* The graph's op table, part 3: graph-only ops that move or reinterpret data
 * (reshape, permute, transpose, slice, squeeze, unsqueeze, flatten, expand, cat,
 * cast, contiguous, pad). Sizes in their attributes may be dim expressions over the
 * dynamic dims ("batch*seq"), evaluated with the run's sizes. */
#include <string.h>

#include "fathom/ops.h"
#include "graph/graph_internal.h"

#define RUN_DONE(expr) do { out[0] = (expr); return out[0] ? FM_OK : fm_last_status(); } while (0)

static int64_t numel(const gtype *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->d[d];
    return n;
}

/* reshape: "shape" with 0 = the input's size at that position, -1 = inferred (once). */
static fm_status reshape_target(const gctx *c, const gtype *x, gtype *o) {
    char s1[96], s2[96];
    int64_t sh[FM_MAX_DIMS];
    int n, infer = -1;
    if (ga_ints(c, "shape", sh, &n, FM_MAX_DIMS)) return fm_last_status();
    if (n < 0) return fm_set_error(FM_ERR_INVALID, "attribute 'shape' is required");
    int64_t known = 1;
    o->ndim = n;
    for (int d = 0; d < n; d++) {
        if (sh[d] == 0 && d < x->ndim) sh[d] = x->d[d];
        if (sh[d] == -1 && infer < 0) { infer = d; continue; }
        if (sh[d] < 0 || sh[d] > (INT64_C(1) << 40))
            return fm_set_error(FM_ERR_INVALID, "attribute 'shape' has size %lld at %d (sizes >= 0, one -1, 0 copies the input's)", (long long)sh[d], d);
        known *= sh[d];
        if (known > (INT64_C(1) << 50)) return fm_set_error(FM_ERR_INVALID, "attribute 'shape' is too large");
    }
    int64_t total = numel(x);
    if (infer >= 0) {
        if (known == 0 || total % known) return fm_set_error(FM_ERR_INVALID, "cannot infer the -1 in the target shape for input %s", g_tshape(x, s1, sizeof s1));
        sh[infer] = total / known;
        known = total;
    }
    memcpy(o->d, sh, (size_t)n * sizeof(int64_t));
    o->dt = x->dt;
    if (known != total) return fm_set_error(FM_ERR_INVALID, "cannot reshape %s into %s (element counts differ)", g_tshape(x, s1, sizeof s1), g_tshape(o, s2, sizeof s2));
    return FM_OK;
}

static fm_status inf_reshape(const gctx *c, const gtype *in, gtype *out) { return reshape_target(c, &in[0], &out[0]); }

static fm_status run_reshape(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    gtype x = {in[0]->dtype, in[0]->ndim, {0}}, o;
    memcpy(x.d, in[0]->shape, sizeof x.d);
    if (reshape_target(c, &x, &o)) return fm_last_status();
    RUN_DONE(fm_reshape(in[0], o.ndim, o.d));
}

static fm_status get_perm(const gctx *c, int ndim, int *perm) {
    int64_t p[FM_MAX_DIMS];
    int n = 0;
    if (ga_ints(c, "perm", p, &n, FM_MAX_DIMS)) return fm_last_status();
    if (n != ndim) return fm_set_error(FM_ERR_INVALID, "attribute 'perm' must list all %d dims", ndim);
    unsigned seen = 0;
    for (int d = 0; d < n; d++) {
        if (g_norm_axis(p[d], ndim, &perm[d])) return fm_last_status();
        if (seen & (1u << perm[d])) return fm_set_error(FM_ERR_INVALID, "attribute 'perm' repeats dim %d", perm[d]);
        seen |= 1u << perm[d];
    }
    return FM_OK;
}

static fm_status inf_permute(const gctx *c, const gtype *in, gtype *out) {
    int perm[FM_MAX_DIMS];
    if (get_perm(c, in[0].ndim, perm)) return fm_last_status();
    out[0] = in[0];
    for (int d = 0; d < in[0].ndim; d++) out[0].d[d] = in[0].d[perm[d]];
    return FM_OK;
}

static fm_status run_permute(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int perm[FM_MAX_DIMS];
    if (get_perm(c, in[0]->ndim, perm)) return fm_last_status();
    RUN_DONE(fm_permute(in[0], perm));
}

static fm_status two_axes(const gctx *c, int ndim, int *a, int *b) {
    int64_t x = 0, y = 0;
    if (ga_int(c, "dim0", 0, &x) || ga_int(c, "dim1", 1, &y) || g_norm_axis(x, ndim, a) || g_norm_axis(y, ndim, b)) return fm_last_status();
    if (ndim < 1) return fm_set_error(FM_ERR_INVALID, "input needs at least 1 dim");
    return FM_OK;
}

static fm_status inf_transpose(const gctx *c, const gtype *in, gtype *out) {
    int a = 0, b = 0;
    if (two_axes(c, in[0].ndim, &a, &b)) return fm_last_status();
    out[0] = in[0];
    out[0].d[a] = in[0].d[b];
    out[0].d[b] = in[0].d[a];
    return FM_OK;
}

static fm_status run_transpose(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int a = 0, b = 0;
    if (two_axes(c, in[0]->ndim, &a, &b)) return fm_last_status();
    RUN_DONE(fm_transpose(in[0], a, b));
}

/* slice: axis, start, end (python semantics: negative from the end, clamped), step > 0. */
static fm_status slice_args(const gctx *c, int ndim, int *ax, int64_t *start, int64_t *end, int64_t *step) {
    int64_t axis, v[1];
    int n = 0;
    if (ga_int(c, "axis", 0, &axis) || g_norm_axis(axis, ndim, ax) || ga_int(c, "step", 1, step)) return fm_last_status();
    if (ndim < 1) return fm_set_error(FM_ERR_INVALID, "cannot slice a 0-dimensional input");
    if (*step < 1) return fm_set_error(FM_ERR_INVALID, "attribute 'step' must be >= 1");
    if (ga_ints(c, "start", v, &n, 1)) return fm_last_status();
    *start = n == 1 ? v[0] : 0;
    if (ga_ints(c, "end", v, &n, 1)) return fm_last_status();
    *end = n == 1 ? v[0] : INT64_MAX;
    return FM_OK;
}

static fm_status inf_slice(const gctx *c, const gtype *in, gtype *out) {
    int ax = 0;
    int64_t s = 0, e = 0, st = 0;
    if (slice_args(c, in[0].ndim, &ax, &s, &e, &st)) return fm_last_status();
    int64_t n = in[0].d[ax];
    if (s < 0) s += n;
    if (e < 0) e += n;
    if (s < 0) s = 0;
    if (s > n) s = n;
    if (e > n) e = n;
    if (e < s) e = s;
    out[0] = in[0];
    out[0].d[ax] = (e - s + st - 1) / st;
    return FM_OK;
}

static fm_status run_slice(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int ax = 0;
    int64_t s = 0, e = 0, st = 0;
    if (slice_args(c, in[0]->ndim, &ax, &s, &e, &st)) return fm_last_status();
    RUN_DONE(fm_slice(in[0], ax, s, e, st));
}

static fm_status inf_unsqueeze(const gctx *c, const gtype *in, gtype *out) {
    int64_t axis = 0;
    int ax = 0;
    if (ga_int(c, "axis", 0, &axis)) return fm_last_status();
    if (in[0].ndim >= FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "input already has %d dims", FM_MAX_DIMS);
    if (g_norm_axis(axis, in[0].ndim + 1, &ax)) return fm_last_status();
    out[0] = in[0];
    out[0].ndim++;
    for (int d = in[0].ndim; d > ax; d--) out[0].d[d] = in[0].d[d - 1];
    out[0].d[ax] = 1;
    return FM_OK;
}

static fm_status run_unsqueeze(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t axis = 0;
    if (ga_int(c, "axis", 0, &axis)) return fm_last_status();
    RUN_DONE(fm_unsqueeze(in[0], (int)axis));
}

static fm_status inf_squeeze(const gctx *c, const gtype *in, gtype *out) {
    int64_t axis = 0;
    int ax = 0;
    if (ga_int(c, "axis", 0, &axis) || g_norm_axis(axis, in[0].ndim, &ax)) return fm_last_status();
    if (in[0].ndim < 1 || in[0].d[ax] != 1) return fm_set_error(FM_ERR_INVALID, "dim %d has size %lld, not 1", ax, in[0].ndim ? (long long)in[0].d[ax] : 0LL);
    out[0] = in[0];
    out[0].ndim--;
    for (int d = ax; d < out[0].ndim; d++) out[0].d[d] = in[0].d[d + 1];
    return FM_OK;
}

static fm_status run_squeeze(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t axis = 0;
    if (ga_int(c, "axis", 0, &axis)) return fm_last_status();
    RUN_DONE(fm_squeeze(in[0], (int)axis));
}

static fm_status flatten_axes(const gctx *c, int ndim, int *s, int *e) {
    int64_t a = 0, b = 0;
    if (ga_int(c, "start", 0, &a) || ga_int(c, "end", -1, &b) || g_norm_axis(a, ndim, s) || g_norm_axis(b, ndim, e)) return fm_last_status();
    if (*s > *e) return fm_set_error(FM_ERR_INVALID, "start %d is after end %d", *s, *e);
    return FM_OK;
}

static fm_status inf_flatten(const gctx *c, const gtype *in, gtype *out) {
    int s = 0, e = 0;
    if (in[0].ndim == 0) { out[0] = (gtype){in[0].dt, 1, {1}}; return FM_OK; }
    if (flatten_axes(c, in[0].ndim, &s, &e)) return fm_last_status();
    out[0].dt = in[0].dt;
    out[0].ndim = 0;
    int64_t m = 1;
    for (int d = 0; d < in[0].ndim; d++) {
        if (d < s || d > e) { out[0].d[out[0].ndim++] = in[0].d[d]; continue; }
        m *= in[0].d[d];
        if (d == e) out[0].d[out[0].ndim++] = m;
    }
    return FM_OK;
}

static fm_status run_flatten(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int s = 0, e = 0;
    if (in[0]->ndim && flatten_axes(c, in[0]->ndim, &s, &e)) return fm_last_status();
    RUN_DONE(fm_flatten(in[0], s, e));
}

/* expand: "shape" (-1 keeps the input's size); input dims are aligned right. */
static fm_status expand_target(const gctx *c, const gtype *x, gtype *o) {
    char s1[96];
    int64_t sh[FM_MAX_DIMS];
    int n = 0;
    if (ga_ints(c, "shape", sh, &n, FM_MAX_DIMS)) return fm_last_status();
    if (n < x->ndim) return fm_set_error(FM_ERR_INVALID, "attribute 'shape' needs at least %d sizes", x->ndim);
    o->dt = x->dt;
    o->ndim = n;
    for (int d = 0; d < n; d++) {
        int xd = d - (n - x->ndim);
        int64_t have = xd >= 0 ? x->d[xd] : 1;
        if (sh[d] == -1 && xd >= 0) sh[d] = have;
        if (sh[d] < 0 || sh[d] > (INT64_C(1) << 40) || (have != 1 && have != sh[d]))
            return fm_set_error(FM_ERR_INVALID, "cannot expand %s: size %lld at dim %d", g_tshape(x, s1, sizeof s1), (long long)sh[d], d);
        o->d[d] = sh[d];
    }
    return FM_OK;
}

static fm_status inf_expand(const gctx *c, const gtype *in, gtype *out) { return expand_target(c, &in[0], &out[0]); }

static fm_status run_expand(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    gtype x = {in[0]->dtype, in[0]->ndim, {0}}, o;
    memcpy(x.d, in[0]->shape, sizeof x.d);
    if (expand_target(c, &x, &o)) return fm_last_status();
    RUN_DONE(fm_expand(in[0], o.ndim, o.d));
}

static fm_status inf_cat(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    int64_t axis = 0;
    int ax, n = c->n->n_in;
    if (ga_int(c, "axis", 0, &axis)) return fm_last_status();
    if (in[0].ndim < 1) return fm_set_error(FM_ERR_INVALID, "cannot concatenate 0-dimensional inputs");
    if (g_norm_axis(axis, in[0].ndim, &ax)) return fm_last_status();
    out[0] = in[0];
    for (int i = 1; i < n; i++) {
        if (in[i].ndim < 0) return fm_set_error(FM_ERR_INVALID, "input %d is absent", i);
        bool ok = in[i].ndim == in[0].ndim && in[i].dt == in[0].dt;
        for (int d = 0; ok && d < in[0].ndim; d++) ok = d == ax || in[i].d[d] == in[0].d[d];
        if (!ok) return fm_set_error(FM_ERR_INVALID, "input %d %s (%s) does not match input 0 %s (%s) outside axis %d", i,
                                     g_tshape(&in[i], s1, sizeof s1), fm_dtype_name(in[i].dt), g_tshape(&in[0], s2, sizeof s2),
                                     fm_dtype_name(in[0].dt), ax);
        out[0].d[ax] += in[i].d[ax];
    }
    return FM_OK;
}

static fm_status run_cat(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t axis = 0;
    if (ga_int(c, "axis", 0, &axis)) return fm_last_status();
    /* a KV cache's concatenation (a graph input's past, axis 2 of 4, into a graph
     * output): in place when the run asks (fm_graph_run_options.kv_append) */
    const gnode *n = c->n;
    if (g_kv_append_on(c) && n->n_in == 2 && in[0]->ndim == 4 && in[1]->ndim == 4 && (axis == 2 || axis == -2) &&
        c->g->values[n->in[0]].kind == GV_INPUT && c->g->values[n->out[0]].is_output)
        RUN_DONE(g_kv_append(c, in[0], in[1], in[1]->dtype));
    RUN_DONE(fm_cat(c->n->n_in, in, (int)axis));
}

static fm_status cast_dtype(const gctx *c, fm_dtype *dt) {
    const char *s = ga_string(c, "dtype", NULL);
    if (!s || fm_dtype_from_name(s, dt) != FM_OK) return fm_set_error(FM_ERR_INVALID, "attribute 'dtype' must name a dtype (f32, f16, bf16, i64, ...)");
    return FM_OK;
}

static fm_status inf_cast(const gctx *c, const gtype *in, gtype *out) {
    out[0] = in[0];
    return cast_dtype(c, &out[0].dt);
}

static fm_status run_cast(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    fm_dtype dt = FM_F32;
    if (cast_dtype(c, &dt)) return fm_last_status();
    RUN_DONE(fm_to_dtype(in[0], dt));
}

static fm_status inf_same(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_contiguous(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    (void)c;
    RUN_DONE(fm_contiguous(in[0]));
}

/* pad: "pads" (2 ndim amounts, every dim's before, then every dim's after: ONNX's order),
 * "mode" (constant, edge, reflect, wrap; default constant), "value" (constant mode; default 0) */
static fm_status pad_args(const gctx *c, int ndim, int64_t *pads, fm_pad_mode *mode, double *value) {
    int n = 0;
    if (ga_ints(c, "pads", pads, &n, 2 * FM_MAX_DIMS)) return fm_last_status();
    if (n != 2 * ndim) return fm_set_error(FM_ERR_INVALID, "attribute 'pads' has %d values; %d expected (before and after each of %d dims)", n, 2 * ndim, ndim);
    if (fm_pad_mode_parse(ga_string(c, "mode", "constant"), mode)) return fm_last_status();
    return ga_float(c, "value", 0.0, value);
}

static fm_status inf_pad(const gctx *c, const gtype *in, gtype *out) {
    int64_t pads[2 * FM_MAX_DIMS];
    fm_pad_mode mode;
    double v;
    if (pad_args(c, in[0].ndim, pads, &mode, &v)) return fm_last_status();
    out[0] = in[0];
    return fm_pad_shape(in[0].ndim, in[0].d, pads, mode, out[0].d);
}

/* arange: start, start + step, ... as many as x has along axis (a 1-D tensor of dtype, i64
 * by default): position ids and masks over a dynamic sequence length, the ONNX import's
 * Range over a dim's size. Only x's shape is read. */
/* arange's and dim_size's attribute 'dtype': a numeric dtype, i64 by default. */
static fm_status numeric_dtype(const gctx *c, fm_dtype *dt) {
    const char *s = ga_string(c, "dtype", "i64");
    if (!s || fm_dtype_from_name(s, dt) != FM_OK || *dt == FM_BOOL)
        return fm_set_error(FM_ERR_INVALID, "attribute 'dtype' must name a numeric dtype (i64, i32, f32, ...)");
    return FM_OK;
}

static fm_status arange_args(const gctx *c, int ndim, int *axis, double *start, double *step, fm_dtype *dt) {
    int64_t a = 0;
    if (ga_int(c, "axis", 0, &a) || ga_float(c, "start", 0, start) || ga_float(c, "step", 1, step) || numeric_dtype(c, dt))
        return fm_last_status();
    if (!(*step == *step) || *step == 0) return fm_set_error(FM_ERR_INVALID, "attribute 'step' must be a nonzero number");
    return g_norm_axis(a, ndim, axis);
}

static fm_status inf_arange(const gctx *c, const gtype *in, gtype *out) {
    int axis = 0;
    double start, step;
    fm_dtype dt;
    if (in[0].ndim < 1) return fm_set_error(FM_ERR_INVALID, "needs an input with at least 1 dim");
    if (arange_args(c, in[0].ndim, &axis, &start, &step, &dt)) return fm_last_status();
    out[0].dt = dt;
    out[0].ndim = 1;
    out[0].d[0] = in[0].d[axis];
    return FM_OK;
}

static fm_status run_arange(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int axis = 0;
    double start = 0, step = 1;
    fm_dtype dt = FM_I64;
    if (in[0]->ndim < 1) return fm_set_error(FM_ERR_INVALID, "needs an input with at least 1 dim");
    if (arange_args(c, in[0]->ndim, &axis, &start, &step, &dt)) return fm_last_status();
    const int64_t n = in[0]->shape[axis];
    fm_tensor *h = fm_tensor_empty(1, &n, dt, FM_CPU);
    for (int64_t i = 0; h && i < n; i++) fm_tensor_set(h, i, start + (double)i * step);
    if (!h || in[0]->storage->device.type == FM_DEV_CPU) RUN_DONE(h);
    fm_tensor *d = fm_tensor_to(h, in[0]->storage->device);
    fm_tensor_release(h);
    RUN_DONE(d);
}

/* dim_size: x's size along axis as a 0-d tensor of dtype (i64 by default), for arithmetic
 * on a dynamic dim (a mask's flat index b * s + j). Only x's shape is read. */
static fm_status dim_size_args(const gctx *c, int ndim, int *axis, fm_dtype *dt) {
    int64_t a = 0;
    if (ga_int(c, "axis", 0, &a) || numeric_dtype(c, dt)) return fm_last_status();
    if (ndim < 1) return fm_set_error(FM_ERR_INVALID, "needs an input with at least 1 dim");
    return g_norm_axis(a, ndim, axis);
}

static fm_status inf_dim_size(const gctx *c, const gtype *in, gtype *out) {
    int axis = 0;
    fm_dtype dt = FM_I64;
    if (dim_size_args(c, in[0].ndim, &axis, &dt)) return fm_last_status();
    out[0].dt = dt;
    out[0].ndim = 0;
    return FM_OK;
}

static fm_status run_dim_size(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int axis = 0;
    fm_dtype dt = FM_I64;
    if (dim_size_args(c, in[0]->ndim, &axis, &dt)) return fm_last_status();
    RUN_DONE(fm_tensor_full(0, NULL, (double)in[0]->shape[axis], dt, in[0]->storage->device));
}

static fm_status run_pad(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t pads[2 * FM_MAX_DIMS];
    fm_pad_mode mode;
    double v;
    if (pad_args(c, in[0]->ndim, pads, &mode, &v)) return fm_last_status();
    RUN_DONE(fm_pad(in[0], pads, mode, v));
}

const g_op_spec g_ops_shape[] = {
    {"reshape", 1, 1, 1, "shape", inf_reshape, run_reshape, NULL},
    {"permute", 1, 1, 1, "perm", inf_permute, run_permute, NULL},
    {"transpose", 1, 1, 1, "dim0,dim1", inf_transpose, run_transpose, NULL},
    {"slice", 1, 1, 1, "axis,start,end,step", inf_slice, run_slice, NULL},
    {"unsqueeze", 1, 1, 1, "axis", inf_unsqueeze, run_unsqueeze, NULL},
    {"squeeze", 1, 1, 1, "axis", inf_squeeze, run_squeeze, NULL},
    {"flatten", 1, 1, 1, "start,end", inf_flatten, run_flatten, NULL},
    {"expand", 1, 1, 1, "shape", inf_expand, run_expand, NULL},
    {"cat", 1, FM_GRAPH_MAX_NODE_IO, 1, "axis", inf_cat, run_cat, NULL},
    {"cast", 1, 1, 1, "dtype", inf_cast, run_cast, NULL},
    {"contiguous", 1, 1, 1, "", inf_same, run_contiguous, NULL},
    {"pad", 1, 1, 1, "pads,mode,value", inf_pad, run_pad, NULL},
    {"arange", 1, 1, 1, "axis,start,step,dtype", inf_arange, run_arange, NULL},
    {"dim_size", 1, 1, 1, "axis,dtype", inf_dim_size, run_dim_size, NULL},
};
const int g_n_ops_shape = (int)(sizeof g_ops_shape / sizeof g_ops_shape[0]);
