/* ONNX's loss ops: NegativeLogLikelihoodLoss (opset 12 on; 13 and 22 only widen its types)
 * and SoftmaxCrossEntropyLoss (12 on), whose loss is NegativeLogLikelihoodLoss of the
 * LogSoftmax over axis 1 (its optional second output). Both are made of fathom's ops, so
 * they run on the input's device.
 *
 * They follow ONNX's function bodies, which are what ONNX Runtime runs: an ignored element
 * reads class 0, then a select sets its loss and its weight to 0, so a NaN or inf there never
 * reaches the result; mean is sum(w[t] loss) / sum(w[t]), NaN when no weight is left (every
 * element ignored, or zero weights), as ONNX Runtime gives. The targets are read on the host
 * first: ONNX leaves a target outside [0, C) that is not the ignore_index undefined (ONNX
 * Runtime's GatherElements fails on some and wraps the negative ones), so it is an error
 * naming the value. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

typedef struct loss_args {
    fm_tensor *x, *t, *w; /* input, target, weight (NULL: every class weighs 1) */
    fm_reduction red;
    bool has_ii, ignored; /* an ignore_index is given; some target equals it */
    int64_t ii;
} loss_args;

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }

static fm_status read_attrs(onnx_op_ctx *c, loss_args *a) {
    char buf[32];
    const char *r = onnx_attr_string(c, "reduction", "mean", buf, sizeof buf);
    if (!strcmp(r, "mean")) a->red = FM_REDUCE_MEAN;
    else if (!strcmp(r, "sum")) a->red = FM_REDUCE_SUM;
    else if (!strcmp(r, "none")) a->red = FM_REDUCE_NONE;
    else return onnx_node_error(c, FM_ERR_INVALID, "reduction must be none, sum or mean; got '%s'", r);
    const Onnx__AttributeProto *ii = onnx_attr(c, "ignore_index");
    a->has_ii = ii && ii->has_i;
    a->ii = a->has_ii ? ii->i : 0;
    return FM_OK;
}

static fm_status check_shapes(onnx_op_ctx *c, const loss_args *a) {
    const fm_tensor *x = a->x, *t = a->t, *w = a->w;
    char s1[96], s2[96];
    if (!fm_dtype_is_float(x->dtype))
        return onnx_node_error(c, FM_ERR_INVALID, "input must be a float tensor; got %s", fm_dtype_name(x->dtype));
    if (x->ndim < 2)
        return onnx_node_error(c, FM_ERR_INVALID, "input must be [N, C] or [N, C, d1, ...]; got %s",
                               fm_shape_str(x->ndim, x->shape, s1, sizeof s1));
    if (t->dtype != FM_I64 && t->dtype != FM_I32)
        return onnx_node_error(c, FM_ERR_INVALID, "target must be int32 or int64 class indices; got %s", fm_dtype_name(t->dtype));
    bool ok = t->ndim == x->ndim - 1 && t->shape[0] == x->shape[0];
    for (int d = 1; ok && d < t->ndim; d++) ok = t->shape[d] == x->shape[d + 1];
    if (!ok)
        return onnx_node_error(c, FM_ERR_INVALID, "target %s does not fit input %s (input [N, C, d1, ...] needs target [N, d1, ...])",
                               fm_shape_str(t->ndim, t->shape, s1, sizeof s1), fm_shape_str(x->ndim, x->shape, s2, sizeof s2));
    if (w && (w->ndim != 1 || w->shape[0] != x->shape[1]))
        return onnx_node_error(c, FM_ERR_INVALID, "weight %s must be [C] = [%" PRId64 "], one weight per class of input %s",
                               fm_shape_str(w->ndim, w->shape, s1, sizeof s1), x->shape[1],
                               fm_shape_str(x->ndim, x->shape, s2, sizeof s2));
    if (w && w->dtype != x->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "weight is %s; it must be the input's type, %s", fm_dtype_name(w->dtype),
                               fm_dtype_name(x->dtype));
    return FM_OK;
}

