/* ONNX Attention (opset 23; 24 adds the nonpad_kv_seqlen input) and RotaryEmbedding (23).
 * Both are made of fathom's ops, so they run on their inputs' device; nothing is read on the
 * host (the causal and padding masks come from index ranges made from the shapes).
 *
 * Attention: Q, K, V are 4-D [batch, heads, seq, head_size] or 3-D [batch, seq, heads *
 * head_size] (split with the q_num_heads / kv_num_heads attributes; Y is merged back). K and
 * V are appended to past_key / past_value (present_key / present_value, in their own types).
 * Scores are (Q sqrt(scale)) (K sqrt(scale))^T, a query head h reading kv head h / (Hq / Hkv)
 * (grouped-query attention, by broadcasting: no repeated copy of K or V); then softcap
 * (c tanh(s / c)); then the bias: attn_mask added (float) or 0 / -inf (bool: true attends),
 * its last dim padded with -inf up to the total length; is_causal's -inf where key j > past + i;
 * nonpad_kv_seqlen's -inf at keys j >= nonpad[b]; then softmax over the keys and the product
 * with V. qk_matmul_output (output 3) is the scores before softcap (mode 0), after it (1),
 * with the bias (2), or the softmax (3), in Q's type. The math is float32 (float64 for float64
 * inputs): float16 and bfloat16 are computed in float32 and rounded at the end, as the CPU's
 * kernels, which the check device runs too, have no low-precision softmax. Without a mask,
 * softcap, qk output or past with is_causal, float32 runs fm_scaled_dot_product_attention.
 *
 * RotaryEmbedding: X [batch, heads, seq, head_size] or [batch, seq, hidden] (num_heads splits
 * it); the first rotary_embedding_dim (0: all) of each head rotate with cos / sin rows
 * (cos_cache[position_ids] or, without position_ids, the caches as [batch, seq, dim / 2]),
 * pairing the two halves or (interleaved) the even and odd elements; the rest pass.
 *
 * onnx_attention_plan and onnx_rope_check give the graph form (onnx_graph_ops.c: t_attention,
 * t_rotary) these checks and sizes, so that both forms accept and refuse the same nodes. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }

static const char *shp(const fm_tensor *t, char *buf, size_t n) { return fm_shape_str(t->ndim, t->shape, buf, n); }

/* t in dtype dt (a new reference; t itself when it already is). */
static fm_tensor *as_dtype(fm_tensor *t, fm_dtype dt) { return !t ? NULL : t->dtype == dt ? fm_tensor_retain(t) : fm_to_dtype(t, dt); }

/* A 0-d tensor of value v, dtype dt, on dev. */
static fm_tensor *scalar_on(double v, fm_dtype dt, fm_device dev) { return fm_tensor_full(0, NULL, v, dt, dev); }

/* A 1-D int64 range [start, start + n) on dev, reshaped to shape (n elements). */
static fm_tensor *range_on(int64_t start, int64_t n, fm_device dev, int nd, const int64_t *shape) {
    fm_tensor *r = fm_tensor_arange((double)start, (double)(start + n), 1, FM_I64);
    fm_tensor *d = r && !fm_device_eq(dev_of(r), dev) ? fm_tensor_to(r, dev) : fm_tensor_retain(r);
    fm_tensor *y = d ? fm_reshape(d, nd, shape) : NULL;
    REL(r, d);
    return y;
}

/* 0 where cond, -inf elsewhere (dtype dt). */
static fm_tensor *bias_of(fm_tensor *cond, fm_dtype dt) {
    fm_tensor *z = scalar_on(0, dt, dev_of(cond)), *ninf = z ? scalar_on(-INFINITY, dt, dev_of(cond)) : NULL;
    fm_tensor *y = ninf ? fm_where(cond, z, ninf) : NULL;
    REL(z, ninf);
    return y;
}

/* ---------------------------------------------------------------- Attention */

typedef struct attn_args {
    fm_tensor *q, *k, *v;     /* 4-D, the inputs' types; k, v are present_key / present_value */
    fm_tensor *mask, *nonpad; /* NULL when not given */
    int64_t b, hq, hkv, sq, skv, past, total, d, dv;
    int64_t q_heads, kv_heads; /* the attributes (0: not given) */
    bool rank3, causal, want_qk;
    double scale, softcap;
    int mode;
    fm_dtype wt, sm_dt; /* the math's type; the softmax's */
} attn_args;

