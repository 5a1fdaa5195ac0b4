/* Front end of batch_norm (train and eval; NCHW-style [N, C, ...] or channels-last).
 *
 * Follows PyTorch: training normalizes with the batch mean and the biased
 * variance, and updates the running stats in place as
 *     running = (1 - momentum) * running + momentum * batch_stat
 * with the UNBIASED variance (n / (n - 1)); eval normalizes with the running
 * stats. The kernel does the update (the front end never touches data), so
 * running stats must be contiguous. The forward keeps per-channel mean and
 * 1/sqrt(var + eps) so the backward does not recompute statistics. */
#include <math.h>
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_bn_attrs */
#include "amp/autocast.h"   /* the precision policy (ops.def: batch norm in f32) */

typedef struct bn_node_attrs {
    fm_bn_attrs a;
    int slot_w, slot_b; /* node input index of weight / bias, -1 when absent */
    int has_w;
} bn_node_attrs;

static fm_status batch_norm_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    const bn_node_attrs *na = FM_NODE_ATTRS(n, bn_node_attrs);
    fm_tensor *x = n->saved[0], *smean = n->saved[1], *srstd = n->saved[2], *w = na->has_w ? n->saved[3] : NULL;
    int slot[3] = {0, na->slot_w, na->slot_b};
    bool need[3];
    for (int i = 0; i < 3; i++) need[i] = slot[i] >= 0 && fm_node_needs_grad(n, slot[i]);
    int64_t C = smean->shape[0];
    fm_op_call call;
    memset(&call, 0, sizeof call);
    for (int i = 0; i < 3; i++) {
        if (!need[i]) continue;
        int nd = i == 0 ? x->ndim : 1;
        const int64_t *shape = i == 0 ? x->shape : &C;
        call.out[i] = grad_out[0] ? fm_tensor_empty(nd, shape, x->dtype, fm_tensor_device(x))
                                  : fm_tensor_zeros(nd, shape, x->dtype, fm_tensor_device(x));
        if (!call.out[i]) {
            for (int k = 0; k < i; k++) fm_tensor_release(call.out[k]);
            return fm_last_status();
        }
    }
    fm_status st = FM_OK;
    if (grad_out[0]) {
        call.op = FM_OP_BATCH_NORM_BACKWARD;
        call.n_in = 5;
        call.n_out = 3;
        call.in[0] = grad_out[0];
        call.in[1] = x;
        call.in[2] = w;
        call.in[3] = smean;
        call.in[4] = srstd;
        call.attrs = &na->a;
        st = fm_dispatch(&call);
    }
    for (int i = 0; i < 3; i++) {
        if (st == FM_OK && need[i]) grad_in[slot[i]] = call.out[i];
        else fm_tensor_release(call.out[i]);
    }
    return st;
}

/* A per-channel parameter: NULL or a 1-D [C] tensor like x. */
static fm_status check_param(const char *what, const fm_tensor *t, const fm_tensor *x, int64_t C, bool contiguous) {
    char s1[96], s2[96];
    if (!t) return FM_OK;
    if (t->ndim != 1 || t->shape[0] != C)
        return fm_set_error(FM_ERR_INVALID, "batch_norm: %s shape %s does not match the %lld channels of input %s", what,
                            fm_shape_str(t->ndim, t->shape, s1, sizeof s1), (long long)C,
                            fm_shape_str(x->ndim, x->shape, s2, sizeof s2));
    if (t->dtype != x->dtype)
        return fm_set_error(FM_ERR_INVALID, "batch_norm: %s dtype %s does not match input dtype %s", what,
                            fm_dtype_name(t->dtype), fm_dtype_name(x->dtype));
    if (!fm_device_eq(fm_tensor_device(t), fm_tensor_device(x)))
        return fm_set_error(FM_ERR_INVALID, "batch_norm: %s is on a different device than the input", what);
    if (contiguous && !fm_tensor_is_contiguous(t))
        return fm_set_error(FM_ERR_INVALID, "batch_norm: %s must be contiguous (it is updated in place)", what);
    return FM_OK;
}

