/* Front ends of fused transformer helpers: validation, dispatch, autograd.
 *
 * qkv_split_heads exists because the unfused route (narrow the fused QKV
 * projection three ways, transpose to [B,H,T,D], let attention make each
 * contiguous) costs three strided gathers forward and, backward, three
 * zero-padded full-width gradients that are then summed. One pass each way
 * replaces all of that.
 *
 * bias_gelu_tanh and add_layer_norm remove whole passes over activations that
 * the unfused route makes: the linear's separate bias add (and, backward, a
 * second read of the GELU gradient for the bias sum), and the residual add
 * (and, backward, the add of the norm's input gradient to the residual's). */
#include <math.h>
#include <string.h>

#include "autograd/node.h" /* recording the backward */
#include "dispatch/dispatch.h"  /* fm_dispatch */
#include "amp/autocast.h"   /* the composed path casts as attention does */
#include "backend/kernel.h"  /* fm_qkv_split_attrs, fm_norm_attrs */
#include "ops/ops_internal.h" /* fm_sdpa_qkv_mixed */

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

/* ---- rope ---- */

static fm_tensor *rope_call(fm_tensor *x, fm_tensor *cs, fm_tensor *sn, int inverse) {
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, x->dtype, fm_tensor_device(x));
    fm_rope_attrs a = {inverse};
    fm_op_call call = {.op = FM_OP_ROPE, .n_in = 3, .n_out = 1, .in = {x, cs, sn}, .out = {y}, .attrs = &a};
    if (y && fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}

/* y is linear in x: dx is the transposed rotation of dy (the kernel's inverse) */
static fm_status rope_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    if (!fm_node_needs_grad(n, 0) || !grad_out[0]) return FM_OK;
    return (grad_in[0] = rope_call(grad_out[0], n->saved[0], n->saved[1], 1)) ? FM_OK : fm_last_status();
}

fm_tensor *fm_rope(fm_tensor *x, fm_tensor *cs, fm_tensor *sn) {
    char s1[96], s2[96], s3[96];
    if (!x || !cs || !sn) { fm_set_error(FM_ERR_INVALID, "rope: %s is NULL", !x ? "x" : !cs ? "cos" : "sin"); return NULL; }
    if (!fm_dtype_is_float(x->dtype) || cs->dtype != x->dtype || sn->dtype != x->dtype) {
        fm_set_error(FM_ERR_INVALID, "rope: x, cos and sin must share one floating-point dtype, got %s, %s, %s", fm_dtype_name(x->dtype),
                     fm_dtype_name(cs->dtype), fm_dtype_name(sn->dtype));
        return NULL;
    }
    const int64_t T = x->ndim >= 2 ? x->shape[x->ndim - 2] : -1, D = x->ndim >= 2 ? x->shape[x->ndim - 1] : -1;
    bool ok = x->ndim >= 2 && D > 0 && D % 2 == 0;
    for (int k = 0; k < 2; k++) {
        const fm_tensor *t = k ? sn : cs;
        ok = ok && t->ndim == 2 && t->shape[0] == T && t->shape[1] == D;
    }
    if (!ok) {
        fm_set_error(FM_ERR_INVALID, "rope: x %s needs [..., T, D] with D even, and cos %s and sin %s [T, D]", fm_shape_str(x->ndim, x->shape, s1, sizeof s1),
                     fm_shape_str(cs->ndim, cs->shape, s2, sizeof s2), fm_shape_str(sn->ndim, sn->shape, s3, sizeof s3));
        return NULL;
    }
    if (!fm_device_eq(fm_tensor_device(x), fm_tensor_device(cs)) || !fm_device_eq(fm_tensor_device(x), fm_tensor_device(sn))) {
        fm_set_error(FM_ERR_INVALID, "rope: x, cos and sin are not on one device");
        return NULL;
    }
    fm_tensor *y = rope_call(x, cs, sn, 0);
    fm_node *n = y ? fm_node_begin(FM_OP_ROPE, 1, &x, rope_backward) : NULL;
    if (n) {
        fm_node_save(n, 0, cs);
        fm_node_save(n, 1, sn);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

/* qkv [B, T, (n_head + 2*n_kv_head) * D] with D >= 1 */
static fm_status qkv_geometry(const char *op, const fm_tensor *qkv, int n_head, int n_kv_head, fm_qkv_split_attrs *a) {
    char s[128];
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
    *a = (fm_qkv_split_attrs){n_head, n_kv_head, W / parts};
    return FM_OK;
}

fm_status fm_qkv_split_heads(fm_tensor *qkv, int n_head, int n_kv_head, fm_tensor **q, fm_tensor **k, fm_tensor **v) {
    const char *op = "qkv_split_heads";
    if (!q || !k || !v) return fm_set_error(FM_ERR_INVALID, "%s: output pointers must not be NULL", op);
    *q = *k = *v = NULL;
    fm_qkv_split_attrs attrs;
    if (qkv_geometry(op, qkv, n_head, n_kv_head, &attrs)) return fm_last_status();
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
        FM_NODE_SET_ATTRS(n, sv);
        fm_node_finish(n, 3, o);
    }
    *q = o[0];
    *k = o[1];
    *v = o[2];
    return FM_OK;
}

/* ---------------- attention on the fused projection ---------------- */

/* saved = {qkv, y, lse}; the probabilities are recomputed tile by tile backward */
static fm_status sdpa_qkv_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    if (!fm_node_needs_grad(n, 0)) return FM_OK;
    fm_tensor *qkv = n->saved[0], *y = n->saved[1], *lse = n->saved[2];
    fm_device dev = fm_tensor_device(qkv);
    if (!grad_out[0]) { /* nothing reached the output */
        grad_in[0] = fm_tensor_zeros(3, qkv->shape, qkv->dtype, dev);
        return grad_in[0] ? FM_OK : fm_last_status();
    }
    fm_tensor *dqkv = fm_tensor_empty(3, qkv->shape, qkv->dtype, dev);
    if (!dqkv) return fm_last_status();
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_SDPA_QKV_BACKWARD;
    call.n_in = 4;
    call.n_out = 1;
    call.in[0] = grad_out[0]; call.in[1] = qkv; call.in[2] = y; call.in[3] = lse;
    call.out[0] = dqkv;
    call.attrs = FM_NODE_ATTRS(n, fm_sdpa_qkv_attrs);
    fm_status st = fm_dispatch(&call);
    if (st) { fm_tensor_release(dqkv); return st; }
    grad_in[0] = dqkv;
    return FM_OK;
}