static fm_status attn_attrs(onnx_op_ctx *c, attn_args *a) {
    a->causal = onnx_attr_int(c, "is_causal", 0) != 0;
    a->mode = (int)onnx_attr_int(c, "qk_matmul_output_mode", 0);
    if (a->mode < 0 || a->mode > 3)
        return onnx_node_error(c, FM_ERR_INVALID, "qk_matmul_output_mode must be 0, 1, 2 or 3; got %d", a->mode);
    a->softcap = onnx_attr_float(c, "softcap", 0.0f);
    if (!(a->softcap >= 0) || isinf(a->softcap))
        return onnx_node_error(c, FM_ERR_INVALID, "softcap must be a finite value >= 0 (0: none); got %g", a->softcap);
    a->scale = 0;
    if (onnx_attr(c, "scale")) {
        a->scale = onnx_attr_float(c, "scale", 0.0f);
        if (!(a->scale > 0) || isinf(a->scale))
            return onnx_node_error(c, FM_ERR_INVALID, "scale must be a finite value greater than 0; got %g", a->scale);
    }
    a->q_heads = onnx_attr_int(c, "q_num_heads", 0);
    a->kv_heads = onnx_attr_int(c, "kv_num_heads", 0);
    if (a->q_heads < 0 || a->kv_heads < 0)
        return onnx_node_error(c, FM_ERR_INVALID, "q_num_heads and kv_num_heads must be positive; got %" PRId64 " and %" PRId64,
                               a->q_heads, a->kv_heads);
    const Onnx__AttributeProto *sp = onnx_attr(c, "softmax_precision");
    a->sm_dt = a->wt;
    if (sp) {
        int64_t p = sp->i;
        if (p == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE) a->sm_dt = FM_F64;
        else if (p == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || p == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
                 p == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16)
            a->sm_dt = FM_F32; /* float16 / bfloat16 requested: computed more precisely */
        else
            return onnx_node_error(c, FM_ERR_INVALID,
                                   "softmax_precision must be a float type (1 float, 10 float16, 11 double, 16 bfloat16); got %" PRId64, p);
    }
    return FM_OK;
}

/* Q, K and V's ranks and types; the math's type. */
static fm_status attn_check_types(onnx_op_ctx *c, attn_args *a) {
    fm_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    char s1[96], s2[96], s3[96];
    if (q->ndim != k->ndim || q->ndim != v->ndim || (q->ndim != 3 && q->ndim != 4))
        return onnx_node_error(c, FM_ERR_INVALID,
                               "Q, K and V must all be 4-D [batch, heads, seq, head_size] or all 3-D [batch, seq, hidden]; "
                               "got Q %s, K %s, V %s", shp(q, s1, sizeof s1), shp(k, s2, sizeof s2), shp(v, s3, sizeof s3));
    if (!fm_dtype_is_float(q->dtype) || !fm_dtype_is_float(v->dtype))
        return onnx_node_error(c, FM_ERR_INVALID, "Q and V must be float tensors; got %s and %s", fm_dtype_name(q->dtype),
                               fm_dtype_name(v->dtype));
    if (k->dtype != q->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "K is %s; it must be Q's type, %s", fm_dtype_name(k->dtype), fm_dtype_name(q->dtype));
    a->rank3 = q->ndim == 3;
    a->wt = q->dtype == FM_F64 || v->dtype == FM_F64 ? FM_F64 : FM_F32;
    return FM_OK;
}

/* A 3-D x [B, S, heads * D] as 4-D [B, heads, S, D]; `what` names it in errors. */
static fm_tensor *split_heads(onnx_op_ctx *c, fm_tensor *x, int64_t heads, const char *what, const char *attr) {
    char s1[96];
    if (heads <= 0) {
        onnx_node_error(c, FM_ERR_INVALID, "3-D inputs need the q_num_heads and kv_num_heads attributes (%s is missing)", attr);
        return NULL;
    }
    if (x->shape[2] % heads) {
        onnx_node_error(c, FM_ERR_INVALID, "%s %s: its hidden size %" PRId64 " is not a multiple of %s = %" PRId64, what,
                        shp(x, s1, sizeof s1), x->shape[2], attr, heads);
        return NULL;
    }
    int64_t sh[4] = {x->shape[0], x->shape[1], heads, x->shape[2] / heads};
    fm_tensor *r = fm_reshape(x, 4, sh), *y = r ? fm_permute(r, (const int[]){0, 2, 1, 3}) : NULL;
    fm_tensor_release(r);
    return y;
}