/* Every target a class in [0, C) or the ignore_index; sets a->ignored. */
static fm_status scan_targets(onnx_op_ctx *c, loss_args *a) {
    int64_t n = fm_tensor_numel(a->t), nc = a->x->shape[1];
    a->ignored = false;
    if (n == 0) return FM_OK;
    int64_t *v = malloc((size_t)n * sizeof *v);
    /* int64 goes through fm_contiguous so that it is copied as is, never through double */
    fm_tensor *ct = a->t->dtype == FM_I64 ? fm_contiguous(a->t) : fm_tensor_retain(a->t);
    fm_status st = !v ? fm_set_error(FM_ERR_OOM, "out of memory") : !ct ? fm_last_status() : fm_tensor_copy_to_host(ct, v, FM_I64);
    fm_tensor_release(ct);
    for (int64_t i = 0; !st && i < n; i++) {
        if (a->has_ii && v[i] == a->ii) a->ignored = true;
        else if (v[i] < 0 || v[i] >= nc) {
            char ii[48] = "none";
            if (a->has_ii) snprintf(ii, sizeof ii, "%" PRId64, a->ii);
            st = onnx_node_error(c, FM_ERR_INVALID,
                                 "target value %" PRId64 " (element %" PRId64 ") is not a class: C = %" PRId64
                                 ", so a target must lie in [0, %" PRId64 ") or equal the ignore_index (%s)",
                                 v[i], i, nc, nc, ii);
        }
    }
    free(v);
    return st;
}

/* target == ignore_index (FM_BOOL); the index is exact in the target's type, since some target equals it. */
static fm_tensor *ignore_mask(const loss_args *a) {
    int32_t i32 = (int32_t)a->ii;
    fm_tensor *s = fm_tensor_from_data(a->t->dtype == FM_I64 ? (const void *)&a->ii : (const void *)&i32, 0, NULL, a->t->dtype);
    fm_tensor *sd = s && !fm_device_eq(dev_of(s), dev_of(a->t)) ? fm_tensor_to(s, dev_of(a->t)) : fm_tensor_retain(s);
    fm_tensor *m = sd ? fm_eq(a->t, sd) : NULL;
    REL(s, sd);
    return m;
}

static fm_tensor *scalar_like(const fm_tensor *x, double v) { return fm_tensor_full(0, NULL, v, x->dtype, dev_of(x)); }

/* -x[n, t, d...] per target element (tt: the targets with the ignored ones read as class 0),
 * 0 where mask. */
static fm_tensor *picked(fm_tensor *x, fm_tensor *tt, fm_tensor *mask) {
    fm_tensor *ti = fm_unsqueeze(tt, 1), *g = ti ? fm_gather(x, 1, ti) : NULL;
    fm_tensor *g1 = g ? fm_reshape(g, tt->ndim, tt->shape) : NULL;
    REL(ti, g);
    if (g1 && mask) {
        fm_tensor *z = scalar_like(x, 0), *s = z ? fm_where(mask, z, g1) : NULL;
        REL(z, g1);
        g1 = s;
    }
    fm_tensor *y = g1 ? fm_neg(g1) : NULL;
    fm_tensor_release(g1);
    return y;
}

/* w[t] per target element (w NULL: 1), 0 where mask. */
static fm_tensor *element_weights(fm_tensor *x, fm_tensor *w, fm_tensor *tt, fm_tensor *mask) {
    fm_tensor *wg = NULL;
    if (w) {
        int64_t n = fm_tensor_numel(tt);
        fm_tensor *flat = fm_reshape(tt, 1, &n), *g = flat ? fm_index_select(w, 0, flat) : NULL;
        wg = g ? fm_reshape(g, tt->ndim, tt->shape) : NULL;
        REL(flat, g);
    } else {
        wg = scalar_like(x, 1);
    }
    if (wg && mask) {
        fm_tensor *z = scalar_like(x, 0), *s = z ? fm_where(mask, z, wg) : NULL;
        REL(z, wg);
        wg = s;
    }
    return wg;
}

