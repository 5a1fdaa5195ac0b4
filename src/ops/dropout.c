/* Front end of inverted dropout: y = x * mask / (1 - p), mask ~ Bernoulli(1 - p).
 *
 * The mask comes from counter-based Philox keyed by the generator's (seed,
 * offset), so it is identical for any thread count and reproducible from a
 * seed. Each call advances the generator past the counters it used (one Philox
 * block per 4 elements, the unit fm_rng.offset counts in rng.c), so
 * consecutive calls draw fresh masks. The u8 mask is saved for the backward,
 * dx = dy * mask / (1 - p). */
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_dropout_attrs */

static fm_status dropout_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *mask = n->saved[0];
    double p = FM_NODE_ATTRS(n, fm_dropout_attrs)->p;
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    fm_dtype dt = n->out_dtype[0];
    if (!grad_out[0]) {
        grad_in[0] = fm_tensor_zeros(mask->ndim, mask->shape, dt, fm_tensor_device(mask));
        return grad_in[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *mf = fm_to_dtype(mask, dt);
    fm_tensor *ms = mf ? fm_mul_scalar(mf, p < 1 ? 1.0 / (1.0 - p) : 0.0) : NULL;
    grad_in[0] = ms ? fm_mul(grad_out[0], ms) : NULL;
    fm_tensor_release(mf);
    fm_tensor_release(ms);
    return grad_in[0] ? FM_OK : fm_last_status();
}

fm_tensor *fm_dropout(fm_tensor *x, double p, bool training, fm_rng *rng) {
    const char *op = "dropout";
    if (!x) { fm_set_error(FM_ERR_INVALID, "%s: input is NULL", op); return NULL; }
    if (!(p >= 0.0 && p <= 1.0)) { fm_set_error(FM_ERR_INVALID, "%s: probability p=%g must be in [0, 1]", op, p); return NULL; }
    if (!fm_dtype_is_float(x->dtype)) {
        fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point input, got %s", op, fm_dtype_name(x->dtype));
        return NULL;
    }
    if (!training || p == 0.0) return fm_tensor_retain(x);
    if (!rng) rng = fm_rng_global();
    int64_t numel = fm_tensor_numel(x);
    fm_dropout_attrs at = {p, rng->seed, rng->offset};
    fm_device dev = fm_tensor_device(x);
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, x->dtype, dev);
    fm_tensor *mask = fm_tensor_empty(x->ndim, x->shape, FM_U8, dev);
    if (!y || !mask) { fm_tensor_release_n(2, y, mask); return NULL; }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_DROPOUT;
    call.n_in = 1;
    call.n_out = 2;
    call.in[0] = x;
    call.out[0] = y;
    call.out[1] = mask;
    call.attrs = &at;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release_n(2, y, mask); return NULL; }
    rng->offset += (uint64_t)((numel + 3) / 4);
    fm_node *n = fm_node_begin(FM_OP_DROPOUT, 1, &x, dropout_backward);
    if (n) {
        fm_node_save(n, 0, mask);
        FM_NODE_SET_ATTRS(n, at);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release(mask);
    return y;
}