/* Q, K, V as 4-D (a->q, k, v: new references) with their heads and sizes checked. */
static fm_status attn_heads(onnx_op_ctx *c, attn_args *a) {
    if (a->rank3) {
        a->q = split_heads(c, c->in[0], a->q_heads, "Q", "q_num_heads");
        a->k = a->q ? split_heads(c, c->in[1], a->kv_heads, "K", "kv_num_heads") : NULL;
        a->v = a->k ? split_heads(c, c->in[2], a->kv_heads, "V", "kv_num_heads") : NULL;
        if (!a->v) return fm_last_status();
    } else {
        a->q = fm_tensor_retain(c->in[0]);
        a->k = fm_tensor_retain(c->in[1]);
        a->v = fm_tensor_retain(c->in[2]);
        if (a->q_heads && a->q_heads != a->q->shape[1])
            return onnx_node_error(c, FM_ERR_INVALID, "q_num_heads = %" PRId64 " but Q has %" PRId64 " heads (dim 1 of 4-D Q)",
                                   a->q_heads, a->q->shape[1]);
        if (a->kv_heads && a->kv_heads != a->k->shape[1])
            return onnx_node_error(c, FM_ERR_INVALID, "kv_num_heads = %" PRId64 " but K has %" PRId64 " heads (dim 1 of 4-D K)",
                                   a->kv_heads, a->k->shape[1]);
    }
    const fm_tensor *q = a->q, *k = a->k, *v = a->v;
    char s1[96], s2[96], s3[96];
    a->b = q->shape[0], a->hq = q->shape[1], a->sq = q->shape[2], a->d = q->shape[3];
    a->hkv = k->shape[1], a->skv = k->shape[2], a->dv = v->shape[3];
    if (k->shape[0] != a->b || v->shape[0] != a->b || v->shape[1] != a->hkv || v->shape[2] != a->skv)
        return onnx_node_error(c, FM_ERR_INVALID,
                               "Q %s, K %s and V %s (as [batch, heads, seq, head_size]) must have one batch size, and K and V "
                               "the same heads and sequence length", shp(q, s1, sizeof s1), shp(k, s2, sizeof s2), shp(v, s3, sizeof s3));
    if (k->shape[3] != a->d)
        return onnx_node_error(c, FM_ERR_INVALID, "K's head size %" PRId64 " differs from Q's %" PRId64 " (Q %s, K %s as "
                               "[batch, heads, seq, head_size])", k->shape[3], a->d, shp(q, s1, sizeof s1), shp(k, s2, sizeof s2));
    if (a->hkv <= 0 || a->hq % a->hkv)
        return onnx_node_error(c, FM_ERR_INVALID, "Q's %" PRId64 " heads (q_num_heads) must be a multiple of K and V's %" PRId64
                               " heads (kv_num_heads)", a->hq, a->hkv);
    return FM_OK;
}

/* past_key / past_value appended: a->k, a->v become present_key / present_value. */
static fm_status attn_past(onnx_op_ctx *c, attn_args *a) {
    fm_tensor *pk = c->n_in > 4 ? c->in[4] : NULL, *pv = c->n_in > 5 ? c->in[5] : NULL;
    char s1[96], s2[96];
    a->past = 0;
    if (!pk && !pv) return FM_OK;
    if (!pk || !pv) return onnx_node_error(c, FM_ERR_INVALID, "past_key and past_value must be given together (only %s is)", pk ? "past_key" : "past_value");
    if (pk->ndim != 4 || pv->ndim != 4 || pk->shape[0] != a->b || pk->shape[1] != a->hkv || pk->shape[3] != a->d ||
        pv->shape[0] != a->b || pv->shape[1] != a->hkv || pv->shape[3] != a->dv || pv->shape[2] != pk->shape[2])
        return onnx_node_error(c, FM_ERR_INVALID,
                               "past_key %s and past_value %s must be [batch, kv_num_heads, past_seq, head_size] = [%" PRId64 ", %" PRId64
                               ", P, %" PRId64 "] and [%" PRId64 ", %" PRId64 ", P, %" PRId64 "]", shp(pk, s1, sizeof s1), shp(pv, s2, sizeof s2),
                               a->b, a->hkv, a->d, a->b, a->hkv, a->dv);
    if (pk->dtype != a->k->dtype || pv->dtype != a->v->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "past_key and past_value are %s and %s; they must be K's and V's types, %s and %s",
                               fm_dtype_name(pk->dtype), fm_dtype_name(pv->dtype), fm_dtype_name(a->k->dtype), fm_dtype_name(a->v->dtype));
    a->past = pk->shape[2];
    fm_tensor *k = fm_cat(2, (fm_tensor *[]){pk, a->k}, 2), *v = k ? fm_cat(2, (fm_tensor *[]){pv, a->v}, 2) : NULL;
    if (!v) {
        fm_tensor_release(k);
        return fm_last_status();
    }
    REL(a->k, a->v);
    a->k = k, a->v = v;
    return FM_OK;
}

/* attn_mask's and nonpad_kv_seqlen's shapes and types. */
static fm_status attn_check_masks(onnx_op_ctx *c, attn_args *a) {
    fm_tensor *m = a->mask, *np = a->nonpad;
    char s1[96];
    if (m) {
        int64_t want[4] = {a->b, a->hq, a->sq, a->total};
        bool ok = m->ndim >= 1 && m->ndim <= 4 && m->shape[m->ndim - 1] >= 1 && m->shape[m->ndim - 1] <= a->total;
        for (int d = 0; ok && d < m->ndim - 1; d++) {
            int64_t s = m->shape[d], w = want[4 - m->ndim + d];
            ok = s == 1 || s == w;
        }
        if (!ok)
            return onnx_node_error(c, FM_ERR_INVALID,
                                   "attn_mask %s does not broadcast to [batch, q_num_heads, q_seq, total_seq] = [%" PRId64 ", %" PRId64
                                   ", %" PRId64 ", %" PRId64 "] (its last dim may be shorter than total_seq, and is then padded)",
                                   shp(m, s1, sizeof s1), a->b, a->hq, a->sq, a->total);
    }
    if (np && (np->ndim != 1 || np->shape[0] != a->b || (np->dtype != FM_I64 && np->dtype != FM_I32)))
        return onnx_node_error(c, FM_ERR_INVALID, "nonpad_kv_seqlen must be an int64 vector [batch] = [%" PRId64 "]; got %s %s", a->b,
                               fm_dtype_name(np->dtype), shp(np, s1, sizeof s1));
    return FM_OK;
}

