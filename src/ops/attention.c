/* Front end of scaled-dot-product attention: validation, dispatch, autograd.
 *
 * q [B,H,Tq,D], k and v [B,Hkv,Tk,D] with Hkv dividing H (grouped-query
 * attention: query head h attends with kv head h / (H/Hkv)). causal masks key j
 * for query i when j > i, aligned top-left like PyTorch's is_causal (so with
 * Tq != Tk the last queries do not see the last keys). scale <= 0 means
 * 1/sqrt(D). The kernel also returns the per-row logsumexp (f32), which the
 * backward kernel uses to recompute probabilities tile by tile instead of
 * keeping any Tq x Tk matrix alive between forward and backward. */
#include <math.h>
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "backend/kernel.h"  /* fm_sdpa_attrs */
#include "amp/autocast.h"   /* the precision policy (ops.def: attention in low precision) */
#include "ops/ops_internal.h" /* fm_scaled_dot_product_attention_mixed */

static const char *shp(const fm_tensor *t, char *buf, size_t n) { return fm_shape_str(t->ndim, t->shape, buf, n); }

static fm_status sdpa_check(const char *op, const fm_tensor *q, const fm_tensor *k, const fm_tensor *v) {
    char a[128], b[128], c[128];
    if (!q || !k || !v) return fm_set_error(FM_ERR_INVALID, "%s: q, k and v must not be NULL", op);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return fm_set_error(FM_ERR_INVALID, "%s: q, k, v must be 4-D [B, H, T, D], got q %s, k %s, v %s", op,
                            shp(q, a, sizeof a), shp(k, b, sizeof b), shp(v, c, sizeof c));
    if (q->dtype != k->dtype || q->dtype != v->dtype)
        return fm_set_error(FM_ERR_INVALID, "%s: dtype mismatch: q %s, k %s, v %s", op, fm_dtype_name(q->dtype),
                            fm_dtype_name(k->dtype), fm_dtype_name(v->dtype));
    if (!fm_dtype_is_float(q->dtype))
        return fm_set_error(FM_ERR_INVALID, "%s: needs floating-point inputs, got %s", op, fm_dtype_name(q->dtype));
    if (!fm_device_eq(fm_tensor_device(q), fm_tensor_device(k)) || !fm_device_eq(fm_tensor_device(q), fm_tensor_device(v)))
        return fm_set_error(FM_ERR_INVALID, "%s: q, k and v must be on the same device", op);
    if (memcmp(k->shape, v->shape, sizeof(int64_t) * 4) != 0)
        return fm_set_error(FM_ERR_INVALID, "%s: k shape %s does not match v shape %s", op, shp(k, a, sizeof a),
                            shp(v, b, sizeof b));
    if (q->shape[0] != k->shape[0])
        return fm_set_error(FM_ERR_INVALID, "%s: batch size of q %s does not match k %s", op, shp(q, a, sizeof a),
                            shp(k, b, sizeof b));
    if (q->shape[3] != k->shape[3])
        return fm_set_error(FM_ERR_INVALID, "%s: head dim D of q %s does not match k %s", op, shp(q, a, sizeof a),
                            shp(k, b, sizeof b));
    if (k->shape[1] <= 0 || q->shape[1] % k->shape[1] != 0)
        return fm_set_error(FM_ERR_INVALID,
                            "%s: kv heads (%lld in k %s) must divide query heads (%lld in q %s)", op,
                            (long long)k->shape[1], shp(k, a, sizeof a), (long long)q->shape[1], shp(q, b, sizeof b));
    if (k->shape[2] <= 0 || q->shape[3] <= 0)
        return fm_set_error(FM_ERR_INVALID, "%s: key length and head dim must be positive, got q %s, k %s", op,
                            shp(q, a, sizeof a), shp(k, b, sizeof b));
    return FM_OK;
}