fm_tensor *fm_batch_norm(fm_tensor *x, fm_tensor *weight, fm_tensor *bias, fm_tensor *running_mean,
                         fm_tensor *running_var, bool training, double momentum, double eps, fm_layout layout) {
    char s1[96];
    if (!x) { fm_set_error(FM_ERR_INVALID, "batch_norm: input is NULL"); return NULL; }
    /* autocast runs batch norm in f32 (ops.def), as the other norms: a bf16/fp16 conv output
     * meets f32 parameters here. The running statistics are updated in place, so they are
     * never cast (they stay the f32 buffers the module owns). */
    fm_tensor *c[3];
    int ac = fm_autocast_inputs(FM_OP_BATCH_NORM, 3, (fm_tensor *[]){x, weight, bias}, c);
    if (ac) {
        fm_tensor *y = ac > 0 ? fm_batch_norm(c[0], c[1], c[2], running_mean, running_var, training, momentum, eps, layout)
                              : NULL;
        fm_tensor_release_n(3, c[0], c[1], c[2]);
        return y;
    }
    if (layout != FM_NCHW && layout != FM_NHWC) {
        fm_set_error(FM_ERR_INVALID, "batch_norm: unknown layout %d (use FM_NCHW or FM_NHWC)", (int)layout);
        return NULL;
    }
    if (x->ndim < 2) {
        fm_set_error(FM_ERR_INVALID, "batch_norm: input must have at least 2 dims (N, C, ...), got %s",
                     fm_shape_str(x->ndim, x->shape, s1, sizeof s1));
        return NULL;
    }
    if (!fm_dtype_is_float(x->dtype)) {
        fm_set_error(FM_ERR_INVALID, "batch_norm: needs a floating-point input, got %s", fm_dtype_name(x->dtype));
        return NULL;
    }
    if (!(eps >= 0) || !isfinite(momentum)) {
        fm_set_error(FM_ERR_INVALID, "batch_norm: eps %g must be >= 0 and momentum %g finite", eps, momentum);
        return NULL;
    }
    int64_t C = layout == FM_NHWC ? x->shape[x->ndim - 1] : x->shape[1];
    if (check_param("weight", weight, x, C, false) || check_param("bias", bias, x, C, false) ||
        check_param("running_mean", running_mean, x, C, true) || check_param("running_var", running_var, x, C, true))
        return NULL;
    if (!training && (!running_mean || !running_var)) {
        fm_set_error(FM_ERR_INVALID, "batch_norm: eval mode needs running_mean and running_var");
        return NULL;
    }
    int64_t per_channel = C ? fm_tensor_numel(x) / C : 0;
    if (training && per_channel <= 1) {
        fm_set_error(FM_ERR_INVALID, "batch_norm: expected more than 1 value per channel when training, got input %s",
                     fm_shape_str(x->ndim, x->shape, s1, sizeof s1));
        return NULL;
    }
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, x->dtype, fm_tensor_device(x));
    fm_tensor *smean = fm_tensor_empty(1, &C, x->dtype, fm_tensor_device(x));
    fm_tensor *srstd = fm_tensor_empty(1, &C, x->dtype, fm_tensor_device(x));
    if (!y || !smean || !srstd) { fm_tensor_release_n(3, y, smean, srstd); return NULL; }
    bn_node_attrs na;
    memset(&na, 0, sizeof na);
    na.a.training = training;
    na.a.momentum = momentum;
    na.a.eps = eps;
    na.a.layout = layout;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_BATCH_NORM;
    call.n_in = 5;
    call.n_out = 3;
    call.in[0] = x;
    call.in[1] = weight;
    call.in[2] = bias;
    call.in[3] = running_mean;
    call.in[4] = running_var;
    call.out[0] = y;
    call.out[1] = smean;
    call.out[2] = srstd;
    call.attrs = &na.a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release_n(3, y, smean, srstd); return NULL; }
    fm_tensor *ins[3];
    int nin = 0;
    ins[nin++] = x;
    na.slot_w = weight ? nin : -1;
    if (weight) ins[nin++] = weight;
    na.slot_b = bias ? nin : -1;
    if (bias) ins[nin++] = bias;
    fm_node *n = fm_node_begin(FM_OP_BATCH_NORM, nin, ins, batch_norm_backward);
    if (n) {
        na.has_w = weight != NULL;
        fm_node_save(n, 0, x);
        fm_node_save(n, 1, smean);
        fm_node_save(n, 2, srstd);
        if (weight) fm_node_save(n, 3, weight);
        FM_NODE_SET_ATTRS(n, na);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release_n(2, smean, srstd);
    return y;
}