/* attn_mask as a float bias (dtype wt) whose last dim is the total length. */
static fm_tensor *mask_bias(const attn_args *a) {
    fm_tensor *m = a->mask;
    fm_tensor *f = m->dtype == FM_BOOL ? bias_of(m, a->wt) : as_dtype(m, a->wt);
    int64_t last = m->shape[m->ndim - 1];
    if (!f || last == a->total) return f;
    int64_t sh[4];
    memcpy(sh, m->shape, (size_t)m->ndim * sizeof *sh);
    sh[m->ndim - 1] = a->total - last;
    fm_tensor *pad = fm_tensor_full(m->ndim, sh, -INFINITY, a->wt, dev_of(f));
    fm_tensor *y = pad ? fm_cat(2, (fm_tensor *[]){f, pad}, m->ndim - 1) : NULL;
    REL(f, pad);
    return y;
}

/* acc + t (either may be NULL); takes both references. */
static fm_tensor *add_bias(fm_tensor *acc, fm_tensor *t, bool *failed) {
    if (!t) {
        *failed = true;
        fm_tensor_release(acc);
        return NULL;
    }
    if (!acc) return t;
    fm_tensor *y = fm_add(acc, t);
    REL(acc, t);
    if (!y) *failed = true;
    return y;
}

/* The sum of the mask, causal and padding biases (NULL with *failed false: none). */
static fm_tensor *attn_bias(const attn_args *a, fm_device dev, bool *failed) {
    fm_tensor *bias = NULL;
    *failed = false;
    if (a->mask) bias = add_bias(bias, mask_bias(a), failed);
    if (!*failed && a->causal) { /* key j is masked for query i when j > past + i */
        fm_tensor *rows = range_on(a->past, a->sq, dev, 2, (const int64_t[]){a->sq, 1});
        fm_tensor *cols = rows ? range_on(0, a->total, dev, 2, (const int64_t[]){1, a->total}) : NULL;
        fm_tensor *ok = cols ? fm_le(cols, rows) : NULL;
        bias = add_bias(bias, ok ? bias_of(ok, a->wt) : NULL, failed);
        REL(rows, cols, ok);
    }
    if (!*failed && a->nonpad) { /* key j is padding in batch b when j >= nonpad[b] */
        fm_tensor *cols = range_on(0, a->total, dev, 2, (const int64_t[]){1, a->total});
        fm_tensor *n64 = cols ? as_dtype(a->nonpad, FM_I64) : NULL;
        fm_tensor *n2 = n64 ? fm_reshape(n64, 2, (const int64_t[]){a->b, 1}) : NULL;
        fm_tensor *ok = n2 ? fm_lt(cols, n2) : NULL, *pb = ok ? bias_of(ok, a->wt) : NULL;
        fm_tensor *pb4 = pb ? fm_reshape(pb, 4, (const int64_t[]){a->b, 1, 1, a->total}) : NULL;
        bias = add_bias(bias, pb4, failed);
        REL(cols, n64, n2, ok, pb);
    }
    return bias;
}

/* x [B, Hq, S, N] @ y [B, Hkv, N, M] -> [B, Hq, S, M], query head h with kv head h / (Hq / Hkv). */
static fm_tensor *grouped_matmul(fm_tensor *x, fm_tensor *y, int64_t hkv) {
    int64_t g = x->shape[1] / hkv;
    if (g == 1) return fm_matmul(x, y);
    int64_t s5[5] = {x->shape[0], hkv, g, x->shape[2], x->shape[3]};
    fm_tensor *x5 = fm_reshape(x, 5, s5), *y5 = x5 ? fm_unsqueeze(y, 2) : NULL, *r5 = y5 ? fm_matmul(x5, y5) : NULL;
    fm_tensor *r = r5 ? fm_reshape(r5, 4, (const int64_t[]){x->shape[0], x->shape[1], x->shape[2], y->shape[3]}) : NULL;
    REL(x5, y5, r5);
    return r;
}

/* softmax over the last dim in dtype sm (the result in x's dtype). */
static fm_tensor *softmax_in(fm_tensor *x, fm_dtype sm) {
    if (x->dtype == sm) return fm_softmax(x, 3);
    fm_tensor *xs = fm_to_dtype(x, sm), *p = xs ? fm_softmax(xs, 3) : NULL, *y = p ? fm_to_dtype(p, x->dtype) : NULL;
    REL(xs, p);
    return y;
}

