/* Front end of max_pool2d and avg_pool2d (NCHW or NHWC, no ceil mode).
 *
 * max_pool2d keeps the argmax of every window (flat ih*W + iw within its plane,
 * PyTorch's convention) so the backward scatters without re-reading x.
 * avg_pool2d's backward needs only the input's shape, which the node keeps in
 * its attributes: no tensor is saved. A stride of 0 means "equal to the kernel"
 * (PyTorch's default). */
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "fathom/autograd.h" /* fm_grad_enabled */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_pool2d_attrs */
#include "backend/conv_geom.h" /* fm_pool_out_len */

typedef struct pool_node_attrs {
    fm_pool2d_attrs a;
    int ndim;
    int64_t xshape[4];
    fm_dtype dtype;
    fm_device device;
} pool_node_attrs;

/* Validates x and p; fills the resolved params and the output shape. */
static fm_status pool_check(const char *op, const fm_tensor *x, const fm_pool2d_params *pp, fm_pool2d_params *p,
                            int64_t yshape[4]) {
    char s1[96];
    if (!x) return fm_set_error(FM_ERR_INVALID, "%s: input is NULL", op);
    if (!pp) return fm_set_error(FM_ERR_INVALID, "%s: params are NULL", op);
    *p = *pp;
    if (p->layout != FM_NCHW && p->layout != FM_NHWC)
        return fm_set_error(FM_ERR_INVALID, "%s: unknown layout %d (use FM_NCHW or FM_NHWC)", op, (int)p->layout);
    if (x->ndim != 4)
        return fm_set_error(FM_ERR_INVALID, "%s: input must be 4-D (%s), got %s", op,
                            p->layout == FM_NHWC ? "NHWC" : "NCHW", fm_shape_str(x->ndim, x->shape, s1, sizeof s1));
    if (!fm_dtype_is_float(x->dtype))
        return fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point input, got %s", op, fm_dtype_name(x->dtype));
    bool nhwc = p->layout == FM_NHWC;
    int64_t H = nhwc ? x->shape[1] : x->shape[2], W = nhwc ? x->shape[2] : x->shape[3];
    int64_t in[2] = {H, W}, out[2];
    for (int i = 0; i < 2; i++) {
        if (p->stride[i] == 0) p->stride[i] = p->kernel[i];
        if (p->kernel[i] < 1 || p->stride[i] < 1 || p->padding[i] < 0)
            return fm_set_error(FM_ERR_INVALID, "%s: kernel (%d, %d) and stride (%d, %d) must be >= 1, padding (%d, %d) >= 0",
                                op, pp->kernel[0], pp->kernel[1], pp->stride[0], pp->stride[1], pp->padding[0], pp->padding[1]);
        if (2 * p->padding[i] > p->kernel[i])
            return fm_set_error(FM_ERR_INVALID, "%s: padding (%d, %d) must be at most half the kernel (%d, %d)", op,
                                p->padding[0], p->padding[1], p->kernel[0], p->kernel[1]);
        int64_t padded = in[i] + 2 * (int64_t)p->padding[i];
        if (padded < p->kernel[i])
            return fm_set_error(FM_ERR_INVALID, "%s: kernel (%d, %d) is larger than the padded input %lldx%lld (input %s)", op,
                                p->kernel[0], p->kernel[1], (long long)(H + 2 * p->padding[0]),
                                (long long)(W + 2 * p->padding[1]), fm_shape_str(x->ndim, x->shape, s1, sizeof s1));
        out[i] = fm_pool_out_len(in[i], p->kernel[i], p->stride[i], p->padding[i], p->ceil_mode);
    }
    yshape[0] = x->shape[0];
    if (nhwc) { yshape[1] = out[0]; yshape[2] = out[1]; yshape[3] = x->shape[3]; }
    else { yshape[1] = x->shape[1]; yshape[2] = out[0]; yshape[3] = out[1]; }
    return FM_OK;
}

