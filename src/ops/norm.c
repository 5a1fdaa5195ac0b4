/* Front end of layer norm and RMS norm: validation, dispatch, autograd.
 *
 * The kernels see x as M rows of N elements (N = product of the normalized
 * dims) and derive M from the statistics tensors the front end allocates, so x
 * keeps its shape and needs no reshape here. mean/rstd are saved for the
 * backward kernel, which produces dx and the weight/bias gradients in one pass.
 * The statistics are f32, except f64 for f64 inputs: gradient checks run in
 * f64 and f32 statistics would limit them to f32 accuracy. */
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_norm_attrs */
#include "amp/autocast.h"   /* the precision policy (ops.def: norms in f32) */

static const char *shp(int nd, const int64_t *s, char *buf, size_t n) { return fm_shape_str(nd, s, buf, n); }

static fm_dtype stat_dtype(fm_dtype dt) { return dt == FM_F64 ? FM_F64 : FM_F32; }

/* weight/bias must have exactly the normalized shape and x's dtype/device. */
static bool param_ok(const char *op, const char *what, const fm_tensor *p, const fm_tensor *x, int k) {
    if (!p) return true;
    char a[128], b[128], c[128];
    const int64_t *ns = x->shape + (x->ndim - k);
    if (p->ndim != k || memcmp(p->shape, ns, sizeof(int64_t) * (size_t)k) != 0) {
        fm_set_error(FM_ERR_INVALID, "%s: %s shape %s does not match normalized shape %s of input %s", op, what,
                     shp(p->ndim, p->shape, a, sizeof a), shp(k, ns, b, sizeof b), shp(x->ndim, x->shape, c, sizeof c));
        return false;
    }
    if (p->dtype != x->dtype) {
        fm_set_error(FM_ERR_INVALID, "%s: %s dtype %s does not match input dtype %s", op, what, fm_dtype_name(p->dtype),
                     fm_dtype_name(x->dtype));
        return false;
    }
    if (!fm_device_eq(fm_tensor_device(p), fm_tensor_device(x))) {
        fm_set_error(FM_ERR_INVALID, "%s: %s is on a different device than the input", op, what);
        return false;
    }
    return true;
}

/* Shared by both norms: saved = {x, weight, mean|NULL, rstd}. */
static fm_status norm_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    bool rms = n->op == FM_OP_RMS_NORM;
    fm_tensor *x = n->saved[0], *w = n->saved[1], *mean = n->saved[2], *rstd = n->saved[3];
    int n_params = rms ? 1 : 2;
    fm_tensor *src[3] = {x, w, rms ? NULL : n->saved[4]};
    fm_tensor *g[3] = {NULL, NULL, NULL};
    if (!grad_out[0]) {
        for (int i = 0; i <= n_params; i++) {
            if (!fm_node_needs_grad(n, i) || !src[i]) continue;
            grad_in[i] = fm_tensor_zeros_like(src[i]);
            if (!grad_in[i]) return fm_last_status();
        }
        return FM_OK;
    }
    /* dx is always produced (the kernel's row formula needs it anyway); a param
     * gradient only when that param exists and wants it. */
    for (int i = 0; i <= n_params; i++) {
        if (i > 0 && (!src[i] || !fm_node_needs_grad(n, i))) continue;
        g[i] = fm_tensor_empty(src[i]->ndim, src[i]->shape, src[i]->dtype, fm_tensor_device(src[i]));
        if (!g[i]) { fm_tensor_release_n(3, g[0], g[1], g[2]); return fm_last_status(); }
    }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = rms ? FM_OP_RMS_NORM_BACKWARD : FM_OP_LAYER_NORM_BACKWARD;
    call.in[0] = grad_out[0];
    call.in[1] = x;
    call.in[2] = w;
    if (rms) { call.n_in = 4; call.in[3] = rstd; }
    else { call.n_in = 5; call.in[3] = mean; call.in[4] = rstd; }
    call.n_out = n_params + 1;
    for (int i = 0; i <= n_params; i++) call.out[i] = g[i];
    call.attrs = n->attrs;
    fm_status st = fm_dispatch(&call);
    if (st != FM_OK) { fm_tensor_release_n(3, g[0], g[1], g[2]); return st; }
    if (fm_node_needs_grad(n, 0)) grad_in[0] = g[0];
    else fm_tensor_release(g[0]);
    for (int i = 1; i <= n_params; i++) grad_in[i] = g[i];
    return FM_OK;
}