/* The composed attention: *y [B, Hq, Sq, Dv] and, when wanted, *qk (both in dtype wt). */
static fm_status attn_compose(const attn_args *a, fm_tensor *bias, fm_tensor **y, fm_tensor **qk) {
    double rs = sqrt(a->scale > 0 ? a->scale : 1.0 / sqrt((double)a->d));
    fm_tensor *q = as_dtype(a->q, a->wt), *k = q ? as_dtype(a->k, a->wt) : NULL, *v = k ? as_dtype(a->v, a->wt) : NULL;
    fm_tensor *qs = v ? fm_mul_scalar(q, rs) : NULL, *ks = qs ? fm_mul_scalar(k, rs) : NULL;
    fm_tensor *kt = ks ? fm_transpose(ks, 2, 3) : NULL, *s0 = kt ? grouped_matmul(qs, kt, a->hkv) : NULL, *s1 = NULL, *s2 = NULL;
    if (s0 && a->softcap > 0) {
        fm_tensor *t0 = fm_mul_scalar(s0, 1.0 / a->softcap), *t1 = t0 ? fm_tanh(t0) : NULL;
        s1 = t1 ? fm_mul_scalar(t1, a->softcap) : NULL;
        REL(t0, t1);
    } else {
        s1 = fm_tensor_retain(s0);
    }
    if (s1) s2 = bias ? fm_add(s1, bias) : fm_tensor_retain(s1);
    fm_tensor *p = s2 ? softmax_in(s2, a->sm_dt) : NULL;
    *y = p ? grouped_matmul(p, v, a->hkv) : NULL;
    if (*y && a->want_qk) {
        fm_tensor *pick[4] = {s0, s1, s2, p};
        *qk = fm_tensor_retain(pick[a->mode]);
    }
    REL(q, k, v, qs, ks, kt, s0, s1, s2, p);
    return *y ? FM_OK : fm_last_status();
}

/* Y [B, Hq, Sq, Dv] (dtype wt) in Q's type and rank (3-D: [B, Sq, Hq * Dv]); takes y. */
static fm_tensor *attn_output(const attn_args *a, fm_tensor *y, fm_dtype dt) {
    fm_tensor *m = NULL;
    if (a->rank3) {
        fm_tensor *t = fm_permute(y, (const int[]){0, 2, 1, 3});
        m = t ? fm_reshape(t, 3, (const int64_t[]){a->b, a->sq, a->hq * a->dv}) : NULL;
        fm_tensor_release(t);
    } else {
        m = fm_tensor_retain(y);
    }
    fm_tensor *r = as_dtype(m, dt);
    REL(y, m);
    return r;
}

/* The inputs read and checked into a (its tensors released by the caller, also on an error). */
static fm_status attn_prepare(onnx_op_ctx *c, attn_args *a) {
    if (c->n_in > 6 && c->in[6] && c->opset < 24)
        return onnx_node_error(c, FM_ERR_INVALID, "nonpad_kv_seqlen (input 6) needs opset 24; the model's is %d", c->opset);
    if (attn_check_types(c, a) || attn_attrs(c, a) || attn_heads(c, a) || attn_past(c, a)) return fm_last_status();
    a->total = a->past + a->skv;
    a->mask = c->n_in > 3 ? c->in[3] : NULL;
    a->nonpad = c->n_in > 6 ? c->in[6] : NULL;
    a->want_qk = c->n_out > 3 && c->node->output[3] && *c->node->output[3];
    if (a->total <= 0)
        return onnx_node_error(c, FM_ERR_INVALID, "the total key sequence length (past %" PRId64 " + K's %" PRId64 ") is 0; softmax "
                               "needs at least one key", a->past, a->skv);
    return attn_check_masks(c, a);
}

static fm_status op_attention(onnx_op_ctx *c) {
    attn_args a = {0};
    fm_tensor *y = NULL, *qk = NULL, *bias = NULL;
    fm_status st = attn_prepare(c, &a);
    bool fast = !st && a.wt == FM_F32 && a.q->dtype == FM_F32 && a.v->dtype == FM_F32 && !a.mask && !a.nonpad && a.softcap == 0 &&
                !a.want_qk && a.d == a.dv && (!a.causal || a.past == 0) && a.sq > 0 && a.d > 0;
    if (fast) {
        y = fm_scaled_dot_product_attention(a.q, a.k, a.v, a.causal, a.scale);
        if (!y) st = fm_last_status();
    } else if (!st) {
        bool failed;
        bias = attn_bias(&a, dev_of(a.q), &failed);
        st = failed ? fm_last_status() : attn_compose(&a, bias, &y, &qk);
    }
    if (!st) st = onnx_set_out(c, 0, attn_output(&a, y, c->in[0]->dtype));
    y = NULL;
    if (!st && c->n_out > 1) st = onnx_set_out(c, 1, fm_tensor_retain(a.k));
    if (!st && c->n_out > 2) st = onnx_set_out(c, 2, fm_tensor_retain(a.v));
    if (!st && c->n_out > 3 && a.want_qk) st = onnx_set_out(c, 3, as_dtype(qk, c->in[0]->dtype));
    REL(a.q, a.k, a.v, y, qk, bias);
    return st;
}

