/* Front ends of the reductions. The reduced axes are moved (by a permuted copy
 * when needed) so that they form one contiguous block; kernels then only see
 * [outer, R, inner]. Results are computed keepdim-shaped and viewed without
 * the reduced axes when keepdim is false. */
#include <math.h>
#include <string.h>

#include "autograd/node.h"
#include "dispatch/dispatch.h"
#include "core/tensor_internal.h"
#include "backend/kernel.h"

typedef struct red_attrs {
    unsigned mask;       /* reduced axes of the ORIGINAL input */
    int correction;
    int64_t count;       /* elements per output */
} red_attrs;

static fm_status axes_mask(const char *op, const fm_tensor *x, int n_axes, const int *axes, unsigned *mask) {
    *mask = 0;
    if (n_axes < 0 || n_axes > FM_MAX_DIMS) return fm_set_error(FM_ERR_INVALID, "%s: %d axes given", op, n_axes);
    if (n_axes == 0) { *mask = x->ndim ? (1u << x->ndim) - 1 : 0; return FM_OK; }
    if (n_axes && !axes) return fm_set_error(FM_ERR_INVALID, "%s: axes is NULL", op);
    for (int i = 0; i < n_axes; i++) {
        int a;
        if (fm_norm_axis(op, axes[i], x->ndim, &a)) return fm_last_status();
        if (x->ndim == 0) continue;
        if (*mask >> a & 1) return fm_set_error(FM_ERR_INVALID, "%s: axis %d is listed twice", op, a);
        *mask |= 1u << a;
    }
    return FM_OK;
}

static void keep_shape(const fm_tensor *x, unsigned mask, int64_t *out) {
    for (int i = 0; i < x->ndim; i++) out[i] = (mask >> i & 1) ? 1 : x->shape[i];
}

/* Contiguous input whose reduced axes form one block; *kmask is the mask in its axes. */
static fm_tensor *arrange(fm_tensor *x, unsigned mask, unsigned *kmask, int *perm_out, bool *permuted) {
    int first = -1, last = -1;
    for (int i = 0; i < x->ndim; i++)
        if (mask >> i & 1) { if (first < 0) first = i; last = i; }
    bool block = true;
    for (int i = first; first >= 0 && i <= last; i++) block &= (mask >> i & 1) != 0;
    *permuted = false;
    if (block) { *kmask = mask; return fm_contiguous(x); }
    int perm[FM_MAX_DIMS], k = 0;
    for (int i = 0; i < x->ndim; i++) if (!(mask >> i & 1)) perm[k++] = i;
    int nk = k;
    for (int i = 0; i < x->ndim; i++) if (mask >> i & 1) perm[k++] = i;
    *kmask = 0;
    for (int i = nk; i < x->ndim; i++) *kmask |= 1u << i;
    memcpy(perm_out, perm, sizeof perm);
    *permuted = true;
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *p = fm_permute(x, perm), *c = p ? fm_contiguous(p) : NULL;
    fm_set_grad_enabled(prev);
    fm_tensor_release(p);
    return c;
}