/* split, attend, merge: for devices without the fused kernel and for f16/bf16 */
static fm_tensor *sdpa_qkv_composed(fm_tensor *qkv, const fm_qkv_split_attrs *g, bool causal, double scale) {
    fm_tensor *q, *k, *v;
    if (fm_qkv_split_heads(qkv, (int)g->n_head, (int)g->n_kv_head, &q, &k, &v)) return NULL;
    fm_tensor *h = fm_scaled_dot_product_attention(q, k, v, causal, scale);
    fm_tensor_release_n(3, q, k, v);
    fm_tensor *t = h ? fm_transpose(h, 1, 2) : NULL;
    fm_tensor *y = t ? fm_reshape(t, 3, (int64_t[]){qkv->shape[0], qkv->shape[1], g->n_head * g->head_dim}) : NULL;
    fm_tensor_release_n(2, h, t);
    return y;
}

static fm_tensor *sdpa_qkv_impl(fm_tensor *qkv, int n_head, int n_kv_head, bool causal, double scale, int lowp) {
    const char *op = "sdpa_qkv";
    fm_qkv_split_attrs g;
    if (qkv_geometry(op, qkv, n_head, n_kv_head, &g)) return NULL;
    if (!fm_dtype_is_float(qkv->dtype)) {
        fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point qkv, got %s", op, fm_dtype_name(qkv->dtype));
        return NULL;
    }
    if (qkv->shape[1] == 0) {
        fm_set_error(FM_ERR_INVALID, "%s: sequence length must be positive (qkv has T = 0)", op);
        return NULL;
    }
    fm_device dev = fm_tensor_device(qkv);
    const fm_backend *be = fm_backend_get(dev.type);
    if ((qkv->dtype != FM_F32 && qkv->dtype != FM_F64) || fm_autocast_changes(FM_OP_SDPA, 1, &qkv) || !be ||
        !be->kernels[FM_OP_SDPA_QKV] || !be->kernels[FM_OP_SDPA_QKV_BACKWARD])
        return sdpa_qkv_composed(qkv, &g, causal, scale);
    if (!(scale > 0) || !isfinite(scale)) scale = 1.0 / sqrt((double)g.head_dim);
    fm_sdpa_qkv_attrs attrs = {g.n_head, g.n_kv_head, g.head_dim, causal ? 1 : 0, scale, qkv->dtype == FM_F32 ? lowp : FM_F32};
    fm_tensor *src = fm_tensor_is_contiguous(qkv) ? fm_tensor_retain(qkv) : fm_contiguous(qkv);
    if (!src) return NULL;
    const int64_t B = qkv->shape[0], T = qkv->shape[1];
    fm_tensor *y = fm_tensor_empty(3, (int64_t[]){B, T, g.n_head * g.head_dim}, qkv->dtype, dev);
    fm_tensor *lse = fm_tensor_empty(3, (int64_t[]){B, g.n_head, T}, FM_F32, dev);
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_SDPA_QKV;
    call.n_in = 1;
    call.n_out = 2;
    call.in[0] = src;
    call.out[0] = y; call.out[1] = lse;
    call.attrs = &attrs;
    if (!y || !lse || fm_dispatch(&call) != FM_OK) {
        fm_tensor_release_n(3, src, y, lse);
        return NULL;
    }
    fm_node *n = fm_node_begin(FM_OP_SDPA_QKV, 1, &qkv, sdpa_qkv_backward);
    if (n) {
        fm_node_save(n, 0, src);
        fm_node_save(n, 1, y);
        fm_node_save(n, 2, lse);
        FM_NODE_SET_ATTRS(n, attrs);
        fm_node_finish(n, 1, &y);
    }
    fm_tensor_release_n(2, src, lse);
    return y;
}