/* The interpreter's checks and sizes for the graph form (the probe values' tensors released). */
fm_status onnx_attention_plan(onnx_op_ctx *c, onnx_attn_plan *p) {
    attn_args a = {0};
    fm_status st = attn_prepare(c, &a);
    if (!st)
        *p = (onnx_attn_plan){.b = a.b, .hq = a.hq, .hkv = a.hkv, .sq = a.sq, .skv = a.skv, .past = a.past, .total = a.total,
                              .d = a.d, .dv = a.dv, .rank3 = a.rank3, .causal = a.causal, .want_qk = a.want_qk,
                              .has_past = c->n_in > 4 && c->in[4], .has_mask = a.mask != NULL, .has_nonpad = a.nonpad != NULL,
                              .scale = a.scale, .softcap = a.softcap, .mode = a.mode, .wt = a.wt, .sm_dt = a.sm_dt};
    REL(a.q, a.k, a.v);
    return st;
}

/* ---------------------------------------------------------------- RotaryEmbedding */

typedef onnx_rope_plan rope_args; /* batch, seq, heads, head size, rotated dims */

fm_status onnx_rope_check(onnx_op_ctx *c, rope_args *r) {
    fm_tensor *x = c->in[0], *cs = c->in[1], *sn = c->in[2], *pos = c->n_in > 3 ? c->in[3] : NULL;
    char s1[96], s2[96];
    int64_t nh = onnx_attr_int(c, "num_heads", 0), rd = onnx_attr_int(c, "rotary_embedding_dim", 0);
    r->interleaved = onnx_attr_int(c, "interleaved", 0) != 0;
    if (x->ndim != 3 && x->ndim != 4)
        return onnx_node_error(c, FM_ERR_INVALID, "X must be 4-D [batch, heads, seq, head_size] or 3-D [batch, seq, hidden]; got %s",
                               shp(x, s1, sizeof s1));
    if (!fm_dtype_is_float(x->dtype) || cs->dtype != x->dtype || sn->dtype != x->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "X, cos_cache and sin_cache must be float tensors of one type; got %s, %s and %s",
                               fm_dtype_name(x->dtype), fm_dtype_name(cs->dtype), fm_dtype_name(sn->dtype));
    r->rank3 = x->ndim == 3;
    r->b = x->shape[0];
    if (r->rank3) {
        if (nh <= 0) return onnx_node_error(c, FM_ERR_INVALID, "3-D X needs the num_heads attribute (a positive count)");
        if (x->shape[2] % nh)
            return onnx_node_error(c, FM_ERR_INVALID, "X %s: its hidden size %" PRId64 " is not a multiple of num_heads = %" PRId64,
                                   shp(x, s1, sizeof s1), x->shape[2], nh);
        r->s = x->shape[1], r->h = nh, r->d = x->shape[2] / nh;
    } else {
        if (nh && nh != x->shape[1])
            return onnx_node_error(c, FM_ERR_INVALID, "num_heads = %" PRId64 " but X %s has %" PRId64 " heads (dim 1)", nh,
                                   shp(x, s1, sizeof s1), x->shape[1]);
        r->h = x->shape[1], r->s = x->shape[2], r->d = x->shape[3];
    }
    r->rd = rd ? rd : r->d;
    if (r->rd < 0 || r->rd > r->d || r->rd % 2)
        return onnx_node_error(c, FM_ERR_INVALID, "rotary_embedding_dim %" PRId64 " must be even and at most the head size %" PRId64
                               "%s", r->rd, r->d, rd ? "" : " (the head size itself is used, so it must be even)");
    int64_t half = r->rd / 2;
    bool ok = cs->ndim == sn->ndim && !memcmp(cs->shape, sn->shape, (size_t)cs->ndim * sizeof(int64_t));
    if (pos) {
        ok = ok && cs->ndim == 2 && cs->shape[1] == half;
        if (pos->ndim != 2 || pos->shape[0] != r->b || pos->shape[1] != r->s || (pos->dtype != FM_I64 && pos->dtype != FM_I32))
            return onnx_node_error(c, FM_ERR_INVALID, "position_ids must be int64 [batch, seq] = [%" PRId64 ", %" PRId64 "]; got %s %s",
                                   r->b, r->s, fm_dtype_name(pos->dtype), shp(pos, s1, sizeof s1));
    } else {
        ok = ok && cs->ndim == 3 && cs->shape[0] == r->b && cs->shape[1] == r->s && cs->shape[2] == half;
    }
    if (!ok)
        return onnx_node_error(c, FM_ERR_INVALID, "cos_cache %s and sin_cache %s must both be %s with rotary_embedding_dim / 2 = %" PRId64
                               " last", shp(cs, s1, sizeof s1), shp(sn, s2, sizeof s2),
                               pos ? "[max_position + 1, dim / 2] (position_ids given)" : "[batch, seq, dim / 2] (no position_ids)", half);
    return FM_OK;
}