/* Runs the kernel; returns the keepdim-shaped result in the ORIGINAL axis order. */
static fm_tensor *run_reduce(fm_op_id op, fm_tensor *x, unsigned mask, int correction, fm_dtype out_dt, fm_tensor **idx_out) {
    unsigned kmask;
    int perm[FM_MAX_DIMS];
    bool permuted;
    fm_tensor *xc = arrange(x, mask, &kmask, perm, &permuted);
    if (!xc) return NULL;
    int64_t ks[FM_MAX_DIMS];
    keep_shape(xc, kmask, ks);
    fm_tensor *y = fm_tensor_empty(xc->ndim, ks, out_dt, x->storage->device);
    fm_tensor *idx = NULL;
    if (y && idx_out) idx = fm_tensor_empty(xc->ndim, ks, FM_I64, x->storage->device);
    if (!y || (idx_out && !idx)) { fm_tensor_release_n(3, xc, y, idx); return NULL; }
    fm_reduce_attrs ra = {kmask, correction};
    fm_dim_attrs da = {0};
    for (int i = 0; i < xc->ndim; i++) if (kmask >> i & 1) { da.axis = i; break; }
    bool dim_op = op == FM_OP_MAX_DIM || op == FM_OP_MIN_DIM || op == FM_OP_ARGMAX;
    fm_op_call c = {.op = op, .n_in = 1, .n_out = idx ? 2 : 1, .in = {xc}, .out = {y, idx},
                    .attrs = dim_op ? (const void *)&da : (const void *)&ra};
    fm_status st = fm_dispatch(&c);
    fm_tensor_release(xc);
    if (st) { fm_tensor_release_n(2, y, idx); return NULL; }
    if (permuted) { /* results are in permuted axis order with size-1 reduced dims: a reshape restores it */
        int64_t orig[FM_MAX_DIMS];
        keep_shape(x, mask, orig);
        bool prev = fm_set_grad_enabled(false);
        fm_tensor *y2 = fm_reshape(y, x->ndim, orig), *i2 = idx ? fm_reshape(idx, x->ndim, orig) : NULL;
        fm_set_grad_enabled(prev);
        fm_tensor_release_n(2, y, idx);
        y = y2;
        idx = i2;
    }
    if (idx_out) *idx_out = idx;
    return y;
}

static fm_tensor *squeeze_mask(fm_tensor *y, unsigned mask, bool keepdim) {
    if (keepdim || !y) return y;
    int64_t sh[FM_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < y->ndim; i++) if (!(mask >> i & 1)) sh[k++] = y->shape[i];
    fm_tensor *r = fm_reshape(y, k, sh);
    fm_tensor_release(y);
    return r;
}

/* gradient (keepdim shape) broadcast back to x's shape */
static fm_tensor *expand_back(fm_tensor *g, const fm_node *n, const fm_tensor *x) {
    const red_attrs *a = FM_NODE_ATTRS(n, red_attrs);
    int64_t ks[FM_MAX_DIMS];
    keep_shape(x, a->mask, ks);
    fm_tensor *gk = fm_reshape(g, x->ndim, ks);
    if (!gk) return NULL;
    fm_tensor *e = fm_expand(gk, x->ndim, x->shape);
    fm_tensor_release(gk);
    return e;
}

/* d prod / d x_i, exact with zeros: prod / x_i where the slice has no zero; where it has one,
 * the product of the others at the zero and 0 elsewhere; where it has more, 0. */
static fm_tensor *prod_grad_factor(fm_tensor *x, int na, const int *axes) {
    fm_tensor *z0 = fm_tensor_zeros(0, NULL, x->dtype, x->storage->device), *one = fm_tensor_full(0, NULL, 1, x->dtype, x->storage->device);
    fm_tensor *isz = z0 ? fm_eq(x, z0) : NULL, *zf = isz ? fm_to_dtype(isz, x->dtype) : NULL, *nz = zf ? fm_sum(zf, na, axes, true) : NULL;
    fm_tensor *xs = isz && one ? fm_where(isz, one, x) : NULL, *pn = xs ? fm_prod(xs, na, axes, true) : NULL;
    fm_tensor *none = pn ? fm_div(pn, xs) : NULL, *at0 = pn ? fm_where(isz, pn, z0) : NULL;
    fm_tensor *n0 = nz ? fm_eq(nz, z0) : NULL, *n1 = nz ? fm_eq(nz, one) : NULL;
    fm_tensor *w1 = n1 && at0 ? fm_where(n1, at0, z0) : NULL, *r = n0 && none && w1 ? fm_where(n0, none, w1) : NULL;
    fm_tensor_release_n(12, z0, one, isz, zf, nz, xs, pn, none, at0, n0, n1, w1);
    return r;
}

