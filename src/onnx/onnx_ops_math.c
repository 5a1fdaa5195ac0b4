/* ONNX elementwise math, activations, comparisons, reductions and casts, each
 * mapped onto fathom's ops (compositions where fathom has no single op). */
#include "onnx/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Releases every non-NULL tensor in the list; the list ends at a sentinel. */
#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

/* A 0-d tensor of value v with x's dtype and device. */
static fm_tensor *scalar_like(const fm_tensor *x, double v) {
    return fm_tensor_full(0, NULL, v, x->dtype, x->storage->device);
}

/* fn(x, scalar v), releasing the scalar. */
static fm_tensor *with_scalar(fm_tensor *(*fn)(fm_tensor *, fm_tensor *), fm_tensor *x, double v, bool scalar_first) {
    fm_tensor *s = scalar_like(x, v);
    if (!s) return NULL;
    fm_tensor *y = scalar_first ? fn(s, x) : fn(x, s);
    fm_tensor_release(s);
    return y;
}

static fm_tensor *need_float(const onnx_op_ctx *c, fm_tensor *x) {
    if (!fm_dtype_is_float(x->dtype)) {
        onnx_node_error(c, FM_ERR_UNSUPPORTED, "needs a floating-point input; got %s", fm_dtype_name(x->dtype));
        return NULL;
    }
    return x;
}

#define UNARY(NAME, FN)                                                             \
    static fm_status NAME(onnx_op_ctx *c) { return onnx_set_out(c, 0, FN(c->in[0])); }
UNARY(op_abs, fm_abs)
UNARY(op_neg, fm_neg)
UNARY(op_exp, fm_exp)
UNARY(op_log, fm_log)
UNARY(op_sqrt, fm_sqrt)
UNARY(op_sin, fm_sin)
UNARY(op_cos, fm_cos)
UNARY(op_tanh, fm_tanh)
UNARY(op_sigmoid, fm_sigmoid)
UNARY(op_relu, fm_relu)
UNARY(op_softplus, fm_softplus)
UNARY(op_identity, fm_tensor_retain)

static fm_status op_leaky_relu(onnx_op_ctx *c) {
    return onnx_set_out(c, 0, fm_leaky_relu(c->in[0], onnx_attr_float(c, "alpha", 0.01f)));
}

/* alpha * (exp(x) - 1) where x <= 0, x elsewhere (Elu; Selu scales it). */
static fm_tensor *elu(fm_tensor *x, double alpha) {
    fm_tensor *e = fm_exp(x), *em = e ? fm_add_scalar(e, -1.0) : NULL, *neg = em ? fm_mul_scalar(em, alpha) : NULL;
    fm_tensor *z = scalar_like(x, 0), *pos = z ? fm_gt(x, z) : NULL, *y = pos && neg ? fm_where(pos, x, neg) : NULL;
    REL(e, em, neg, z, pos);
    return y;
}

static fm_status op_elu(onnx_op_ctx *c) {
    if (!need_float(c, c->in[0])) return fm_last_status();
    return onnx_set_out(c, 0, elu(c->in[0], onnx_attr_float(c, "alpha", 1.0f)));
}

static fm_status op_selu(onnx_op_ctx *c) {
    if (!need_float(c, c->in[0])) return fm_last_status();
    fm_tensor *e = elu(c->in[0], onnx_attr_float(c, "alpha", 1.67326319217681884765625f));
    fm_tensor *y = e ? fm_mul_scalar(e, onnx_attr_float(c, "gamma", 1.05070102214813232421875f)) : NULL;
    fm_tensor_release(e);
    return onnx_set_out(c, 0, y);
}

static fm_status op_celu(onnx_op_ctx *c) {
    if (!need_float(c, c->in[0])) return fm_last_status();
    double alpha = onnx_attr_float(c, "alpha", 1.0f);
    fm_tensor *xs = fm_mul_scalar(c->in[0], 1.0 / alpha), *e = xs ? elu(xs, 1.0) : NULL;
    fm_tensor *y = e ? fm_mul_scalar(e, alpha) : NULL;
    REL(xs, e);
    return onnx_set_out(c, 0, y);
}

/* clamp(alpha * x + beta, 0, 1) */
static fm_tensor *hard_sigmoid(fm_tensor *x, double alpha, double beta) {
    fm_tensor *a = fm_mul_scalar(x, alpha), *b = a ? fm_add_scalar(a, beta) : NULL, *y = b ? fm_clamp(b, 0, 1) : NULL;
    REL(a, b);
    return y;
}