/* The cache's rows for each token, [B, S, rd / 2] in dtype wt, with a heads dim inserted at
 * axis (1: before seq; 2: after it). */
static fm_tensor *rope_rows(fm_tensor *cache, fm_tensor *pos, const rope_args *r, fm_dtype wt, int axis) {
    fm_tensor *g = NULL;
    if (pos) {
        int64_t n = r->b * r->s;
        fm_tensor *flat = fm_reshape(pos, 1, &n), *sel = flat ? fm_index_select(cache, 0, flat) : NULL;
        g = sel ? fm_reshape(sel, 3, (const int64_t[]){r->b, r->s, r->rd / 2}) : NULL;
        REL(flat, sel);
    } else {
        g = fm_tensor_retain(cache);
    }
    fm_tensor *w = g ? as_dtype(g, wt) : NULL, *y = w ? fm_unsqueeze(w, axis) : NULL;
    REL(g, w);
    return y;
}

/* xr [.., rd] rotated: (x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2), x1 and x2 the halves or
 * the even and odd elements. */
static fm_tensor *rope_rotate(fm_tensor *xr, fm_tensor *cs, fm_tensor *sn, const rope_args *r) {
    int64_t half = r->rd / 2;
    fm_tensor *x1 = r->interleaved ? fm_slice(xr, 3, 0, r->rd, 2) : fm_narrow(xr, 3, 0, half);
    fm_tensor *x2 = x1 ? (r->interleaved ? fm_slice(xr, 3, 1, r->rd, 2) : fm_narrow(xr, 3, half, half)) : NULL;
    fm_tensor *a = x2 ? fm_mul(cs, x1) : NULL, *bb = a ? fm_mul(sn, x2) : NULL, *re = bb ? fm_sub(a, bb) : NULL;
    fm_tensor *c2 = re ? fm_mul(sn, x1) : NULL, *d2 = c2 ? fm_mul(cs, x2) : NULL, *im = d2 ? fm_add(c2, d2) : NULL, *y = NULL;
    if (im && r->interleaved) {
        fm_tensor *st = fm_stack(2, (fm_tensor *[]){re, im}, 4);
        y = st ? fm_reshape(st, 4, (const int64_t[]){xr->shape[0], xr->shape[1], xr->shape[2], r->rd}) : NULL;
        fm_tensor_release(st);
    } else if (im) {
        y = fm_cat(2, (fm_tensor *[]){re, im}, 3);
    }
    REL(x1, x2, a, bb, re, c2, d2, im);
    return y;
}

static fm_status op_rotary_embedding(onnx_op_ctx *c) {
    rope_args r;
    if (onnx_rope_check(c, &r)) return fm_last_status();
    fm_tensor *x = c->in[0], *pos = c->n_in > 3 ? c->in[3] : NULL;
    fm_dtype wt = x->dtype == FM_F64 ? FM_F64 : FM_F32;
    /* 4-D X stays [B, H, S, D] (the rows get a heads dim at 1); 3-D X is viewed as [B, S, H, D] */
    int axis = r.rank3 ? 2 : 1;
    fm_tensor *xw = as_dtype(x, wt);
    fm_tensor *x4 = xw && r.rank3 ? fm_reshape(xw, 4, (const int64_t[]){r.b, r.s, r.h, r.d}) : fm_tensor_retain(xw);
    fm_tensor *cs = x4 ? rope_rows(c->in[1], pos, &r, wt, axis) : NULL, *sn = cs ? rope_rows(c->in[2], pos, &r, wt, axis) : NULL;
    fm_tensor *xr = sn ? fm_narrow(x4, 3, 0, r.rd) : NULL, *rot = xr ? rope_rotate(xr, cs, sn, &r) : NULL, *y4 = NULL;
    if (rot && r.rd < r.d) {
        fm_tensor *pass = fm_narrow(x4, 3, r.rd, r.d - r.rd);
        y4 = pass ? fm_cat(2, (fm_tensor *[]){rot, pass}, 3) : NULL;
        fm_tensor_release(pass);
    } else {
        y4 = fm_tensor_retain(rot);
    }
    fm_tensor *y = y4 && r.rank3 ? fm_reshape(y4, 3, x->shape) : fm_tensor_retain(y4);
    fm_tensor *out = y ? as_dtype(y, x->dtype) : NULL;
    REL(xw, x4, cs, sn, xr, rot, y4, y);
    return onnx_set_out(c, 0, out);
}

/* ---------------------------------------------------------------- FlexAttention */