fm_tensor *fm_sdpa_qkv(fm_tensor *qkv, int n_head, int n_kv_head, bool causal, double scale) {
    return sdpa_qkv_impl(qkv, n_head, n_kv_head, causal, scale, FM_F32);
}

fm_tensor *fm_sdpa_qkv_mixed(fm_tensor *qkv, int n_head, int n_kv_head, bool causal, double scale, fm_dtype lowp) {
    return sdpa_qkv_impl(qkv, n_head, n_kv_head, causal, scale, lowp == FM_BF16 ? FM_BF16 : FM_F32);
}

/* ---------------- bias + GELU (tanh) ---------------- */

static fm_status same_float(const char *op, const char *what, const fm_tensor *t, const fm_tensor *x) {
    if (t->dtype != x->dtype)
        return fm_set_error(FM_ERR_INVALID, "%s: %s dtype %s does not match input dtype %s", op, what,
                            fm_dtype_name(t->dtype), fm_dtype_name(x->dtype));
    if (!fm_device_eq(fm_tensor_device(t), fm_tensor_device(x)))
        return fm_set_error(FM_ERR_INVALID, "%s: %s is on a different device than the input", op, what);
    return FM_OK;
}

/* A [N] vector matching x's last dim (weight, bias) */
static fm_status vec_ok(const char *op, const char *what, const fm_tensor *v, const fm_tensor *x) {
    char a[128], b[128];
    const int64_t N = x->shape[x->ndim - 1];
    if (v->ndim != 1 || v->shape[0] != N)
        return fm_set_error(FM_ERR_INVALID, "%s: %s %s does not match the last dim of input %s (expected [%lld])", op,
                            what, fm_shape_str(v->ndim, v->shape, a, sizeof a),
                            fm_shape_str(x->ndim, x->shape, b, sizeof b), (long long)N);
    return same_float(op, what, v, x);
}

static fm_status float_input(const char *op, const fm_tensor *x) {
    if (x->ndim < 1) return fm_set_error(FM_ERR_INVALID, "%s: input must have at least 1 dimension", op);
    if (!fm_dtype_is_float(x->dtype))
        return fm_set_error(FM_ERR_INVALID, "%s: needs a floating-point input, got %s", op, fm_dtype_name(x->dtype));
    return FM_OK;
}