static fm_tensor *norm_impl(bool rms, fm_tensor *x, int k, fm_tensor *weight, fm_tensor *bias, double eps) {
    const char *op = rms ? "rms_norm" : "layer_norm";
    char a[128];
    if (!x) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", op); return NULL; }
    if (!fm_dtype_is_float(x->dtype)) {
        fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point input, got %s", op, fm_dtype_name(x->dtype));
        return NULL;
    }
    if (k < 1 || k > x->ndim) {
        fm_set_error(FM_ERR_INVALID, "%s: cannot normalize over the last %d dims of input %s", op, k,
                     shp(x->ndim, x->shape, a, sizeof a));
        return NULL;
    }
    if (!(eps >= 0)) { fm_set_error(FM_ERR_INVALID, "%s: eps %g must be >= 0", op, eps); return NULL; }
    if (!param_ok(op, "weight", weight, x, k) || !param_ok(op, "bias", bias, x, k)) return NULL;
    int64_t M = 1;
    for (int i = 0; i < x->ndim - k; i++) M *= x->shape[i];
    fm_device dev = fm_tensor_device(x);
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, x->dtype, dev);
    fm_tensor *mean = rms ? NULL : fm_tensor_empty(1, &M, stat_dtype(x->dtype), dev);
    fm_tensor *rstd = fm_tensor_empty(1, &M, stat_dtype(x->dtype), dev);
    if (!y || (!rms && !mean) || !rstd) goto fail;
    fm_norm_attrs at = {eps};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = rms ? FM_OP_RMS_NORM : FM_OP_LAYER_NORM;
    call.in[0] = x;
    call.in[1] = weight;
    call.out[0] = y;
    if (rms) {
        call.n_in = 2; call.n_out = 2;
        call.out[1] = rstd;
    } else {
        call.n_in = 3; call.n_out = 3;
        call.in[2] = bias;
        call.out[1] = mean; call.out[2] = rstd;
    }
    call.attrs = &at;
    if (fm_dispatch(&call) != FM_OK) goto fail;
    fm_node *n = rms ? fm_node_begin(FM_OP_RMS_NORM, 2, (fm_tensor *[]){x, weight}, norm_backward)
                     : fm_node_begin(FM_OP_LAYER_NORM, 3, (fm_tensor *[]){x, weight, bias}, norm_backward);
    if (n) {
        fm_node_save(n, 0, x);
        fm_node_save(n, 1, weight);
        fm_node_save(n, 2, mean);
        fm_node_save(n, 3, rstd);
        fm_node_save(n, 4, bias);
        FM_NODE_SET_ATTRS(n, at);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(mean);
    fm_tensor_release(rstd);
    return y;
fail:
    fm_tensor_release_n(3, y, mean, rstd);
    return NULL;
}

fm_tensor *fm_layer_norm(fm_tensor *x, int n_norm_dims, fm_tensor *weight, fm_tensor *bias, double eps) {
    fm_tensor *c[3];
    int ac = fm_autocast_inputs(FM_OP_LAYER_NORM, 3, (fm_tensor *[]){x, weight, bias}, c);
    if (ac) {
        fm_tensor *y = ac > 0 ? fm_layer_norm(c[0], n_norm_dims, c[1], c[2], eps) : NULL;
        fm_tensor_release_n(3, c[0], c[1], c[2]);
        return y;
    }
    return norm_impl(false, x, n_norm_dims, weight, bias, eps);
}

fm_tensor *fm_rms_norm(fm_tensor *x, fm_tensor *weight, double eps) {
    fm_tensor *c[2];
    int ac = fm_autocast_inputs(FM_OP_RMS_NORM, 2, (fm_tensor *[]){x, weight}, c);
    if (ac) {
        fm_tensor *y = ac > 0 ? fm_rms_norm(c[0], c[1], eps) : NULL;
        fm_tensor_release_n(2, c[0], c[1]);
        return y;
    }
    return norm_impl(true, x, 1, weight, NULL, eps);
}