static fm_status op_hard_sigmoid(onnx_op_ctx *c) {
    if (!need_float(c, c->in[0])) return fm_last_status();
    return onnx_set_out(c, 0, hard_sigmoid(c->in[0], onnx_attr_float(c, "alpha", 0.2f), onnx_attr_float(c, "beta", 0.5f)));
}

static fm_status op_hard_swish(onnx_op_ctx *c) {
    if (!need_float(c, c->in[0])) return fm_last_status();
    fm_tensor *h = hard_sigmoid(c->in[0], 1.0 / 6, 0.5), *y = h ? fm_mul(c->in[0], h) : NULL;
    fm_tensor_release(h);
    return onnx_set_out(c, 0, y);
}

static fm_status op_softsign(onnx_op_ctx *c) {
    fm_tensor *a = fm_abs(c->in[0]), *d = a ? fm_add_scalar(a, 1.0) : NULL, *y = d ? fm_div(c->in[0], d) : NULL;
    REL(a, d);
    return onnx_set_out(c, 0, y);
}

static fm_status op_reciprocal(onnx_op_ctx *c) { return onnx_set_out(c, 0, with_scalar(fm_div, c->in[0], 1.0, true)); }

static fm_status op_thresholded_relu(onnx_op_ctx *c) {
    fm_tensor *t = scalar_like(c->in[0], onnx_attr_float(c, "alpha", 1.0f)), *m = t ? fm_gt(c->in[0], t) : NULL;
    fm_tensor *z = scalar_like(c->in[0], 0), *y = m && z ? fm_where(m, c->in[0], z) : NULL;
    REL(t, m, z);
    return onnx_set_out(c, 0, y);
}

static fm_status op_prelu(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *sl = c->in[1], *sr;
    if (c->opset < 7 && sl->ndim == 1 && x->ndim > 2 && sl->shape[0] == x->shape[1]) {
        /* before opset 7 a 1-D slope is per channel (dim 1) */
        int64_t sh[FM_MAX_DIMS] = {sl->shape[0]};
        for (int d = 1; d < x->ndim - 1; d++) sh[d] = 1;
        sr = fm_reshape(sl, x->ndim - 1, sh);
    } else sr = fm_tensor_retain(sl);
    fm_tensor *z = sr ? scalar_like(x, 0) : NULL, *m = z ? fm_lt(x, z) : NULL, *s = m ? fm_mul(x, sr) : NULL;
    fm_tensor *y = s ? fm_where(m, s, x) : NULL;
    REL(sr, z, m, s);
    return onnx_set_out(c, 0, y);
}

static fm_status op_mish(onnx_op_ctx *c) {
    fm_tensor *sp = fm_softplus(c->in[0]), *t = sp ? fm_tanh(sp) : NULL, *y = t ? fm_mul(c->in[0], t) : NULL;
    REL(sp, t);
    return onnx_set_out(c, 0, y);
}

static fm_status op_gelu(onnx_op_ctx *c) {
    char buf[16];
    const char *ap = onnx_attr_string(c, "approximate", "none", buf, sizeof buf);
    if (strcmp(ap, "none") && strcmp(ap, "tanh"))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "approximate='%s' is not supported (none or tanh)", ap);
    return onnx_set_out(c, 0, strcmp(ap, "tanh") ? fm_gelu(c->in[0]) : fm_gelu_tanh(c->in[0]));
}

static fm_status op_clip(onnx_op_ctx *c) {
    double lo = -INFINITY, hi = INFINITY;
    if (c->opset < 11) {
        lo = onnx_attr_float(c, "min", -INFINITY);
        hi = onnx_attr_float(c, "max", INFINITY);
    } else {
        if (c->n_in > 1 && c->in[1]) lo = fm_tensor_item(c->in[1]);
        if (c->n_in > 2 && c->in[2]) hi = fm_tensor_item(c->in[2]);
    }
    if (!fm_dtype_is_float(c->in[0]->dtype)) {
        /* integer clamp: through the comparisons, so no value passes through a float */
        fm_tensor *x = fm_tensor_retain(c->in[0]);
        if (c->n_in > 1 && c->in[1]) { fm_tensor *t = fm_maximum(x, c->in[1]); fm_tensor_release(x); x = t; }
        if (x && c->n_in > 2 && c->in[2]) { fm_tensor *t = fm_minimum(x, c->in[2]); fm_tensor_release(x); x = t; }
        return onnx_set_out(c, 0, x);
    }
    if (lo > hi) { /* ONNX: min > max gives max everywhere */
        fm_tensor *y = fm_tensor_full(c->in[0]->ndim, c->in[0]->shape, hi, c->in[0]->dtype, c->in[0]->storage->device);
        return onnx_set_out(c, 0, y);
    }
    return onnx_set_out(c, 0, fm_clamp(c->in[0], lo, hi));
}

