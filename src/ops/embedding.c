/* Front end of embedding lookup: out[..., :] = weight[indices[...], :].
 *
 * The kernel checks every index against the vocabulary size (the front end
 * never reads tensor data, so it stays backend-neutral) and reports the first
 * bad one. The backward is a scatter-add of the output gradient's rows into a
 * zeroed [V, D] gradient, done by EMBEDDING_BACKWARD in a fixed order. */
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */

static fm_status embedding_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *w = n->saved[0], *idx = n->saved[1];
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    if (!grad_out[0]) {
        grad_in[0] = fm_tensor_zeros_like(w);
        return grad_in[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *dw = fm_tensor_empty(w->ndim, w->shape, w->dtype, fm_tensor_device(w));
    if (!dw) return fm_last_status();
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_EMBEDDING_BACKWARD;
    call.n_in = 2;
    call.n_out = 1;
    call.in[0] = grad_out[0];
    call.in[1] = idx;
    call.out[0] = dw;
    fm_status st = fm_dispatch(&call);
    if (st != FM_OK) { fm_tensor_release(dw); return st; }
    grad_in[0] = dw;
    return FM_OK;
}

fm_tensor *fm_embedding(fm_tensor *weight, fm_tensor *indices) {
    const char *op = "embedding";
    char a[128];
    if (!weight || !indices) { fm_set_error(FM_ERR_INVALID, "%s: weight and indices must not be NULL", op); return NULL; }
    if (weight->ndim != 2) {
        fm_set_error(FM_ERR_INVALID, "%s: weight must be 2-D [V, D], got %s", op,
                     fm_shape_str(weight->ndim, weight->shape, a, sizeof a));
        return NULL;
    }
    if (indices->dtype != FM_I64 && indices->dtype != FM_I32) {
        fm_set_error(FM_ERR_INVALID, "%s: indices must be i64 or i32, got %s", op, fm_dtype_name(indices->dtype));
        return NULL;
    }
    if (indices->ndim + 1 > FM_MAX_DIMS) {
        fm_set_error(FM_ERR_INVALID, "%s: indices %s have too many dims (the result would exceed %d)", op,
                     fm_shape_str(indices->ndim, indices->shape, a, sizeof a), FM_MAX_DIMS);
        return NULL;
    }
    if (!fm_device_eq(fm_tensor_device(weight), fm_tensor_device(indices))) {
        fm_set_error(FM_ERR_INVALID, "%s: weight and indices are on different devices", op);
        return NULL;
    }
    int64_t shape[FM_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = weight->shape[1];
    fm_tensor *y = fm_tensor_empty(indices->ndim + 1, shape, weight->dtype, fm_tensor_device(weight));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_EMBEDDING;
    call.n_in = 2;
    call.n_out = 1;
    call.in[0] = weight;
    call.in[1] = indices;
    call.out[0] = y;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    fm_node *n = fm_node_begin(FM_OP_EMBEDDING, 2, (fm_tensor *[]){weight, indices}, embedding_backward);
    if (n) {
        fm_node_save(n, 0, weight);
        fm_node_save(n, 1, indices);
        fm_node_finish(n, 1, &y);
    }
    return y;
}