static fm_tensor *reduce_loss(fm_tensor *l, fm_tensor *wg, fm_reduction red) {
    if (red == FM_REDUCE_NONE) return fm_tensor_retain(l);
    if (red == FM_REDUCE_SUM) return fm_sum(l, 0, NULL, false);
    if (!wg) return fm_mean(l, 0, NULL, false);
    fm_tensor *s = fm_sum(l, 0, NULL, false), *sw = s ? fm_sum(wg, 0, NULL, false) : NULL;
    fm_tensor *y = sw ? fm_div(s, sw) : NULL;
    REL(s, sw);
    return y;
}

/* The loss of log-probabilities lp (the input, or SoftmaxCrossEntropyLoss's log_prob). */
static fm_tensor *nll(fm_tensor *lp, const loss_args *a) {
    fm_tensor *mask = a->ignored ? ignore_mask(a) : NULL, *z = NULL, *tt = NULL;
    if (a->ignored) {
        z = mask ? fm_tensor_zeros(0, NULL, a->t->dtype, dev_of(a->t)) : NULL;
        tt = z ? fm_where(mask, z, a->t) : NULL;
    } else {
        tt = fm_tensor_retain(a->t);
    }
    fm_tensor *l = tt ? picked(lp, tt, mask) : NULL, *wg = NULL, *lw = NULL;
    /* without weights or ignored elements every weight is 1, and mean is the plain mean */
    bool weighted = a->w || mask;
    if (l && weighted && (wg = element_weights(lp, a->w, tt, mask))) lw = fm_mul(l, wg);
    fm_tensor *y = !l || (weighted && !lw) ? NULL : reduce_loss(weighted ? lw : l, wg, a->red);
    REL(mask, z, tt, l, wg, lw);
    return y;
}

static fm_status prepare(onnx_op_ctx *c, loss_args *a) {
    *a = (loss_args){.x = c->in[0], .t = c->in[1], .w = c->n_in > 2 ? c->in[2] : NULL};
    if (read_attrs(c, a) || check_shapes(c, a)) return fm_last_status();
    return scan_targets(c, a);
}

static fm_status op_nll_loss(onnx_op_ctx *c) {
    loss_args a;
    if (prepare(c, &a)) return fm_last_status();
    return onnx_set_out(c, 0, nll(a.x, &a));
}

/* LogSoftmax over axis 1; float16 and bfloat16 are computed in float32 and rounded back (the
 * CPU's kernels, which the check device runs too, have no low-precision softmax). */
static fm_tensor *log_prob(fm_tensor *x) {
    if (x->dtype != FM_F16 && x->dtype != FM_BF16) return fm_log_softmax(x, 1);
    fm_tensor *x32 = fm_to_dtype(x, FM_F32), *y32 = x32 ? fm_log_softmax(x32, 1) : NULL;
    fm_tensor *y = y32 ? fm_to_dtype(y32, x->dtype) : NULL;
    REL(x32, y32);
    return y;
}

static fm_status op_softmax_cross_entropy(onnx_op_ctx *c) {
    loss_args a;
    if (prepare(c, &a)) return fm_last_status();
    fm_tensor *lp = log_prob(a.x);
    if (!lp) return fm_last_status();
    fm_status st = onnx_set_out(c, 0, nll(lp, &a));
    if (st) {
        fm_tensor_release(lp);
        return st;
    }
    return onnx_set_out(c, 1, lp);
}

const onnx_op onnx_ops_loss[] = {
    {"NegativeLogLikelihoodLoss", 12, 2, 3, 1, "reduction,ignore_index", op_nll_loss},
    {"SoftmaxCrossEntropyLoss", 12, 2, 3, 2, "reduction,ignore_index", op_softmax_cross_entropy},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