/* ---- binary and variadic ---- */
typedef fm_tensor *(*binary_fn)(fm_tensor *, fm_tensor *);

/* Before opset 7, B broadcast onto A only with broadcast=1, its dims aligned at
 * `axis` of A (default: the trailing dims): B gets trailing 1s to make that numpy's rule. */
static fm_tensor *legacy_b(const onnx_op_ctx *c, fm_tensor *a, fm_tensor *b) {
    if (c->opset >= 7 || !onnx_attr_int(c, "broadcast", 0)) return fm_tensor_retain(b);
    int64_t axis = onnx_attr_int(c, "axis", a->ndim - b->ndim);
    if (axis < 0) axis += a->ndim;
    if (axis < 0 || axis + b->ndim > a->ndim) {
        onnx_node_error(c, FM_ERR_INVALID, "broadcast axis %d does not fit B's %d dimensions into A's %d", (int)axis, b->ndim,
                        a->ndim);
        return NULL;
    }
    int64_t sh[FM_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < b->ndim; d++) sh[n++] = b->shape[d];
    while (n < a->ndim - axis) sh[n++] = 1;
    return fm_reshape(b, n, sh);
}

static fm_status binary(onnx_op_ctx *c, binary_fn fn) {
    fm_tensor *b = legacy_b(c, c->in[0], c->in[1]), *y = b ? fn(c->in[0], b) : NULL;
    fm_tensor_release(b);
    return onnx_set_out(c, 0, y);
}
static fm_status op_add(onnx_op_ctx *c) { return binary(c, fm_add); }
static fm_status op_sub(onnx_op_ctx *c) { return binary(c, fm_sub); }
static fm_status op_mul(onnx_op_ctx *c) { return binary(c, fm_mul); }
static fm_status op_equal(onnx_op_ctx *c) { return binary(c, fm_eq); }
static fm_status op_less(onnx_op_ctx *c) { return binary(c, fm_lt); }
static fm_status op_less_equal(onnx_op_ctx *c) { return binary(c, fm_le); }
static fm_status op_greater(onnx_op_ctx *c) { return binary(c, fm_gt); }
static fm_status op_greater_equal(onnx_op_ctx *c) { return binary(c, fm_ge); }

static fm_status op_div(onnx_op_ctx *c) {
    if (fm_dtype_is_float(c->in[0]->dtype)) return binary(c, fm_div);
    /* integers: truncating division, as C and ONNX Runtime do */
    fm_tensor *a = fm_to_dtype(c->in[0], FM_F64), *b = a ? fm_to_dtype(c->in[1], FM_F64) : NULL;
    fm_tensor *q = b ? fm_div(a, b) : NULL, *y = q ? fm_to_dtype(q, c->in[0]->dtype) : NULL;
    REL(a, b, q);
    return onnx_set_out(c, 0, y);
}

static fm_status op_pow(onnx_op_ctx *c) {
    fm_tensor *lb = legacy_b(c, c->in[0], c->in[1]);
    fm_tensor *e = !lb ? NULL : lb->dtype == c->in[0]->dtype ? fm_tensor_retain(lb) : fm_to_dtype(lb, c->in[0]->dtype);
    fm_tensor_release(lb);
    if (!e) return fm_last_status();
    fm_tensor *y;
    if (fm_dtype_is_float(c->in[0]->dtype)) y = fm_pow(c->in[0], e);
    else { /* integer powers computed in double and cast back */
        fm_tensor *a = fm_to_dtype(c->in[0], FM_F64), *b = a ? fm_to_dtype(e, FM_F64) : NULL, *p = b ? fm_pow(a, b) : NULL;
        y = p ? fm_to_dtype(p, c->in[0]->dtype) : NULL;
        REL(a, b, p);
    }
    fm_tensor_release(e);
    return onnx_set_out(c, 0, y);
}