/* saved = {x, b}: the GELU derivative is taken at x + b, recomputed backward */
static fm_status bias_gelu_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    fm_tensor *x = n->saved[0], *b = n->saved[1];
    bool need_x = fm_node_needs_grad(n, 0), need_b = fm_node_needs_grad(n, 1);
    fm_tensor *dx = fm_tensor_empty(x->ndim, x->shape, x->dtype, fm_tensor_device(x));
    fm_tensor *db = need_b ? fm_tensor_empty(1, b->shape, b->dtype, fm_tensor_device(b)) : NULL;
    if (!dx || (need_b && !db)) { fm_tensor_release_n(2, dx, db); return fm_last_status(); }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_BIAS_GELU_TANH_BACKWARD;
    call.n_in = 3;
    call.in[0] = grad_out[0];
    call.in[1] = x;
    call.in[2] = b;
    call.n_out = 2;
    call.out[0] = dx;
    call.out[1] = db;
    fm_status st = fm_dispatch(&call);
    if (st) { fm_tensor_release_n(2, dx, db); return st; }
    if (need_x) grad_in[0] = dx;
    else fm_tensor_release(dx);
    grad_in[1] = db;
    return FM_OK;
}

fm_tensor *fm_bias_gelu_tanh(fm_tensor *x, fm_tensor *b) {
    const char *op = "bias_gelu_tanh";
    if (!x || !b) { fm_set_error(FM_ERR_INVALID, "%s: %s is NULL", op, x ? "bias" : "input"); return NULL; }
    if (float_input(op, x) || vec_ok(op, "bias", b, x)) return NULL;
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, x->dtype, fm_tensor_device(x));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_BIAS_GELU_TANH;
    call.n_in = 2;
    call.in[0] = x;
    call.in[1] = b;
    call.n_out = 1;
    call.out[0] = y;
    if (fm_dispatch(&call)) { fm_tensor_release(y); return NULL; }
    fm_node *n = fm_node_begin(FM_OP_BIAS_GELU_TANH, 2, (fm_tensor *[]){x, b}, bias_gelu_backward);
    if (n) {
        fm_node_save(n, 0, x);
        fm_node_save(n, 1, b);
        fm_node_finish(n, 1, &y);
    }
    return y;
}

/* ---------------- residual add + layer norm ---------------- */

/* Node attrs: the kernel's, and whether the node's first output is the sum
 * (h given) or the sum is x itself and y is the only output (h NULL). */
typedef struct { fm_norm_attrs na; int has_h; } add_ln_saved;

/* saved = {sum (x when h is NULL), weight|NULL, mean, rstd, bias|NULL} */
static fm_status add_ln_backward(fm_node *n, fm_tensor *const *grad_out, fm_tensor **grad_in) {
    const add_ln_saved *sv = FM_NODE_ATTRS(n, add_ln_saved);
    fm_tensor *s = n->saved[0], *w = n->saved[1], *mean = n->saved[2], *rstd = n->saved[3], *b = n->saved[4];
    fm_device dev = fm_tensor_device(s);
    bool need_w = w && fm_node_needs_grad(n, 2), need_b = b && fm_node_needs_grad(n, 3);
    fm_tensor *g = fm_tensor_empty(s->ndim, s->shape, s->dtype, dev);
    fm_tensor *dw = need_w ? fm_tensor_empty(1, w->shape, w->dtype, dev) : NULL;
    fm_tensor *db = need_b ? fm_tensor_empty(1, b->shape, b->dtype, dev) : NULL;
    if (!g || (need_w && !dw) || (need_b && !db)) { fm_tensor_release_n(3, g, dw, db); return fm_last_status(); }
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_ADD_LAYER_NORM_BACKWARD;
    call.n_in = 6;
    call.in[0] = sv->has_h ? grad_out[1] : grad_out[0]; /* dy */
    call.in[1] = sv->has_h ? grad_out[0] : NULL;        /* dsum */
    call.in[2] = s;
    call.in[3] = w;
    call.in[4] = mean;
    call.in[5] = rstd;
    call.n_out = 3;
    call.out[0] = g;
    call.out[1] = dw;
    call.out[2] = db;
    call.attrs = &sv->na;
    fm_status st = fm_dispatch(&call);
    if (st) { fm_tensor_release_n(3, g, dw, db); return st; }
    /* x and h get the same gradient: the engine only ever adds gradients into new
     * tensors, so one tensor can serve both */
    if (sv->has_h && fm_node_needs_grad(n, 1)) grad_in[1] = fm_tensor_retain(g);
    if (fm_node_needs_grad(n, 0)) grad_in[0] = fm_tensor_retain(g);
    fm_tensor_release(g);
    grad_in[2] = dw;
    grad_in[3] = db;
    return FM_OK;
}