static fm_status reduce_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const red_attrs *a = FM_NODE_ATTRS(n, red_attrs);
    fm_tensor *x = n->saved[0], *y = n->saved[1];
    fm_tensor *ge = expand_back(gout[0], n, x);
    if (!ge) return fm_last_status();
    fm_tensor *r = NULL;
    switch (n->op) {
    case FM_OP_SUM: r = fm_contiguous(ge); break;
    case FM_OP_MEAN: r = fm_mul_scalar(ge, 1.0 / (double)a->count); break;
    case FM_OP_AMAX:
    case FM_OP_AMIN: { /* ties share the gradient evenly */
        fm_tensor *ye = expand_back(y, n, x);
        fm_tensor *m = ye ? fm_eq(x, ye) : NULL, *mf = m ? fm_to_dtype(m, x->dtype) : NULL;
        int axes[FM_MAX_DIMS], na = 0;
        for (int i = 0; i < x->ndim; i++) if (a->mask >> i & 1) axes[na++] = i;
        fm_tensor *cnt = mf ? fm_sum(mf, na, axes, true) : NULL;
        fm_tensor *w = cnt ? fm_div(mf, cnt) : NULL;
        r = w ? fm_mul(ge, w) : NULL;
        fm_tensor_release_n(5, ye, m, mf, cnt, w);
        break;
    }
    case FM_OP_VAR:
    case FM_OP_STD: {
        int axes[FM_MAX_DIMS], na = 0;
        for (int i = 0; i < x->ndim; i++) if (a->mask >> i & 1) axes[na++] = i;
        fm_tensor *mu = fm_mean(x, na, axes, true);
        fm_tensor *d = mu ? fm_sub(x, mu) : NULL;
        double k = 2.0 / (double)(a->count - a->correction);
        fm_tensor *s = d ? fm_mul_scalar(d, n->op == FM_OP_VAR ? k : k / 2) : NULL;
        if (s && n->op == FM_OP_STD) {
            fm_tensor *ye = expand_back(y, n, x);
            fm_tensor *q = ye ? fm_div(s, ye) : NULL;
            fm_tensor_release_n(2, s, ye);
            s = q;
        }
        r = s ? fm_mul(ge, s) : NULL;
        fm_tensor_release_n(3, mu, d, s);
        break;
    }
    case FM_OP_PROD: {
        int axes[FM_MAX_DIMS], na = 0;
        for (int i = 0; i < x->ndim; i++) if (a->mask >> i & 1) axes[na++] = i;
        fm_tensor *f = prod_grad_factor(x, na, axes);
        r = f ? fm_mul(ge, f) : NULL;
        fm_tensor_release(f);
        break;
    }
    case FM_OP_LOGSUMEXP: {
        fm_tensor *ye = expand_back(y, n, x);
        fm_tensor *d = ye ? fm_sub(x, ye) : NULL, *p = d ? fm_exp(d) : NULL;
        r = p ? fm_mul(ge, p) : NULL;
        fm_tensor_release_n(3, ye, d, p);
        break;
    }
    default: break;
    }
    fm_tensor_release(ge);
    if (!r) return fm_last_status();
    gin[0] = r;
    return FM_OK;
}