/* Bool logic on 0/1 values: and = min, or = max, xor = not-equal. */
static fm_status logic(onnx_op_ctx *c, binary_fn fn) {
    if (c->in[0]->dtype != FM_BOOL || c->in[1]->dtype != FM_BOOL)
        return onnx_node_error(c, FM_ERR_INVALID, "inputs must be bool");
    fm_tensor *a = fm_to_dtype(c->in[0], FM_U8), *b = a ? fm_to_dtype(c->in[1], FM_U8) : NULL, *r = b ? fn(a, b) : NULL;
    fm_tensor *y = r ? (r->dtype == FM_BOOL ? fm_tensor_retain(r) : fm_to_dtype(r, FM_BOOL)) : NULL;
    REL(a, b, r);
    return onnx_set_out(c, 0, y);
}
static fm_status op_and(onnx_op_ctx *c) { return logic(c, fm_minimum); }
static fm_status op_or(onnx_op_ctx *c) { return logic(c, fm_maximum); }
static fm_status op_xor(onnx_op_ctx *c) { return logic(c, fm_ne); }

static fm_status op_not(onnx_op_ctx *c) {
    if (c->in[0]->dtype != FM_BOOL) return onnx_node_error(c, FM_ERR_INVALID, "input must be bool");
    fm_tensor *z = scalar_like(c->in[0], 0), *y = z ? fm_eq(c->in[0], z) : NULL;
    fm_tensor_release(z);
    return onnx_set_out(c, 0, y);
}

static fm_status variadic(onnx_op_ctx *c, binary_fn fn, bool mean) {
    fm_tensor *acc = fm_tensor_retain(c->in[0]);
    for (int i = 1; acc && i < c->n_in; i++) {
        fm_tensor *t = fn(acc, c->in[i]);
        fm_tensor_release(acc);
        acc = t;
    }
    if (acc && mean) {
        fm_tensor *t = fm_mul_scalar(acc, 1.0 / c->n_in);
        fm_tensor_release(acc);
        acc = t;
    }
    return onnx_set_out(c, 0, acc);
}
static fm_status op_sum(onnx_op_ctx *c) { return variadic(c, fm_add, false); }
static fm_status op_mean(onnx_op_ctx *c) { return variadic(c, fm_add, true); }
static fm_status op_max(onnx_op_ctx *c) { return variadic(c, fm_maximum, false); }
static fm_status op_min(onnx_op_ctx *c) { return variadic(c, fm_minimum, false); }

static fm_status op_where(onnx_op_ctx *c) { return onnx_set_out(c, 0, fm_where(c->in[0], c->in[1], c->in[2])); }

static fm_status op_cast(onnx_op_ctx *c) {
    fm_dtype dt;
    int64_t to = onnx_attr_int(c, "to", 0);
    if (!onnx_dtype_to_fm((int32_t)to, &dt))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "cast to %s is not supported", onnx_dtype_name((int32_t)to));
    return onnx_set_out(c, 0, fm_to_dtype(c->in[0], dt));
}

static fm_status op_cast_like(onnx_op_ctx *c) { return onnx_set_out(c, 0, fm_to_dtype(c->in[0], c->in[1]->dtype)); }

/* ---- reductions ---- */
typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_LSE, R_SUMSQ, R_L1, R_L2, R_LOGSUM, R_PROD } reduce_kind;

static fm_tensor *reduce_as(reduce_kind k, fm_tensor *x, int n, const int *axes, bool keep) {
    fm_tensor *t = NULL, *y = NULL;
    switch (k) {
    case R_SUM: return fm_sum(x, n, axes, keep);
    case R_MEAN: return fm_mean(x, n, axes, keep);
    case R_MAX: return fm_amax(x, n, axes, keep);
    case R_MIN: return fm_amin(x, n, axes, keep);
    case R_LSE: return fm_logsumexp(x, n, axes, keep);
    case R_PROD: return fm_prod(x, n, axes, keep);
    case R_SUMSQ: case R_L2: t = fm_mul(x, x); break;
    case R_L1: t = fm_abs(x); break;
    case R_LOGSUM: t = fm_tensor_retain(x); break;
    }
    fm_tensor *s = t ? fm_sum(t, n, axes, keep) : NULL;
    y = !s ? NULL : k == R_L2 ? fm_sqrt(s) : k == R_LOGSUM ? fm_log(s) : fm_tensor_retain(s);
    REL(t, s);
    return y;
}

