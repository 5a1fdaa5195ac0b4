/* Front ends of fused transformer helpers: validation, dispatch, autograd.
 *
 * qkv_split_heads exists because the unfused route (narrow the fused QKV
 * projection three ways, transpose to [B,H,T,D], let attention make each
 * contiguous) costs three strided gathers forward and, backward, three
 * zero-padded full-width gradients that are then summed. One pass each way
 * replaces all of that. */
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "core/backend.h"  /* fm_dispatch */
#include "ops/op_attrs.h"  /* fm_qkv_split_attrs */

/* Only the geometry is needed backward: no tensor is saved. */
typedef struct { fm_qkv_split_attrs a; int64_t B, T; } split_saved;

static fm_status qkv_split_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    const split_saved *sv = FM_NODE_ATTRS(n, split_saved);
    int64_t shape[3] = {sv->B, sv->T, (sv->a.n_head + 2 * sv->a.n_kv_head) * sv->a.head_dim};
    fm_tensor *dx = fm_tensor_empty(3, shape, n->out_dtype[0], n->out_device[0]);
    if (!dx) return fm_last_status();
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_QKV_SPLIT_HEADS_BACKWARD;
    call.n_in = 3;
    call.n_out = 1;
    for (int i = 0; i < 3; i++) call.in[i] = grad_out[i];
    call.out[0] = dx;
    call.attrs = &sv->a;
    fm_status st = fm_dispatch(&call);
    if (st) { fm_tensor_release(dx); return st; }
    grad_in[0] = dx;
    return FM_OK;
}

fm_status fm_qkv_split_heads(fm_tensor *qkv, int n_head, int n_kv_head, fm_tensor **q, fm_tensor **k, fm_tensor **v) {
    const char *op = "qkv_split_heads";
    char s[128];
    if (!q || !k || !v) return fm_set_error(FM_ERR_INVALID, "%s: output pointers must not be NULL", op);
    *q = *k = *v = NULL;
    if (!qkv) return fm_set_error(FM_ERR_INVALID, "%s: qkv is NULL", op);
    if (qkv->ndim != 3)
        return fm_set_error(FM_ERR_INVALID, "%s: qkv must be 3-D [B, T, (H + 2*KV)*D], got %s", op,
                            fm_shape_str(qkv->ndim, qkv->shape, s, sizeof s));
    if (n_head < 1 || n_kv_head < 1 || n_head % n_kv_head)
        return fm_set_error(FM_ERR_INVALID, "%s: n_kv_head %d must be >= 1 and divide n_head %d", op, n_kv_head, n_head);
    const int64_t W = qkv->shape[2], parts = n_head + 2LL * n_kv_head;
    if (W % parts || W == 0)
        return fm_set_error(FM_ERR_INVALID, "%s: last dim %lld of qkv %s is not a positive multiple of n_head + 2*n_kv_head = %lld",
                            op, (long long)W, fm_shape_str(qkv->ndim, qkv->shape, s, sizeof s), (long long)parts);
    fm_qkv_split_attrs attrs = {n_head, n_kv_head, W / parts};
    const int64_t B = qkv->shape[0], T = qkv->shape[1], D = attrs.head_dim;
    fm_device dev = fm_tensor_device(qkv);
    fm_tensor *o[3];
    o[0] = fm_tensor_empty(4, (int64_t[]){B, n_head, T, D}, qkv->dtype, dev);
    o[1] = fm_tensor_empty(4, (int64_t[]){B, n_kv_head, T, D}, qkv->dtype, dev);
    o[2] = fm_tensor_empty(4, (int64_t[]){B, n_kv_head, T, D}, qkv->dtype, dev);
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_QKV_SPLIT_HEADS;
    call.n_in = 1;
    call.n_out = 3;
    call.in[0] = qkv;
    for (int i = 0; i < 3; i++) call.out[i] = o[i];
    call.attrs = &attrs;
    fm_status st = o[0] && o[1] && o[2] ? fm_dispatch(&call) : fm_last_status();
    if (st) {
        fm_tensor_release_n(3, o[0], o[1], o[2]);
        return st;
    }
    fm_node *n = fm_node_begin(FM_OP_QKV_SPLIT_HEADS, 1, &qkv, qkv_split_backward);
    if (n) {
        split_saved sv = {attrs, B, T};
        memcpy(n->attrs, &sv, sizeof sv);
        fm_node_finish(n, 3, o);
    }
    *q = o[0];
    *k = o[1];
    *v = o[2];
    return FM_OK;
}
