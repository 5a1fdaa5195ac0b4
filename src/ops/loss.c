/* Front end of the losses: fused cross-entropy from logits, and MSE.
 *
 * cross_entropy follows PyTorch: loss_i = (1-eps)*nll_i + eps*mean_c(-log p_ic),
 * rows whose target equals ignore_index contribute nothing, and the mean
 * divides by the number of rows not ignored (0 such rows: NaN, as PyTorch).
 * The kernel validates targets (it is the only code that reads their values,
 * so the front end stays backend-neutral) and never stores probabilities; the
 * backward kernel recomputes them row by row from the saved logits.
 * mse_loss broadcasts input against target; its backward is plain tensor
 * arithmetic, reduced back to each operand's shape. */
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_ce_attrs, fm_mse_attrs */
#include "amp/autocast.h"   /* the precision policy (ops.def: losses in f32) */

static const char *shp(const fm_tensor *t, char *buf, size_t n) { return fm_shape_str(t->ndim, t->shape, buf, n); }

static bool reduction_ok(const char *op, fm_reduction r) {
    if (r == FM_REDUCE_MEAN || r == FM_REDUCE_SUM || r == FM_REDUCE_NONE) return true;
    fm_set_error(FM_ERR_INVALID, "%s: unknown reduction %d (use FM_REDUCE_MEAN, _SUM or _NONE)", op, (int)r);
    return false;
}

/* ---- cross-entropy ---- */
static fm_status ce_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *logits = n->saved[0], *target = n->saved[1];
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    if (!grad_out[0]) {
        grad_in[0] = fm_tensor_zeros_like(logits);
        return grad_in[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *dx = fm_tensor_empty(logits->ndim, logits->shape, logits->dtype, fm_tensor_device(logits));
    if (!dx) return fm_last_status();
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_CROSS_ENTROPY_BACKWARD;
    call.n_in = 3;
    call.n_out = 1;
    call.in[0] = grad_out[0];
    call.in[1] = logits;
    call.in[2] = target;
    call.out[0] = dx;
    call.attrs = FM_NODE_ATTRS(n, fm_ce_attrs);
    fm_status st = fm_dispatch(&call);
    if (st != FM_OK) { fm_tensor_release(dx); return st; }
    grad_in[0] = dx;
    return FM_OK;
}

fm_tensor *fm_cross_entropy(fm_tensor *logits, fm_tensor *target, int64_t ignore_index, double label_smoothing,
                            fm_reduction reduction) {
    const char *op = "cross_entropy";
    fm_tensor *c[2];
    int ac = fm_autocast_inputs(FM_OP_CROSS_ENTROPY, 2, (fm_tensor *[]){logits, target}, c);
    if (ac) {
        fm_tensor *y = ac > 0 ? fm_cross_entropy(c[0], c[1], ignore_index, label_smoothing, reduction) : NULL;
        fm_tensor_release_n(2, c[0], c[1]);
        return y;
    }
    char a[128], b[128];
    if (!logits || !target) { fm_set_error(FM_ERR_INVALID, "%s: logits and target must not be NULL", op); return NULL; }
    if (!fm_dtype_is_float(logits->dtype)) {
        fm_set_error(FM_ERR_INVALID, "%s: logits must be floating point, got %s", op, fm_dtype_name(logits->dtype));
        return NULL;
    }
    if (target->dtype != FM_I64 && target->dtype != FM_I32) {
        fm_set_error(FM_ERR_INVALID, "%s: target must hold class indices (i64 or i32), got %s", op,
                     fm_dtype_name(target->dtype));
        return NULL;
    }
    if (logits->ndim != 1 && logits->ndim != 2) {
        fm_set_error(FM_ERR_INVALID, "%s: logits must be [N, C] or [C], got %s", op, shp(logits, a, sizeof a));
        return NULL;
    }
    bool batched = logits->ndim == 2;
    if ((batched && (target->ndim != 1 || target->shape[0] != logits->shape[0])) || (!batched && target->ndim != 0)) {
        fm_set_error(FM_ERR_INVALID, "%s: target shape %s does not match logits %s (expected %s)", op,
                     shp(target, a, sizeof a), shp(logits, b, sizeof b), batched ? "[N]" : "a 0-d tensor");
        return NULL;
    }
    if (logits->shape[logits->ndim - 1] <= 0) {
        fm_set_error(FM_ERR_INVALID, "%s: logits %s have no classes", op, shp(logits, a, sizeof a));
        return NULL;
    }
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
        fm_set_error(FM_ERR_INVALID, "%s: label_smoothing %g must be in [0, 1]", op, label_smoothing);
        return NULL;
    }
    if (!reduction_ok(op, reduction)) return NULL;
    if (!fm_device_eq(fm_tensor_device(logits), fm_tensor_device(target))) {
        fm_set_error(FM_ERR_INVALID, "%s: logits and target are on different devices", op);
        return NULL;
    }
    int64_t n_rows = batched ? logits->shape[0] : 1;
    fm_tensor *loss = reduction == FM_REDUCE_NONE && batched
                          ? fm_tensor_empty(1, &n_rows, logits->dtype, fm_tensor_device(logits))
                          : fm_tensor_empty(0, NULL, logits->dtype, fm_tensor_device(logits));
    if (!loss) return NULL;
    fm_ce_attrs at = {ignore_index, label_smoothing, reduction};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_CROSS_ENTROPY;
    call.n_in = 2;
    call.n_out = 1;
    call.in[0] = logits;
    call.in[1] = target;
    call.out[0] = loss;
    call.attrs = &at;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(loss); return NULL; }
    fm_node *n = fm_node_begin(FM_OP_CROSS_ENTROPY, 2, (fm_tensor *[]){logits, target}, ce_backward);
    if (n) {
        fm_node_save(n, 0, logits);
        fm_node_save(n, 1, target);
        FM_NODE_SET_ATTRS(n, at);
        fm_node_finish(n, 1, &loss);
    }
    return loss;
}