/* Whether the reduction covers no element (a reduced axis of size 0). */
static bool reduces_empty(const fm_tensor *x, int n, const int *axes) {
    for (int d = 0; d < x->ndim; d++) {
        bool red = n == 0;
        for (int i = 0; i < n; i++) red |= axes[i] == d || axes[i] + x->ndim == d;
        if (red && x->shape[d] == 0) return true;
    }
    return false;
}

/* ReduceMax/ReduceMin over an empty set: the identity (ONNX: -inf/+inf, or the
 * integer type's minimum/maximum), in the reduced shape. */
static fm_tensor *reduce_identity(const fm_tensor *x, int n, const int *axes, bool keep, bool is_max) {
    int64_t sh[FM_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        bool red = n == 0;
        for (int i = 0; i < n; i++) red |= axes[i] == d || axes[i] + x->ndim == d;
        if (!red) sh[nd++] = x->shape[d];
        else if (keep) sh[nd++] = 1;
    }
    bool fl = fm_dtype_is_float(x->dtype);
    fm_tensor *y = fm_tensor_empty(nd, sh, fl ? FM_F64 : FM_I64, FM_CPU);
    int64_t lo = x->dtype == FM_U8 || x->dtype == FM_BOOL ? 0 : x->dtype == FM_I8 ? INT8_MIN : x->dtype == FM_I32 ? INT32_MIN : INT64_MIN;
    int64_t hi = x->dtype == FM_U8 ? UINT8_MAX : x->dtype == FM_BOOL ? 1 : x->dtype == FM_I8 ? INT8_MAX : x->dtype == FM_I32 ? INT32_MAX : INT64_MAX;
    for (int64_t i = 0; y && i < fm_tensor_numel(y); i++) {
        if (fl) ((double *)fm_tensor_data(y))[i] = is_max ? -INFINITY : INFINITY;
        else ((int64_t *)fm_tensor_data(y))[i] = is_max ? lo : hi;
    }
    return onnx_host_back(y, x->dtype, x->storage->device);
}

static fm_status reduce(onnx_op_ctx *c, reduce_kind k, int axes_input_opset) {
    fm_tensor *x = c->in[0];
    int64_t ax[FM_MAX_DIMS];
    int n = 0;
    if (c->opset >= axes_input_opset) {
        if (c->n_in > 1 && c->in[1] && onnx_tensor_ints(c, 1, ax, FM_MAX_DIMS, &n)) return fm_last_status();
        if (n == 0 && onnx_attr_int(c, "noop_with_empty_axes", 0)) return onnx_set_out(c, 0, fm_tensor_retain(x));
    } else {
        const int64_t *a = onnx_attr_ints(c, "axes", &n);
        if (n > FM_MAX_DIMS) return onnx_node_error(c, FM_ERR_INVALID, "too many axes");
        for (int i = 0; i < n; i++) ax[i] = a[i];
    }
    int axes[FM_MAX_DIMS];
    for (int i = 0; i < n; i++) axes[i] = (int)ax[i];
    bool keep = onnx_attr_int(c, "keepdims", 1) != 0;
    if (x->ndim == 0) return onnx_set_out(c, 0, fm_tensor_retain(x));
    if ((k == R_MAX || k == R_MIN) && reduces_empty(x, n, axes)) return onnx_set_out(c, 0, reduce_identity(x, n, axes, keep, k == R_MAX));
    if (k != R_SUM && k != R_MAX && k != R_MIN && k != R_PROD && !need_float(c, x)) return fm_last_status();
    fm_tensor *y = reduce_as(k, x, n, n ? axes : NULL, keep);
    if (y && y->dtype != x->dtype) { /* integer sums come back int64 */
        fm_tensor *t = fm_to_dtype(y, x->dtype);
        fm_tensor_release(y);
        y = t;
    }
    return onnx_set_out(c, 0, y);
}
static fm_status op_reduce_sum(onnx_op_ctx *c) { return reduce(c, R_SUM, 13); }
static fm_status op_reduce_mean(onnx_op_ctx *c) { return reduce(c, R_MEAN, 18); }
static fm_status op_reduce_max(onnx_op_ctx *c) { return reduce(c, R_MAX, 18); }
static fm_status op_reduce_min(onnx_op_ctx *c) { return reduce(c, R_MIN, 18); }
static fm_status op_reduce_lse(onnx_op_ctx *c) { return reduce(c, R_LSE, 18); }
static fm_status op_reduce_sumsq(onnx_op_ctx *c) { return reduce(c, R_SUMSQ, 18); }
static fm_status op_reduce_l1(onnx_op_ctx *c) { return reduce(c, R_L1, 18); }
static fm_status op_reduce_l2(onnx_op_ctx *c) { return reduce(c, R_L2, 18); }
static fm_status op_reduce_logsum(onnx_op_ctx *c) { return reduce(c, R_LOGSUM, 18); }
static fm_status op_reduce_prod(onnx_op_ctx *c) { return reduce(c, R_PROD, 18); }