static fm_tensor *reduce(fm_op_id op, fm_tensor *x, int n_axes, const int *axes, int correction, bool keepdim) {
    const char *name = fm_op_get_info(op)->name;
    if (!x) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", name); return NULL; }
    if (op != FM_OP_SUM && op != FM_OP_AMAX && op != FM_OP_AMIN && op != FM_OP_PROD && !fm_dtype_is_float(x->dtype)) {
        fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point tensor (got %s)", name, fm_dtype_name(x->dtype));
        return NULL;
    }
    unsigned mask;
    if (axes_mask(name, x, n_axes, axes, &mask)) return NULL;
    fm_dtype odt = x->dtype;
    if (op == FM_OP_SUM && !fm_dtype_is_float(x->dtype)) odt = FM_I64; /* integer sums do not overflow the input type */
    fm_tensor *y = run_reduce(op, x, mask, correction, odt, NULL);
    if (!y) return NULL;
    red_attrs ra = {mask, correction, 1};
    for (int i = 0; i < x->ndim; i++) if (mask >> i & 1) ra.count *= x->shape[i];
    fm_node *n = fm_node_begin(op, 1, &x, reduce_backward);
    if (n) {
        FM_NODE_SET_ATTRS(n, ra);
        fm_node_save(n, 0, x);
        if (op != FM_OP_SUM && op != FM_OP_MEAN) fm_node_save(n, 1, y);
        fm_node_finish(n, 1, &y);
    }
    return squeeze_mask(y, mask, keepdim);
}

fm_tensor *fm_sum(fm_tensor *a, int n, const int *ax, bool k) { return reduce(FM_OP_SUM, a, n, ax, 0, k); }
fm_tensor *fm_mean(fm_tensor *a, int n, const int *ax, bool k) { return reduce(FM_OP_MEAN, a, n, ax, 0, k); }
fm_tensor *fm_amax(fm_tensor *a, int n, const int *ax, bool k) { return reduce(FM_OP_AMAX, a, n, ax, 0, k); }
fm_tensor *fm_amin(fm_tensor *a, int n, const int *ax, bool k) { return reduce(FM_OP_AMIN, a, n, ax, 0, k); }
fm_tensor *fm_var(fm_tensor *a, int n, const int *ax, int c, bool k) {
    if (c < 0) { fm_set_error(FM_ERR_INVALID, "var: correction must be >= 0 (got %d)", c); return NULL; }
    return reduce(FM_OP_VAR, a, n, ax, c, k);
}
fm_tensor *fm_std(fm_tensor *a, int n, const int *ax, int c, bool k) {
    if (c < 0) { fm_set_error(FM_ERR_INVALID, "std: correction must be >= 0 (got %d)", c); return NULL; }
    return reduce(FM_OP_STD, a, n, ax, c, k);
}
fm_tensor *fm_logsumexp(fm_tensor *a, int n, const int *ax, bool k) { return reduce(FM_OP_LOGSUMEXP, a, n, ax, 0, k); }
fm_tensor *fm_prod(fm_tensor *a, int n, const int *ax, bool k) { return reduce(FM_OP_PROD, a, n, ax, 0, k); }

/* ---- max/min along one axis, with indices ---- */

static fm_status dim_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    fm_tensor *x = n->saved[0], *idx = n->saved[1];
    int axis = FM_NODE_ATTRS(n, red_attrs)->correction; /* reused slot: the axis */
    /* gradient goes to the recorded position: mask = (iota along axis == index) */
    fm_tensor *iota = fm_tensor_arange(0, (double)x->shape[axis], 1, FM_I64);
    int64_t sh[FM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) sh[i] = i == axis ? x->shape[axis] : 1;
    fm_tensor *io = iota ? fm_tensor_to(iota, x->storage->device) : NULL;
    fm_tensor *iv = io ? fm_reshape(io, x->ndim, sh) : NULL;
    fm_tensor *m = iv ? fm_eq(iv, idx) : NULL;
    fm_tensor *ge = gout[0] ? expand_back(gout[0], n, x) : NULL;
    fm_tensor *z = fm_tensor_zeros(0, NULL, x->dtype, x->storage->device);
    fm_tensor *r = (m && ge && z) ? fm_where(m, ge, z) : NULL;
    fm_tensor_release_n(6, iota, io, iv, m, ge, z);
    if (!r) return fm_last_status();
    gin[0] = r;
    return FM_OK;
}

