/* Front end of softmax and log_softmax: validation, dispatch, autograd.
 *
 * Kernels only handle the last axis of a contiguous tensor (one row per
 * thread task, the row in cache). For another axis the front end swaps that
 * axis with the last one, makes the result contiguous, runs the kernel and
 * swaps back: one extra copy each way, in exchange for a single fast kernel.
 * Backward saves the output y (softmax: dx = y*(dy - <dy,y>); log_softmax:
 * dx = dy - exp(y)*sum(dy)), so the input need not be kept. */
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_softmax_attrs */
#include "amp/autocast.h"   /* the precision policy (ops.def: softmax in f32) */

/* t with `axis` moved to the end, contiguous (a new reference). */
static fm_tensor *axis_last(fm_tensor *t, int axis) {
    if (t->ndim == 0 || axis == t->ndim - 1) return fm_contiguous(t);
    fm_tensor *v = fm_transpose(t, axis, t->ndim - 1);
    if (!v) return NULL;
    fm_tensor *c = fm_contiguous(v);
    fm_tensor_release(v);
    return c;
}

/* Undo axis_last on a kernel result (consumes r). */
static fm_tensor *axis_back(fm_tensor *r, int axis) {
    if (!r || r->ndim == 0 || axis == r->ndim - 1) return r;
    fm_tensor *v = fm_transpose(r, axis, r->ndim - 1);
    fm_tensor_release(r);
    if (!v) return NULL;
    fm_tensor *c = fm_contiguous(v);
    fm_tensor_release(v);
    return c;
}

/* Runs a one-output row kernel along `axis`; grad mode must be off. */
static fm_tensor *run_along(fm_op_id op, fm_tensor *a, fm_tensor *b, int axis) {
    fm_tensor *ia = axis_last(a, axis), *ib = b ? axis_last(b, axis) : NULL, *y = NULL;
    if (!ia || (b && !ib)) goto done;
    y = fm_tensor_empty(ia->ndim, ia->shape, ia->dtype, fm_tensor_device(ia));
    if (!y) goto done;
    fm_softmax_attrs at = {ia->ndim ? ia->ndim - 1 : 0};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = op;
    call.n_in = b ? 2 : 1;
    call.n_out = 1;
    call.in[0] = ia;
    call.in[1] = ib;
    call.out[0] = y;
    call.attrs = &at;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); y = NULL; goto done; }
    y = axis_back(y, axis);
done:
    fm_tensor_release(ia);
    fm_tensor_release(ib);
    return y;
}

static fm_status softmax_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *y = n->saved[0];
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    if (!grad_out[0]) {
        grad_in[0] = fm_tensor_zeros_like(y);
        return grad_in[0] ? FM_OK : fm_last_status();
    }
    fm_op_id op = n->op == FM_OP_SOFTMAX ? FM_OP_SOFTMAX_BACKWARD : FM_OP_LOG_SOFTMAX_BACKWARD;
    grad_in[0] = run_along(op, grad_out[0], y, FM_NODE_ATTRS(n, fm_softmax_attrs)->axis);
    return grad_in[0] ? FM_OK : fm_last_status();
}

static fm_tensor *softmax_impl(fm_op_id op, fm_tensor *a, int axis) {
    const char *name = fm_op_get_info(op)->name;
    fm_tensor *c;
    int ac = fm_autocast_inputs(op, 1, &a, &c);
    if (ac) {
        fm_tensor *y = ac > 0 ? softmax_impl(op, c, axis) : NULL;
        fm_tensor_release(c);
        return y;
    }
    if (!a) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", name); return NULL; }
    if (a->dtype != FM_F32 && a->dtype != FM_F64 && a->dtype != FM_F16 && a->dtype != FM_BF16) {
        fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point input, got %s", name, fm_dtype_name(a->dtype));
        return NULL;
    }
    int ax = 0;
    if (a->ndim == 0) { /* a scalar is a row of one (PyTorch accepts dim 0 or -1) */
        if (axis != 0 && axis != -1) {
            fm_set_error(FM_ERR_INVALID, "%s: axis %d is out of range for a 0-d tensor", name, axis);
            return NULL;
        }
    } else if (fm_norm_axis(name, axis, a->ndim, &ax) != FM_OK) {
        return NULL;
    }
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *y = run_along(op, a, NULL, ax);
    fm_set_grad_enabled(prev);
    if (!y) return NULL;
    fm_node *n = fm_node_begin(op, 1, &a, softmax_backward);
    if (n) {
        fm_node_save(n, 0, y);
        fm_softmax_attrs at = {ax};
        FM_NODE_SET_ATTRS(n, at);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

fm_tensor *fm_softmax(fm_tensor *a, int axis) { return softmax_impl(FM_OP_SOFTMAX, a, axis); }
fm_tensor *fm_log_softmax(fm_tensor *a, int axis) { return softmax_impl(FM_OP_LOG_SOFTMAX, a, axis); }