/* ai.onnx.preview's FlexAttention (what PyTorch's flex_attention exports): Q [B, Hq, S, D],
 * K [B, Hkv, L, D], V [B, Hkv, L, Dv]; scores = Q K^T scale in softmax_precision's type
 * (float32, float64 for float64 inputs by default), then the score_mod subgraph on them, the
 * softmax over the keys, the prob_mod subgraph on the probabilities, and the product with V
 * (query head h with kv head h / (Hq / Hkv)), in Q's type. The subgraphs run as If's branches
 * do (onnx_run_subgraph), one rank-4 tensor in and out of the same shape. */
static fm_status flex_mod(onnx_op_ctx *c, const char *attr, fm_tensor **x) {
    fm_onnx_model *g = onnx_subgraph(c, attr);
    if (!g) return FM_OK;
    if (g->n_inputs != 1 || g->n_outputs != 1)
        return onnx_node_error(c, FM_ERR_INVALID, "%s must take 1 input and give 1 output; it has %d and %d", attr, g->n_inputs,
                               g->n_outputs);
    fm_tensor *y = NULL;
    if (onnx_run_subgraph(c, g, 1, x, &y)) return fm_last_status();
    char a[64], b[64];
    if (y->ndim != 4 || memcmp(y->shape, (*x)->shape, sizeof(int64_t) * 4) || y->dtype != (*x)->dtype) {
        fm_status st = onnx_node_error(c, FM_ERR_INVALID, "%s gave %s %s for its input %s %s (the same shape and type are required)", attr,
                                       fm_dtype_name(y->dtype), shp(y, a, sizeof a), fm_dtype_name((*x)->dtype), shp(*x, b, sizeof b));
        fm_tensor_release(y);
        return st;
    }
    fm_tensor_release(*x);
    *x = y;
    return FM_OK;
}

static fm_status flex_check(onnx_op_ctx *c, fm_dtype *wt) {
    const fm_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    char a[64], b[64], d[64];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] < 1 ||
        v->shape[1] != k->shape[1] || q->shape[1] % k->shape[1] || k->shape[3] != q->shape[3] || v->shape[2] != k->shape[2])
        return onnx_node_error(c, FM_ERR_INVALID, "Q %s, K %s, V %s: they must be [B, Hq, S, D], [B, Hkv, L, D], [B, Hkv, L, Dv] with Hkv "
                               "dividing Hq", shp(q, a, sizeof a), shp(k, b, sizeof b), shp(v, d, sizeof d));
    if (!fm_dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "Q, K and V must share one floating-point type; got %s, %s, %s", fm_dtype_name(q->dtype),
                               fm_dtype_name(k->dtype), fm_dtype_name(v->dtype));
    const int64_t sp = onnx_attr_int(c, "softmax_precision", 0);
    *wt = q->dtype == FM_F64 ? FM_F64 : FM_F32;
    if (sp && !onnx_dtype_to_fm((int32_t)sp, wt))
        return onnx_node_error(c, FM_ERR_INVALID, "softmax_precision %lld is not a type fathom has", (long long)sp);
    if (!fm_dtype_is_float(*wt)) return onnx_node_error(c, FM_ERR_INVALID, "softmax_precision must be a floating-point type");
    return FM_OK;
}

static fm_status op_flex_attention(onnx_op_ctx *c) {
    fm_dtype wt;
    if (flex_check(c, &wt)) return fm_last_status();
    const int64_t hkv = c->in[1]->shape[1];
    double scale = onnx_attr_float(c, "scale", 0.0f);
    if (scale == 0) scale = 1.0 / sqrt((double)c->in[0]->shape[3]);
    fm_tensor *q = as_dtype(c->in[0], wt), *k = q ? as_dtype(c->in[1], wt) : NULL, *v = k ? as_dtype(c->in[2], wt) : NULL;
    fm_tensor *kt = v ? fm_transpose(k, 2, 3) : NULL, *s0 = kt ? grouped_matmul(q, kt, hkv) : NULL;
    fm_tensor *s = s0 ? fm_mul_scalar(s0, scale) : NULL, *p = NULL, *y = NULL;
    fm_status st = s ? flex_mod(c, "score_mod", &s) : fm_last_status();
    if (!st && !(p = fm_softmax(s, 3))) st = fm_last_status();
    if (!st) st = flex_mod(c, "prob_mod", &p);
    fm_tensor *yw = st ? NULL : grouped_matmul(p, v, hkv);
    if (!st && !(y = yw ? as_dtype(yw, c->in[0]->dtype) : NULL)) st = fm_last_status();
    REL(q, k, v, kt, s0, s, p, yw);
    return st ? st : onnx_set_out(c, 0, y);
}

const onnx_op onnx_ops_preview[] = {
    {"FlexAttention", 1, 3, 3, 1, "scale,softmax_precision,score_mod,prob_mod", op_flex_attention},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};

const onnx_op onnx_ops_attn[] = {
    {"Attention", 23, 3, 7, 4, "is_causal,kv_num_heads,q_num_heads,qk_matmul_output_mode,scale,softcap,softmax_precision", op_attention},
    {"RotaryEmbedding", 23, 3, 4, 1, "interleaved,num_heads,rotary_embedding_dim", op_rotary_embedding},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