static fm_status sdpa_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
    fm_tensor *g[3] = {NULL, NULL, NULL};
    fm_tensor *src[3] = {q, k, v};
    if (!grad_out[0]) { /* nothing reached the output: all input gradients are zero */
        for (int i = 0; i < 3; i++) {
            if (!fm_node_needs_grad(n, i)) continue;
            grad_in[i] = fm_tensor_zeros(src[i]->ndim, src[i]->shape, src[i]->dtype, fm_tensor_device(src[i]));
            if (!grad_in[i]) return fm_last_status();
        }
        return FM_OK;
    }
    for (int i = 0; i < 3; i++) {
        g[i] = fm_tensor_empty(src[i]->ndim, src[i]->shape, src[i]->dtype, fm_tensor_device(src[i]));
        if (!g[i]) {
            fm_tensor_release_n(3, g[0], g[1], g[2]);
            return fm_last_status();
        }
    }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_SDPA_BACKWARD;
    call.n_in = 6;
    call.n_out = 3;
    call.in[0] = grad_out[0]; call.in[1] = q; call.in[2] = k; call.in[3] = v; call.in[4] = o; call.in[5] = lse;
    for (int i = 0; i < 3; i++) call.out[i] = g[i];
    call.attrs = FM_NODE_ATTRS(n, fm_sdpa_attrs);
    fm_status st = fm_dispatch(&call);
    if (st != FM_OK) {
        fm_tensor_release_n(3, g[0], g[1], g[2]);
        return st;
    }
    for (int i = 0; i < 3; i++) {
        if (fm_node_needs_grad(n, i)) grad_in[i] = g[i];
        else fm_tensor_release(g[i]);
    }
    return FM_OK;
}

/* op(q, k, v[, mask]) into out (and lse, when not NULL) */
static fm_status dispatch_qkv(fm_op_id op, fm_tensor *q, fm_tensor *k, fm_tensor *v, fm_tensor *mask, fm_tensor *out, fm_tensor *lse,
                              const fm_sdpa_attrs *attrs) {
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = op;
    call.n_in = mask ? 4 : 3;
    call.n_out = lse ? 2 : 1;
    call.in[0] = q; call.in[1] = k; call.in[2] = v; call.in[3] = mask;
    call.out[0] = out; call.out[1] = lse;
    call.attrs = attrs;
    return fm_dispatch(&call);
}

static fm_tensor *sdpa_impl(fm_tensor *q, fm_tensor *k, fm_tensor *v, bool causal, double scale, int lowp) {
    fm_tensor *c[3];
    int ac = fm_autocast_inputs(FM_OP_SDPA, 3, (fm_tensor *[]){q, k, v}, c);
    if (ac) { /* low-precision storage, f32 math in the kernels */
        fm_tensor *y = ac > 0 ? fm_scaled_dot_product_attention(c[0], c[1], c[2], causal, scale) : NULL;
        fm_tensor_release_n(3, c[0], c[1], c[2]);
        return y;
    }
    if (sdpa_check("scaled_dot_product_attention", q, k, v) != FM_OK) return NULL;
    if (!(scale > 0) || !isfinite(scale)) scale = 1.0 / sqrt((double)q->shape[3]);
    fm_sdpa_attrs attrs = {causal ? 1 : 0, scale, q->dtype == FM_F32 ? lowp : FM_F32};
    fm_device dev = fm_tensor_device(q);
    fm_tensor *out = fm_tensor_empty(4, q->shape, q->dtype, dev);
    fm_tensor *lse = fm_tensor_empty(3, q->shape, FM_F32, dev);
    if (!out || !lse) {
        fm_tensor_release_n(2, out, lse);
        return NULL;
    }
    if (dispatch_qkv(FM_OP_SDPA, q, k, v, NULL, out, lse, &attrs) != FM_OK) {
        fm_tensor_release_n(2, out, lse);
        return NULL;
    }
    fm_node *n = fm_node_begin(FM_OP_SDPA, 3, (fm_tensor *[]){q, k, v}, sdpa_backward);
    if (n) {
        fm_node_save(n, 0, q);
        fm_node_save(n, 1, k);
        fm_node_save(n, 2, v);
        fm_node_save(n, 3, out);
        fm_node_save(n, 4, lse);
        FM_NODE_SET_ATTRS(n, attrs);
        fm_node_finish(n, 1, &out);
    }
    fm_tensor_release(lse);
    return out;
}

fm_tensor *fm_scaled_dot_product_attention(fm_tensor *q, fm_tensor *k, fm_tensor *v, bool causal, double scale) {
    return sdpa_impl(q, k, v, causal, scale, FM_F32);
}

fm_tensor *fm_scaled_dot_product_attention_mixed(fm_tensor *q, fm_tensor *k, fm_tensor *v, bool causal, double scale,
                                                 fm_dtype lowp) {
    return sdpa_impl(q, k, v, causal, scale, lowp == FM_BF16 ? FM_BF16 : FM_F32);
}