/* ---- mean squared error ---- */
static fm_status mse_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *x = n->saved[0], *t = n->saved[1], *xe = n->saved[2], *te = n->saved[3];
    fm_reduction red = FM_NODE_ATTRS(n, fm_mse_attrs)->reduction;
    fm_tensor *src[2] = {x, t};
    if (!grad_out[0]) {
        for (int i = 0; i < 2; i++) {
            if (!fm_node_needs_grad(n, i)) continue;
            grad_in[i] = fm_tensor_zeros_like(src[i]);
            if (!grad_in[i]) return fm_last_status();
        }
        return FM_OK;
    }
    /* d/dx = 2 (x - t) * g (/ numel for mean); d/dt is its negation */
    double k = 2.0;
    if (red == FM_REDUCE_MEAN) k /= (double)fm_tensor_numel(xe);
    fm_tensor *d = fm_sub(xe, te);
    fm_tensor *dg = d ? fm_mul(d, grad_out[0]) : NULL;
    fm_tensor *gx = dg ? fm_mul_scalar(dg, k) : NULL;
    fm_tensor_release(d);
    fm_tensor_release(dg);
    if (!gx) return fm_last_status();
    fm_status st = FM_OK;
    if (fm_node_needs_grad(n, 0)) {
        grad_in[0] = fm_sum_to(gx, x->ndim, x->shape);
        if (!grad_in[0]) st = fm_last_status();
    }
    if (st == FM_OK && fm_node_needs_grad(n, 1)) {
        fm_tensor *ng = fm_neg(gx);
        grad_in[1] = ng ? fm_sum_to(ng, t->ndim, t->shape) : NULL;
        fm_tensor_release(ng);
        if (!grad_in[1]) st = fm_last_status();
    }
    fm_tensor_release(gx);
    return st;
}

/* Shape both operands broadcast to, or an error naming both shapes. */
static bool broadcast_shape(const char *op, const fm_tensor *a, const fm_tensor *b, int *nd, int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char s1[128], s2[128];
            fm_set_error(FM_ERR_INVALID, "%s: input shape %s and target shape %s do not broadcast", op,
                         shp(a, s1, sizeof s1), shp(b, s2, sizeof s2));
            return false;
        }
        shape[i] = da == 1 ? db : da;
    }
    *nd = n;
    return true;
}

fm_tensor *fm_mse_loss(fm_tensor *input, fm_tensor *target, fm_reduction reduction) {
    const char *op = "mse_loss";
    fm_tensor *c[2];
    int ac = fm_autocast_inputs(FM_OP_MSE_LOSS, 2, (fm_tensor *[]){input, target}, c);
    if (ac) {
        fm_tensor *y = ac > 0 ? fm_mse_loss(c[0], c[1], reduction) : NULL;
        fm_tensor_release_n(2, c[0], c[1]);
        return y;
    }
    if (!input || !target) { fm_set_error(FM_ERR_INVALID, "%s: input and target must not be NULL", op); return NULL; }
    if (!fm_dtype_is_float(input->dtype) || input->dtype != target->dtype) {
        fm_set_error(FM_ERR_INVALID, "%s: input and target must have the same floating-point dtype, got %s and %s", op,
                     fm_dtype_name(input->dtype), fm_dtype_name(target->dtype));
        return NULL;
    }
    if (!reduction_ok(op, reduction)) return NULL;
    int nd = 0;
    int64_t shape[FM_MAX_DIMS];
    if (!broadcast_shape(op, input, target, &nd, shape)) return NULL;
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *xe = fm_expand(input, nd, shape), *te = fm_expand(target, nd, shape), *loss = NULL;
    fm_set_grad_enabled(prev);
    if (!xe || !te) goto fail;
    loss = reduction == FM_REDUCE_NONE ? fm_tensor_empty(nd, shape, input->dtype, fm_tensor_device(input))
                                       : fm_tensor_empty(0, NULL, input->dtype, fm_tensor_device(input));
    if (!loss) goto fail;
    fm_mse_attrs at = {reduction};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_MSE_LOSS;
    call.n_in = 2;
    call.n_out = 1;
    call.in[0] = xe;
    call.in[1] = te;
    call.out[0] = loss;
    call.attrs = &at;
    if (fm_dispatch(&call) != FM_OK) goto fail;
    fm_node *n = fm_node_begin(FM_OP_MSE_LOSS, 2, (fm_tensor *[]){input, target}, mse_backward);
    if (n) {
        fm_node_save(n, 0, input);
        fm_node_save(n, 1, target);
        fm_node_save(n, 2, xe);
        fm_node_save(n, 3, te);
        FM_NODE_SET_ATTRS(n, at);
        fm_node_finish(n, 1, &loss);
    }
    fm_tensor_release(xe);
    fm_tensor_release(te);
    return loss;
fail:
    fm_tensor_release(xe);
    fm_tensor_release(te);
    fm_tensor_release(loss);
    return NULL;
}