/* x reversed along dim d (a gather with reversed indices). */
static fm_tensor *flip(fm_tensor *x, int d) {
    int64_t n = x->shape[d];
    fm_tensor *r = fm_tensor_arange((double)(n - 1), -1, -1, FM_I64), *rd = r ? fm_tensor_to(r, x->storage->device) : NULL;
    fm_tensor *y = rd ? fm_index_select(x, d, rd) : NULL;
    fm_tensor_release_n(2, r, rd);
    return y;
}

/* ArgMin is ArgMax of -x (the first of equal values either way); select_last_index
 * runs on x reversed along the axis and maps the index back (n - 1 - i). */
static fm_status arg_reduce(onnx_op_ctx *c, bool is_min) {
    int axis;
    if (fm_norm_axis(c->node->op_type, (int)onnx_attr_int(c, "axis", 0), c->in[0]->ndim, &axis)) return fm_last_status();
    bool last = onnx_attr_int(c, "select_last_index", 0) != 0, keep = onnx_attr_int(c, "keepdims", 1) != 0;
    fm_tensor *x = is_min ? fm_neg(c->in[0]) : fm_tensor_retain(c->in[0]), *xf = x && last ? flip(x, axis) : NULL;
    fm_tensor *y = x && (xf || !last) ? fm_argmax(last ? xf : x, axis, keep) : NULL;
    if (y && last) {
        fm_tensor *t = fm_mul_scalar(y, -1.0), *u = t ? fm_add_scalar(t, (double)(c->in[0]->shape[axis] - 1)) : NULL;
        fm_tensor_release_n(2, t, y);
        y = u;
    }
    fm_tensor_release_n(2, x, xf);
    return onnx_set_out(c, 0, y);
}
static fm_status op_argmax(onnx_op_ctx *c) { return arg_reduce(c, false); }
static fm_status op_argmin(onnx_op_ctx *c) { return arg_reduce(c, true); }

/* TopK's k: an attribute before opset 10, then a one-element input. */
fm_status onnx_topk_k(onnx_op_ctx *c, int64_t *k) {
    if (c->opset < 10) {
        *k = onnx_attr_int(c, "k", -1);
        return FM_OK;
    }
    int n = 0;
    if (c->n_in < 2 || !c->in[1]) return onnx_node_error(c, FM_ERR_INVALID, "input K is missing (opset 10 on takes k as an input)");
    if (onnx_tensor_ints(c, 1, k, 1, &n)) return fm_last_status();
    return n == 1 ? FM_OK : onnx_node_error(c, FM_ERR_INVALID, "K must hold one value, got %d", n);
}

/* TopK: values and indices, always sorted (which sorted = 0 allows). */
static fm_status op_topk(onnx_op_ctx *c) {
    int64_t k;
    if (onnx_topk_k(c, &k)) return fm_last_status();
    fm_tensor *v = NULL, *i = NULL;
    if (fm_topk(c->in[0], k, (int)onnx_attr_int(c, "axis", -1), onnx_attr_int(c, "largest", 1) != 0, &v, &i)) return fm_last_status();
    fm_status st = onnx_set_out(c, 0, v);
    if (st) fm_tensor_release(i);
    return st ? st : onnx_set_out(c, 1, i);
}