fm_status fm_add_layer_norm(fm_tensor *x, fm_tensor *h, fm_tensor *weight, fm_tensor *bias, double eps,
                            fm_tensor **sum, fm_tensor **y) {
    const char *op = "add_layer_norm";
    char a[128], b[128];
    if (!sum || !y) return fm_set_error(FM_ERR_INVALID, "%s: output pointers must not be NULL", op);
    *sum = *y = NULL;
    if (!x) return fm_set_error(FM_ERR_INVALID, "%s: x is NULL", op);
    fm_status st = float_input(op, x);
    if (st) return st;
    if (h && (h->ndim != x->ndim || memcmp(h->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim)))
        return fm_set_error(FM_ERR_INVALID, "%s: h %s must have the shape of x %s (no broadcasting)", op,
                            fm_shape_str(h->ndim, h->shape, a, sizeof a), fm_shape_str(x->ndim, x->shape, b, sizeof b));
    if (h && (st = same_float(op, "h", h, x))) return st;
    if (weight && (st = vec_ok(op, "weight", weight, x))) return st;
    if (bias && (st = vec_ok(op, "bias", bias, x))) return st;
    if (!(eps >= 0)) return fm_set_error(FM_ERR_INVALID, "%s: eps %g must be >= 0", op, eps);
    const int64_t N = x->shape[x->ndim - 1], M = N ? fm_tensor_numel(x) / N : 0;
    const fm_dtype sdt = x->dtype == FM_F64 ? FM_F64 : FM_F32; /* statistics as layer_norm keeps them */
    fm_device dev = fm_tensor_device(x);
    fm_tensor *o[4];
    o[0] = h ? fm_tensor_empty(x->ndim, x->shape, x->dtype, dev) : fm_tensor_retain(x);
    o[1] = fm_tensor_empty(x->ndim, x->shape, x->dtype, dev);
    o[2] = fm_tensor_empty(1, &M, sdt, dev);
    o[3] = fm_tensor_empty(1, &M, sdt, dev);
    add_ln_saved sv = {{eps}, h != NULL};
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_ADD_LAYER_NORM;
    call.n_in = 4;
    call.in[0] = x;
    call.in[1] = h;
    call.in[2] = weight;
    call.in[3] = bias;
    call.n_out = 4;
    for (int i = 0; i < 4; i++) call.out[i] = o[i];
    if (!h) call.out[0] = NULL; /* the sum is x: nothing to write */
    call.attrs = &sv.na;
    st = o[0] && o[1] && o[2] && o[3] ? fm_dispatch(&call) : fm_last_status();
    if (st) {
        fm_tensor_release_n(4, o[0], o[1], o[2], o[3]);
        return st;
    }
    fm_node *n = fm_node_begin(FM_OP_ADD_LAYER_NORM, 4, (fm_tensor *[]){x, h, weight, bias}, add_ln_backward);
    if (n) {
        fm_node_save(n, 0, o[0]);
        fm_node_save(n, 1, weight);
        fm_node_save(n, 2, o[2]);
        fm_node_save(n, 3, o[3]);
        fm_node_save(n, 4, bias);
        FM_NODE_SET_ATTRS(n, sv);
        if (h) fm_node_finish(n, 2, o);
        else fm_node_finish(n, 1, &o[1]);
    }
    fm_tensor_release_n(2, o[2], o[3]);
    *sum = o[0];
    *y = o[1];
    return FM_OK;
}

/* An RNN cell's operands: s [B, H] (c or h) f32 or f64, xg and hg [B, gates H] of its dtype. */
static fm_status cell_check(const char *op, const fm_tensor *xg, const fm_tensor *hg, const fm_tensor *s, int gates) {
    if (!xg || !hg || !s) return fm_set_error(FM_ERR_INVALID, "%s: NULL input", op);
    if (s->dtype != FM_F32 && s->dtype != FM_F64) return fm_set_error(FM_ERR_INVALID, "%s: needs f32 or f64, got %s", op, fm_dtype_name(s->dtype));
    const int64_t B = s->ndim == 2 ? s->shape[0] : -1, H = s->ndim == 2 ? s->shape[1] : -1;
    for (int i = 0; i < 2; i++) {
        const fm_tensor *g = i ? hg : xg;
        if (g->dtype != s->dtype || g->ndim != 2 || g->shape[0] != B || g->shape[1] != gates * H || B < 0) {
            char a[64], b[64];
            return fm_set_error(FM_ERR_INVALID, "%s: %s is %s %s; with the state %s %s it must be [B, %dH] = [%lld, %lld] of its dtype", op,
                                i ? "hg" : "xg", fm_dtype_name(g->dtype), fm_shape_str(g->ndim, g->shape, a, sizeof a), fm_dtype_name(s->dtype),
                                fm_shape_str(s->ndim, s->shape, b, sizeof b), gates, (long long)B, (long long)(gates * H));
        }
    }
    return FM_OK;
}