static fm_status max_pool2d_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *x = n->saved[0], *idx = n->saved[1];
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    if (!grad_out[0]) {
        grad_in[0] = fm_tensor_zeros_like(x);
        return grad_in[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *dx = fm_tensor_empty(x->ndim, x->shape, x->dtype, fm_tensor_device(x));
    if (!dx) return fm_last_status();
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_MAX_POOL2D_BACKWARD;
    call.n_in = 3;
    call.n_out = 1;
    call.in[0] = grad_out[0];
    call.in[1] = x;
    call.in[2] = idx;
    call.out[0] = dx;
    call.attrs = &FM_NODE_ATTRS(n, pool_node_attrs)->a;
    fm_status st = fm_dispatch(&call);
    if (st != FM_OK) { fm_tensor_release(dx); return st; }
    grad_in[0] = dx;
    return FM_OK;
}

fm_tensor *fm_max_pool2d(fm_tensor *x, const fm_pool2d_params *pp) {
    pool_node_attrs na;
    memset(&na, 0, sizeof na);
    int64_t yshape[4];
    if (pool_check("max_pool2d", x, pp, &na.a.p, yshape) != FM_OK) return NULL;
    /* the argmax indices only where the backward will read them (inference skips them) */
    const bool track = fm_grad_enabled() && x->requires_grad;
    fm_tensor *y = fm_tensor_empty(4, yshape, x->dtype, fm_tensor_device(x));
    fm_tensor *idx = track ? fm_tensor_empty(4, yshape, FM_I64, fm_tensor_device(x)) : NULL;
    if (!y || (track && !idx)) { fm_tensor_release_n(2, y, idx); return NULL; }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_MAX_POOL2D;
    call.n_in = 1;
    call.n_out = 2;
    call.in[0] = x;
    call.out[0] = y;
    call.out[1] = idx;
    call.attrs = &na.a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release_n(2, y, idx); return NULL; }
    fm_node *n = fm_node_begin(FM_OP_MAX_POOL2D, 1, &x, max_pool2d_backward);
    if (n) {
        fm_node_save(n, 0, x);
        fm_node_save(n, 1, idx);
        FM_NODE_SET_ATTRS(n, na);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(idx);
    return y;
}

static fm_status avg_pool2d_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    const pool_node_attrs *na = FM_NODE_ATTRS(n, pool_node_attrs);
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    fm_dtype dt = na->dtype;
    fm_device dev = na->device;
    if (!grad_out[0]) {
        grad_in[0] = fm_tensor_zeros(na->ndim, na->xshape, dt, dev);
        return grad_in[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *dx = fm_tensor_empty(na->ndim, na->xshape, dt, dev);
    if (!dx) return fm_last_status();
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_AVG_POOL2D_BACKWARD;
    call.n_in = 1;
    call.n_out = 1;
    call.in[0] = grad_out[0];
    call.out[0] = dx;
    call.attrs = &na->a;
    fm_status st = fm_dispatch(&call);
    if (st != FM_OK) { fm_tensor_release(dx); return st; }
    grad_in[0] = dx;
    return FM_OK;
}

fm_tensor *fm_avg_pool2d(fm_tensor *x, const fm_pool2d_params *pp) {
    pool_node_attrs na;
    memset(&na, 0, sizeof na);
    int64_t yshape[4];
    if (pool_check("avg_pool2d", x, pp, &na.a.p, yshape) != FM_OK) return NULL;
    fm_tensor *y = fm_tensor_empty(4, yshape, x->dtype, fm_tensor_device(x));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_AVG_POOL2D;
    call.n_in = 1;
    call.n_out = 1;
    call.in[0] = x;
    call.out[0] = y;
    call.attrs = &na.a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    fm_node *n = fm_node_begin(FM_OP_AVG_POOL2D, 1, &x, avg_pool2d_backward);
    if (n) {
        na.ndim = 4;
        memcpy(na.xshape, x->shape, sizeof na.xshape);
        na.dtype = x->dtype;
        na.device = fm_tensor_device(x);
        FM_NODE_SET_ATTRS(n, na);
        fm_node_finish(n, 1, &y);
    }
    return y;
}