#define RED_ATTRS "axes,keepdims,noop_with_empty_axes"
const onnx_op onnx_ops_math[] = {
    {"Abs", 6, 1, 1, 1, "", op_abs},          {"Neg", 6, 1, 1, 1, "", op_neg},
    {"Exp", 6, 1, 1, 1, "", op_exp},          {"Log", 6, 1, 1, 1, "", op_log},
    {"Sqrt", 6, 1, 1, 1, "", op_sqrt},        {"Sin", 7, 1, 1, 1, "", op_sin},
    {"Cos", 7, 1, 1, 1, "", op_cos},          {"Tanh", 6, 1, 1, 1, "", op_tanh},
    {"Sigmoid", 6, 1, 1, 1, "", op_sigmoid},  {"Relu", 6, 1, 1, 1, "", op_relu},
    {"Softplus", 1, 1, 1, 1, "", op_softplus}, {"Identity", 1, 1, 1, 1, "", op_identity},
    {"LeakyRelu", 6, 1, 1, 1, "alpha", op_leaky_relu}, {"Elu", 6, 1, 1, 1, "alpha", op_elu},
    {"Selu", 6, 1, 1, 1, "alpha,gamma", op_selu}, {"Celu", 12, 1, 1, 1, "alpha", op_celu},
    {"HardSigmoid", 6, 1, 1, 1, "alpha,beta", op_hard_sigmoid}, {"HardSwish", 14, 1, 1, 1, "", op_hard_swish},
    {"Softsign", 1, 1, 1, 1, "", op_softsign}, {"Reciprocal", 6, 1, 1, 1, "", op_reciprocal},
    {"ThresholdedRelu", 10, 1, 1, 1, "alpha", op_thresholded_relu}, {"PRelu", 1, 2, 2, 1, "", op_prelu},
    {"Mish", 18, 1, 1, 1, "", op_mish},       {"Gelu", 20, 1, 1, 1, "approximate", op_gelu},
    {"Clip", 6, 1, 3, 1, "min,max", op_clip},
    {"Add", 1, 2, 2, 1, "broadcast,axis", op_add}, {"Sub", 1, 2, 2, 1, "broadcast,axis", op_sub},
    {"Mul", 1, 2, 2, 1, "broadcast,axis", op_mul}, {"Div", 1, 2, 2, 1, "broadcast,axis", op_div},
    {"Pow", 1, 2, 2, 1, "broadcast,axis", op_pow},
    {"Equal", 1, 2, 2, 1, "broadcast,axis", op_equal}, {"Less", 1, 2, 2, 1, "broadcast,axis", op_less},
    {"LessOrEqual", 12, 2, 2, 1, "", op_less_equal}, {"Greater", 1, 2, 2, 1, "broadcast,axis", op_greater},
    {"GreaterOrEqual", 12, 2, 2, 1, "", op_greater_equal},
    {"And", 1, 2, 2, 1, "broadcast,axis", op_and}, {"Or", 1, 2, 2, 1, "broadcast,axis", op_or},
    {"Xor", 1, 2, 2, 1, "broadcast,axis", op_xor},          {"Not", 1, 1, 1, 1, "", op_not},
    {"Sum", 1, 1, -1, 1, "", op_sum},         {"Mean", 1, 1, -1, 1, "", op_mean},
    {"Max", 1, 1, -1, 1, "", op_max},         {"Min", 1, 1, -1, 1, "", op_min},
    {"Where", 9, 3, 3, 1, "", op_where},
    {"Cast", 6, 1, 1, 1, "to,saturate", op_cast}, {"CastLike", 15, 2, 2, 1, "saturate", op_cast_like},
    {"ReduceSum", 1, 1, 2, 1, RED_ATTRS, op_reduce_sum},       {"ReduceMean", 1, 1, 2, 1, RED_ATTRS, op_reduce_mean},
    {"ReduceMax", 1, 1, 2, 1, RED_ATTRS, op_reduce_max},       {"ReduceMin", 1, 1, 2, 1, RED_ATTRS, op_reduce_min},
    {"ReduceLogSumExp", 1, 1, 2, 1, RED_ATTRS, op_reduce_lse}, {"ReduceSumSquare", 1, 1, 2, 1, RED_ATTRS, op_reduce_sumsq},
    {"ReduceL1", 1, 1, 2, 1, RED_ATTRS, op_reduce_l1},         {"ReduceL2", 1, 1, 2, 1, RED_ATTRS, op_reduce_l2},
    {"ReduceLogSum", 1, 1, 2, 1, RED_ATTRS, op_reduce_logsum}, {"ReduceProd", 1, 1, 2, 1, RED_ATTRS, op_reduce_prod},
    {"ArgMax", 1, 1, 1, 1, "axis,keepdims,select_last_index", op_argmax},
    {"ArgMin", 1, 1, 1, 1, "axis,keepdims,select_last_index", op_argmin},
    {"TopK", 1, 1, 2, 2, "axis,k,largest,sorted", op_topk},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