/* Runs cell op on (xg, hg, s) into n_out new [B, H] tensors; NULL outputs on an error. */
static fm_status cell_run(fm_op_id op, fm_tensor *xg, fm_tensor *hg, fm_tensor *s, int n_out, fm_tensor **out) {
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = op, call.n_in = 3, call.n_out = n_out, call.in[0] = xg, call.in[1] = hg, call.in[2] = s;
    bool ok = true;
    for (int i = 0; i < n_out; i++) ok &= (call.out[i] = out[i] = ok ? fm_tensor_empty(2, s->shape, s->dtype, fm_tensor_device(s)) : NULL) != NULL;
    if (ok && fm_dispatch(&call) == FM_OK) return FM_OK;
    for (int i = 0; i < n_out; i++) { fm_tensor_release(out[i]); out[i] = NULL; }
    return fm_last_status();
}

fm_tensor *fm_lstm_cell(fm_tensor *xg, fm_tensor *hg, fm_tensor *c, fm_tensor **c_out) {
    if (c_out) *c_out = NULL;
    if (!c_out) { fm_set_error(FM_ERR_INVALID, "lstm_cell: c_out is NULL"); return NULL; }
    fm_tensor *out[2] = {0};
    if (cell_check("lstm_cell", xg, hg, c, 4) || cell_run(FM_OP_LSTM_CELL, xg, hg, c, 2, out)) return NULL;
    *c_out = out[1];
    return out[0];
}

fm_tensor *fm_gru_cell(fm_tensor *xg, fm_tensor *hg, fm_tensor *h) {
    fm_tensor *out[1] = {0};
    if (cell_check("gru_cell", xg, hg, h, 3) || cell_run(FM_OP_GRU_CELL, xg, hg, h, 1, out)) return NULL;
    return out[0];
}

fm_tensor *fm_ew_chain(fm_tensor *x, int n_steps, const fm_ew_step *steps) {
    if (!x) { fm_set_error(FM_ERR_INVALID, "ew_chain: input is NULL"); return NULL; }
    if (x->dtype != FM_F32) { fm_set_error(FM_ERR_INVALID, "ew_chain: needs f32, got %s (run the steps as ops)", fm_dtype_name(x->dtype)); return NULL; }
    if (n_steps < 1 || n_steps > FM_EW_CHAIN_MAX || !steps) {
        fm_set_error(FM_ERR_INVALID, "ew_chain: %d steps (1 to %d)", n_steps, FM_EW_CHAIN_MAX);
        return NULL;
    }
    fm_ew_chain_attrs a = {.n = n_steps};
    for (int i = 0; i < n_steps; i++) {
        if ((int)steps[i].op < 0 || steps[i].op >= FM_EW_OP_COUNT || (steps[i].op == FM_EW_CLAMP && !(steps[i].a <= steps[i].b))) {
            fm_set_error(FM_ERR_INVALID, "ew_chain: step %d is not an elementwise step (op %d; a clamp needs min <= max)", i, (int)steps[i].op);
            return NULL;
        }
        a.steps[i] = steps[i];
    }
    fm_tensor *y = fm_tensor_empty(x->ndim, x->shape, FM_F32, fm_tensor_device(x));
    if (!y) return NULL;
    fm_op_call call;
    memset(&call, 0, sizeof call);
    call.op = FM_OP_EW_CHAIN, call.n_in = 1, call.n_out = 1, call.in[0] = x, call.out[0] = y, call.attrs = &a;
    if (fm_dispatch(&call) != FM_OK) { fm_tensor_release(y); return NULL; }
    return y;
}