fm_tensor *fm_sdpa_mask(fm_tensor *q, fm_tensor *k, fm_tensor *v, fm_tensor *mask, double scale) {
    const char *op = "sdpa_mask";
    char a[128], b[128];
    if (sdpa_check(op, q, k, v) != FM_OK) return NULL;
    if (!mask || mask->dtype != q->dtype || mask->ndim > 4 || !fm_device_eq(fm_tensor_device(mask), fm_tensor_device(q))) {
        fm_set_error(FM_ERR_INVALID, "%s: the mask must be a tensor of q's dtype (%s) and device, of at most 4 dims%s%s", op,
                     fm_dtype_name(q->dtype), mask ? ", got " : "", mask ? fm_dtype_name(mask->dtype) : " (got NULL)");
        return NULL;
    }
    const int64_t full[4] = {q->shape[0], q->shape[1], q->shape[2], k->shape[2]};
    for (int d = 0; d < mask->ndim; d++) {
        const int64_t m = mask->shape[d], f = full[4 - mask->ndim + d];
        if (m != 1 && m != f) {
            fm_set_error(FM_ERR_INVALID, "%s: mask %s does not broadcast to the scores [B, H, Tq, Tk] = %s", op, shp(mask, a, sizeof a),
                         fm_shape_str(4, full, b, sizeof b));
            return NULL;
        }
    }
    if (q->dtype != FM_F32 && q->dtype != FM_F64) {
        fm_set_error(FM_ERR_INVALID, "%s: needs f32 or f64, got %s", op, fm_dtype_name(q->dtype));
        return NULL;
    }
    fm_sdpa_attrs attrs = {0, scale > 0 && isfinite(scale) ? scale : 1.0 / sqrt((double)q->shape[3]), FM_F32};
    fm_tensor *out = fm_tensor_empty(4, q->shape, q->dtype, fm_tensor_device(q));
    if (!out) return NULL;
    if (dispatch_qkv(FM_OP_SDPA_MASK, q, k, v, mask, out, NULL, &attrs) != FM_OK) {
        fm_tensor_release(out);
        return NULL;
    }
    return out;
}

fm_tensor *fm_sdpa_kv16(fm_tensor *q, fm_tensor *k, fm_tensor *v, double scale) {
    const char *op = "sdpa_kv16";
    char a[128], b[128];
    if (!q || !k || !v) { fm_set_error(FM_ERR_INVALID, "%s: q, k and v must not be NULL", op); return NULL; }
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        fm_set_error(FM_ERR_INVALID, "%s: q, k, v must be 4-D [B, H, T, D] and [B, Hkv, L, D], got q %s, k %s", op, shp(q, a, sizeof a),
                     shp(k, b, sizeof b));
        return NULL;
    }
    if (q->dtype != FM_F32 || k->dtype != FM_F16 || v->dtype != FM_F16) {
        fm_set_error(FM_ERR_INVALID, "%s: needs q f32 and k, v f16 (a half-precision KV cache), got q %s, k %s, v %s", op, fm_dtype_name(q->dtype),
                     fm_dtype_name(k->dtype), fm_dtype_name(v->dtype));
        return NULL;
    }
    if (!fm_device_eq(fm_tensor_device(q), fm_tensor_device(k)) || !fm_device_eq(fm_tensor_device(q), fm_tensor_device(v))) {
        fm_set_error(FM_ERR_INVALID, "%s: q, k and v must be on the same device", op);
        return NULL;
    }
    if (memcmp(k->shape, v->shape, sizeof(int64_t) * 4) != 0 || q->shape[0] != k->shape[0] || q->shape[3] != k->shape[3] || k->shape[1] <= 0 ||
        q->shape[1] % k->shape[1] != 0 || k->shape[2] < q->shape[2] || q->shape[2] < 1) {
        fm_set_error(FM_ERR_INVALID,
                     "%s: q %s and k %s (v alike) must share batch and head size, kv heads must divide query heads, and the cache must hold "
                     "at least the %lld query rows (its last rows are theirs)",
                     op, shp(q, a, sizeof a), shp(k, b, sizeof b), (long long)q->shape[2]);
        return NULL;
    }
    fm_sdpa_attrs attrs = {0, scale > 0 && isfinite(scale) ? scale : 1.0 / sqrt((double)q->shape[3]), FM_F32};
    fm_tensor *out = fm_tensor_empty(4, q->shape, FM_F32, fm_tensor_device(q));
    if (!out) return NULL;
    if (dispatch_qkv(FM_OP_SDPA_KV16, q, k, v, NULL, out, NULL, &attrs) != FM_OK) {
        fm_tensor_release(out);
        return NULL;
    }
    return out;
}