static fm_tensor *dim_reduce(fm_op_id op, fm_tensor *x, int axis, bool keepdim, fm_tensor **indices) {
    const char *name = fm_op_get_info(op)->name;
    if (indices) *indices = NULL;
    if (!x) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", name); return NULL; }
    int a;
    if (fm_norm_axis(name, axis, x->ndim, &a)) return NULL;
    if (x->ndim && x->shape[a] == 0) { fm_set_error(FM_ERR_INVALID, "%s: cannot reduce over an empty dimension", name); return NULL; }
    unsigned mask = x->ndim ? 1u << a : 0;
    fm_tensor *idx = NULL;
    fm_tensor *y = run_reduce(op, x, mask, 0, op == FM_OP_ARGMAX ? FM_I64 : x->dtype, op == FM_OP_ARGMAX ? NULL : &idx);
    if (!y) return NULL;
    if (op != FM_OP_ARGMAX) {
        fm_node *n = fm_node_begin(op, 1, &x, dim_backward);
        if (n) {
            red_attrs ra = {mask, a, x->ndim ? x->shape[a] : 1};
            FM_NODE_SET_ATTRS(n, ra);
            fm_node_save(n, 0, x);
            fm_node_save(n, 1, idx);
            fm_node_finish(n, 1, &y);
        }
    }
    y = squeeze_mask(y, mask, keepdim);
    if (indices && idx) *indices = squeeze_mask(idx, mask, keepdim);
    else fm_tensor_release(idx);
    return y;
}

fm_tensor *fm_max_dim(fm_tensor *a, int axis, bool k, fm_tensor **i) { return dim_reduce(FM_OP_MAX_DIM, a, axis, k, i); }
fm_tensor *fm_min_dim(fm_tensor *a, int axis, bool k, fm_tensor **i) { return dim_reduce(FM_OP_MIN_DIM, a, axis, k, i); }
fm_tensor *fm_argmax(fm_tensor *a, int axis, bool k) { return dim_reduce(FM_OP_ARGMAX, a, axis, k, NULL); }

/* ---- running sums ---- */

static fm_tensor *cumsum(fm_tensor *x, int axis, bool exclusive, bool reverse, bool record);

/* dx = the running sum of dy the other way round (an exclusive sum's gradient is exclusive too). */
static fm_status cumsum_backward(fm_node *n, fm_tensor *const *gout, fm_tensor **gin) {
    const fm_cumsum_attrs *a = FM_NODE_ATTRS(n, fm_cumsum_attrs);
    gin[0] = cumsum(gout[0], a->axis, a->exclusive, !a->reverse, false);
    return gin[0] ? FM_OK : fm_last_status();
}

static fm_tensor *cumsum(fm_tensor *x, int axis, bool exclusive, bool reverse, bool record) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "cumsum: input is NULL"); return NULL; }
    if (x->dtype == FM_BOOL) { fm_set_error(FM_ERR_INVALID, "cumsum: needs a numeric input, got bool (cast it first)"); return NULL; }
    int a = 0;
    if (x->ndim && fm_norm_axis("cumsum", axis, x->ndim, &a)) return NULL;
    fm_tensor *xc = fm_contiguous(x);
    fm_tensor *y = xc ? fm_tensor_empty(x->ndim, x->shape, x->dtype, x->storage->device) : NULL;
    if (!y) { fm_tensor_release(xc); return NULL; }
    fm_cumsum_attrs at = {a, exclusive, reverse};
    fm_op_call c = {.op = FM_OP_CUMSUM, .n_in = 1, .n_out = 1, .in = {xc}, .out = {y}, .attrs = &at};
    fm_status st = fm_dispatch(&c);
    fm_tensor_release(xc);
    if (st) { fm_tensor_release(y); return NULL; }
    fm_node *n = record ? fm_node_begin(FM_OP_CUMSUM, 1, &x, cumsum_backward) : NULL;
    if (n) {
        FM_NODE_SET_ATTRS(n, at);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

fm_tensor *fm_cumsum(fm_tensor *a, int axis, bool exclusive, bool reverse) { return cumsum(a, axis, exclusive, reverse, true); }
