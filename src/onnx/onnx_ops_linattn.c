/* ONNX LinearAttention and CausalConvWithState (opset 27: the linear-attention and state-space
 * families). Both are made of fathom's ops, so they run on their inputs' device; nothing is read
 * on the host.
 *
 * LinearAttention: query [B, T, Hq * dk], key [B, T, Hkv * dk], value [B, T, Hkv * dv] (heads
 * split by q_num_heads / kv_num_heads), the state S [B, Hkv, dk, dv] (past_state, else zeros).
 * Each token t in order, as the spec's recurrence (the reference's order of operations):
 *   gated rules:  S = exp(g_t) S               (decay g_t per kv head, or per key dim)
 *   delta rules:  u = beta_t (v_t - S^T k_t)   (beta per kv head, or one for all)
 *                 otherwise u = v_t
 *                 S = S + k_t u^T
 *   output:       o_t = scale q_t^T S          (query head h reads kv head h / (Hq / Hkv))
 * Query heads sharing a kv head are one [g, dk] @ [dk, dv] product (no repeated state). The math
 * is float32 (float64 for float64 inputs); output is in query's type, present_state in
 * past_state's (query's when there is none). chunk_size is a tuning hint with no effect. A step
 * is one matmul to read, one multiply and one add to write, plus the decay's multiply and the
 * delta rule's matmul, subtract and multiply; the steps' outputs are stacked at the end.
 *
 * CausalConvWithState: input [B, C, L], weight [C, 1, k], bias [C], past_state [B, C, k - 1]
 * (zeros when absent). The input is appended to the state, a depthwise (groups = C) valid
 * convolution of that gives output [B, C, L] (rounded to the input's type, then SiLU when
 * activation is silu or swish), and present_state is the last k - 1 positions of it. The
 * convolution is fm_conv2d on a height-1 image, in float32 for float16 / bfloat16. */
#include "onnx/onnx_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REL(...) fm_tensor_release_n((int)(sizeof((fm_tensor *[]){__VA_ARGS__}) / sizeof(fm_tensor *)), __VA_ARGS__)

/* The largest recurrent state made from nothing (no past_state): 2^31 elements. */
#define LA_MAX_STATE (INT64_C(1) << 31)

static fm_device dev_of(const fm_tensor *t) { return t->storage->device; }

static const char *shp(const fm_tensor *t, char *buf, size_t n) { return fm_shape_str(t->ndim, t->shape, buf, n); }

/* t in dtype dt (a new reference; t itself when it already is). */
static fm_tensor *as_dtype(fm_tensor *t, fm_dtype dt) { return !t ? NULL : t->dtype == dt ? fm_tensor_retain(t) : fm_to_dtype(t, dt); }

/* The input i, or NULL when omitted. */
static fm_tensor *opt_in(const onnx_op_ctx *c, int i) { return i < c->n_in ? c->in[i] : NULL; }

/* Index of the STRING attribute's value in names (n of them), dflt when absent, -1 when it is none
 * of them (its text in buf). */
static int attr_choice(const onnx_op_ctx *c, const char *attr, const char *const *names, int n, int dflt, char *buf, size_t bn) {
    const Onnx__AttributeProto *a = onnx_attr(c, attr);
    snprintf(buf, bn, "%s", names[dflt]);
    if (!a || !a->has_s) return dflt;
    size_t len = a->s.len < bn - 1 ? a->s.len : bn - 1;
    memcpy(buf, a->s.data, len);
    buf[len] = 0;
    for (size_t i = 0; i < len; i++)
        if (buf[i] < 32 || buf[i] > 126) buf[i] = '?';
    for (int i = 0; i < n; i++)
        if (a->s.len == strlen(names[i]) && !memcmp(a->s.data, names[i], a->s.len)) return i;
    return -1;
}

/* ---------------------------------------------------------------- LinearAttention */

enum { IN_Q, IN_K, IN_V, IN_PAST, IN_DECAY, IN_BETA };
static const char *const la_rules[] = {"linear", "gated", "delta", "gated_delta"};

typedef struct la_args {
    int64_t b, t, hq, hkv, g, dk, dv;
    int64_t dg, hb; /* decay's size per kv head (1 or dk); beta's heads (1 or Hkv) */
    int rule; /* index in la_rules */
    bool gating, delta;
    double scale;
    fm_dtype wt, st_dt; /* the math's type; present_state's */
    /* prepared (dtype wt): q [B, T, Hkv, g, dk] times scale, k [B, T, Hkv, dk], v [B, T, Hkv, dv],
     * eg = exp(decay) [B, T, Hkv, dg, 1], beta [B, T, hb, 1, 1], s the state [B, Hkv, dk, dv] */
    fm_tensor *q, *k, *v, *eg, *beta, *s;
} la_args;

static fm_status la_attrs(onnx_op_ctx *c, la_args *a) {
    char buf[64];
    int rule = a->rule = attr_choice(c, "update_rule", la_rules, 4, 3, buf, sizeof buf);
    if (rule < 0)
        return onnx_node_error(c, FM_ERR_INVALID, "update_rule must be linear, gated, delta or gated_delta; got '%s'", buf);
    a->gating = rule == 1 || rule == 3;
    a->delta = rule == 2 || rule == 3;
    if (!onnx_attr(c, "q_num_heads") || !onnx_attr(c, "kv_num_heads"))
        return onnx_node_error(c, FM_ERR_INVALID, "the q_num_heads and kv_num_heads attributes are required (%s is missing)",
                               onnx_attr(c, "q_num_heads") ? "kv_num_heads" : "q_num_heads");
    a->hq = onnx_attr_int(c, "q_num_heads", 0), a->hkv = onnx_attr_int(c, "kv_num_heads", 0);
    if (a->hq <= 0 || a->hkv <= 0 || a->hq % a->hkv)
        return onnx_node_error(c, FM_ERR_INVALID, "q_num_heads (%" PRId64 ") must be a positive multiple of kv_num_heads (%" PRId64 ")",
                               a->hq, a->hkv);
    a->g = a->hq / a->hkv;
    a->scale = onnx_attr_float(c, "scale", 0.0f);
    if (!isfinite(a->scale)) return onnx_node_error(c, FM_ERR_INVALID, "scale must be finite (0: 1 / sqrt(head size)); got %g", a->scale);
    return FM_OK;
}

/* query, key and value: ranks, types, heads and sizes. */
static fm_status la_check_qkv(onnx_op_ctx *c, la_args *a) {
    fm_tensor *q = c->in[IN_Q], *k = c->in[IN_K], *v = c->in[IN_V];
    char s1[96], s2[96], s3[96];
    if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3)
        return onnx_node_error(c, FM_ERR_INVALID, "query, key and value must be 3-D [batch, seq, heads * head_size]; got %s, %s and %s",
                               shp(q, s1, sizeof s1), shp(k, s2, sizeof s2), shp(v, s3, sizeof s3));
    if (!fm_dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return onnx_node_error(c, FM_ERR_INVALID, "query, key and value must be float tensors of one type; got %s, %s and %s",
                               fm_dtype_name(q->dtype), fm_dtype_name(k->dtype), fm_dtype_name(v->dtype));
    a->b = q->shape[0], a->t = q->shape[1];
    if (k->shape[0] != a->b || v->shape[0] != a->b || k->shape[1] != a->t || v->shape[1] != a->t)
        return onnx_node_error(c, FM_ERR_INVALID, "query %s, key %s and value %s must have one batch size and sequence length",
                               shp(q, s1, sizeof s1), shp(k, s2, sizeof s2), shp(v, s3, sizeof s3));
    if (q->shape[2] % a->hq || q->shape[2] == 0)
        return onnx_node_error(c, FM_ERR_INVALID, "query %s: its hidden size %" PRId64 " is not a positive multiple of q_num_heads = %" PRId64,
                               shp(q, s1, sizeof s1), q->shape[2], a->hq);
    a->dk = q->shape[2] / a->hq;
    if (k->shape[2] != a->hkv * a->dk)
        return onnx_node_error(c, FM_ERR_INVALID, "key %s: its hidden size must be kv_num_heads * head_size = %" PRId64 " * %" PRId64
                               " (query %s)", shp(k, s1, sizeof s1), a->hkv, a->dk, shp(q, s2, sizeof s2));
    if (v->shape[2] % a->hkv)
        return onnx_node_error(c, FM_ERR_INVALID, "value %s: its hidden size %" PRId64 " is not a multiple of kv_num_heads = %" PRId64,
                               shp(v, s1, sizeof s1), v->shape[2], a->hkv);
    a->dv = v->shape[2] / a->hkv;
    a->wt = q->dtype == FM_F64 ? FM_F64 : FM_F32;
    if (a->scale == 0) a->scale = 1.0 / sqrt((double)a->dk);
    return FM_OK;
}

/* decay and beta: given as the rule needs, [B, T, Hkv or Hkv * dk] and [B, T, Hkv or 1]. */
static fm_status la_check_gates(onnx_op_ctx *c, la_args *a) {
    fm_tensor *d = opt_in(c, IN_DECAY), *be = opt_in(c, IN_BETA);
    char s1[96];
    if (a->gating != (d != NULL))
        return onnx_node_error(c, FM_ERR_INVALID, "update_rule %s %s the decay input (input 4)", la_rules[a->rule],
                               a->gating ? "needs" : "does not take");
    if (a->delta != (be != NULL))
        return onnx_node_error(c, FM_ERR_INVALID, "update_rule %s %s the beta input (input 5)", la_rules[a->rule],
                               a->delta ? "needs" : "does not take");
    fm_dtype qt = c->in[IN_Q]->dtype;
    if (d) {
        if (d->dtype != qt || d->ndim != 3 || d->shape[0] != a->b || d->shape[1] != a->t ||
            (d->shape[2] != a->hkv && d->shape[2] != a->hkv * a->dk))
            return onnx_node_error(c, FM_ERR_INVALID, "decay must be %s [batch, seq, kv_num_heads or kv_num_heads * head_size] = [%" PRId64
                                   ", %" PRId64 ", %" PRId64 " or %" PRId64 "]; got %s %s", fm_dtype_name(qt), a->b, a->t, a->hkv,
                                   a->hkv * a->dk, fm_dtype_name(d->dtype), shp(d, s1, sizeof s1));
        a->dg = d->shape[2] / a->hkv;
    }
    if (be) {
        if (be->dtype != qt || be->ndim != 3 || be->shape[0] != a->b || be->shape[1] != a->t || (be->shape[2] != a->hkv && be->shape[2] != 1))
            return onnx_node_error(c, FM_ERR_INVALID, "beta must be %s [batch, seq, kv_num_heads or 1] = [%" PRId64 ", %" PRId64 ", %" PRId64
                                   " or 1]; got %s %s", fm_dtype_name(qt), a->b, a->t, a->hkv, fm_dtype_name(be->dtype), shp(be, s1, sizeof s1));
        a->hb = be->shape[2];
    }
    return FM_OK;
}

/* past_state [B, Hkv, dk, dv]; present_state's type. */
static fm_status la_check_state(onnx_op_ctx *c, la_args *a) {
    fm_tensor *p = opt_in(c, IN_PAST);
    char s1[96];
    int64_t n = 0, o = 0;
    if (__builtin_mul_overflow(a->hq, a->dv, &o) || __builtin_mul_overflow(o, a->b, &n) || __builtin_mul_overflow(n, a->t, &n))
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "the output [%" PRId64 ", %" PRId64 ", %" PRId64 " * %" PRId64 "] is too large", a->b, a->t,
                               a->hq, a->dv);
    if (!p) {
        bool over = __builtin_mul_overflow(a->b, a->hkv, &n) || __builtin_mul_overflow(n, a->dk, &n) || __builtin_mul_overflow(n, a->dv, &n);
        if (over || n > LA_MAX_STATE)
            return onnx_node_error(c, FM_ERR_UNSUPPORTED, "the state [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] would have more "
                                   "than 2^31 elements", a->b, a->hkv, a->dk, a->dv);
        a->st_dt = c->in[IN_Q]->dtype;
        return FM_OK;
    }
    if (!fm_dtype_is_float(p->dtype) || p->ndim != 4 || p->shape[0] != a->b || p->shape[1] != a->hkv || p->shape[2] != a->dk ||
        p->shape[3] != a->dv)
        return onnx_node_error(c, FM_ERR_INVALID, "past_state must be a float tensor [batch, kv_num_heads, head_size, v_head_size] = [%" PRId64
                               ", %" PRId64 ", %" PRId64 ", %" PRId64 "]; got %s %s", a->b, a->hkv, a->dk, a->dv, fm_dtype_name(p->dtype),
                               shp(p, s1, sizeof s1));
    a->st_dt = p->dtype;
    if (p->dtype == FM_F64) a->wt = FM_F64;
    return FM_OK;
}

/* x (dtype any float) in dtype wt, reshaped to nd dims sh (a new reference). */
static fm_tensor *la_shaped(fm_tensor *x, fm_dtype wt, int nd, const int64_t *sh) {
    fm_tensor *w = as_dtype(x, wt), *y = w ? fm_reshape(w, nd, sh) : NULL;
    fm_tensor_release(w);
    return y;
}

/* The inputs checked and prepared into a (its tensors released by the caller, also on an error). */
static fm_status la_prepare(onnx_op_ctx *c, la_args *a) {
    if (la_attrs(c, a) || la_check_qkv(c, a) || la_check_gates(c, a) || la_check_state(c, a)) return fm_last_status();
    fm_tensor *qw = as_dtype(c->in[IN_Q], a->wt), *qs = qw ? fm_mul_scalar(qw, a->scale) : NULL;
    a->q = qs ? fm_reshape(qs, 5, (const int64_t[]){a->b, a->t, a->hkv, a->g, a->dk}) : NULL;
    REL(qw, qs);
    a->k = a->q ? la_shaped(c->in[IN_K], a->wt, 4, (const int64_t[]){a->b, a->t, a->hkv, a->dk}) : NULL;
    a->v = a->k ? la_shaped(c->in[IN_V], a->wt, 4, (const int64_t[]){a->b, a->t, a->hkv, a->dv}) : NULL;
    if (!a->v) return fm_last_status();
    if (a->gating) {
        fm_tensor *dw = as_dtype(c->in[IN_DECAY], a->wt), *e = dw ? fm_exp(dw) : NULL;
        a->eg = e ? fm_reshape(e, 5, (const int64_t[]){a->b, a->t, a->hkv, a->dg, 1}) : NULL;
        REL(dw, e);
        if (!a->eg) return fm_last_status();
    }
    if (a->delta && !(a->beta = la_shaped(c->in[IN_BETA], a->wt, 5, (const int64_t[]){a->b, a->t, a->hb, 1, 1}))) return fm_last_status();
    fm_tensor *p = opt_in(c, IN_PAST);
    a->s = p ? as_dtype(p, a->wt) : fm_tensor_zeros(4, (const int64_t[]){a->b, a->hkv, a->dk, a->dv}, a->wt, dev_of(c->in[IN_Q]));
    return a->s ? FM_OK : fm_last_status();
}

/* What token t writes to the state: k_t u^T [B, Hkv, dk, dv] with u = v_t, or with the delta
 * rule u = beta_t (v_t - S^T k_t) (S already decayed). */
static fm_tensor *la_write(const la_args *a, int64_t t, fm_tensor *s) {
    fm_tensor *kt = fm_select(a->k, 1, t), *kc = kt ? fm_unsqueeze(kt, 3) : NULL;
    fm_tensor *vt = kc ? fm_select(a->v, 1, t) : NULL, *u = vt ? fm_unsqueeze(vt, 2) : NULL;
    if (u && a->delta) {
        fm_tensor *kr = fm_unsqueeze(kt, 2), *r = kr ? fm_matmul(kr, s) : NULL, *d = r ? fm_sub(u, r) : NULL;
        fm_tensor *bt = d ? fm_select(a->beta, 1, t) : NULL, *ub = bt ? fm_mul(d, bt) : NULL;
        REL(kr, r, d, bt, u);
        u = ub;
    }
    fm_tensor *w = u ? fm_mul(kc, u) : NULL;
    REL(kt, kc, vt, u);
    return w;
}

/* Token t: a->s updated, *o = its output [B, Hkv, g, dv]. */
static fm_status la_step(la_args *a, int64_t t, fm_tensor **o) {
    fm_tensor *s = NULL;
    if (a->gating) {
        fm_tensor *e = fm_select(a->eg, 1, t);
        s = e ? fm_mul(a->s, e) : NULL;
        fm_tensor_release(e);
    } else {
        s = fm_tensor_retain(a->s);
    }
    fm_tensor *w = s ? la_write(a, t, s) : NULL, *s2 = w ? fm_add(s, w) : NULL;
    fm_tensor *qt = s2 ? fm_select(a->q, 1, t) : NULL;
    *o = qt ? fm_matmul(qt, s2) : NULL;
    REL(s, w, qt, a->s);
    a->s = s2;
    return *o ? FM_OK : fm_last_status();
}

/* The recurrence over the tokens: output [B, T, Hq * dv] in dtype dt. */
static fm_tensor *la_run(onnx_op_ctx *c, la_args *a, fm_dtype dt) {
    int64_t osh[3] = {a->b, a->t, a->hq * a->dv};
    if (a->t == 0) return fm_tensor_zeros(3, osh, dt, dev_of(c->in[IN_Q]));
    if (a->t > INT32_MAX) {
        onnx_node_error(c, FM_ERR_UNSUPPORTED, "sequence length %" PRId64 " too large", a->t);
        return NULL;
    }
    fm_tensor **os = calloc((size_t)a->t, sizeof *os);
    if (!os) {
        fm_set_error(FM_ERR_OOM, "out of memory");
        return NULL;
    }
    fm_status st = FM_OK;
    for (int64_t t = 0; !st && t < a->t; t++) st = la_step(a, t, &os[t]);
    fm_tensor *y5 = st ? NULL : fm_stack((int)a->t, os, 1), *y3 = y5 ? fm_reshape(y5, 3, osh) : NULL, *y = y3 ? as_dtype(y3, dt) : NULL;
    for (int64_t t = 0; t < a->t; t++) fm_tensor_release(os[t]);
    free(os);
    REL(y5, y3);
    return y;
}

static fm_status op_linear_attention(onnx_op_ctx *c) {
    la_args a = {0};
    fm_status st = la_prepare(c, &a);
    if (!st) st = onnx_set_out(c, 0, la_run(c, &a, c->in[IN_Q]->dtype));
    if (!st) st = onnx_set_out(c, 1, as_dtype(a.s, a.st_dt));
    REL(a.q, a.k, a.v, a.eg, a.beta, a.s);
    return st;
}

/* ---------------------------------------------------------------- CausalConvWithState */

static const char *const cc_acts[] = {"none", "silu", "swish"};

/* The inputs' shapes and types; *k the kernel size, *act the activation (0 none). */
static fm_status cc_check(onnx_op_ctx *c, int64_t *k, int *act) {
    fm_tensor *x = c->in[0], *w = c->in[1], *b = opt_in(c, 2), *p = opt_in(c, 3);
    char buf[64], s1[96], s2[96];
    if ((*act = attr_choice(c, "activation", cc_acts, 3, 0, buf, sizeof buf)) < 0)
        return onnx_node_error(c, FM_ERR_INVALID, "activation must be none, silu or swish; got '%s'", buf);
    if (x->ndim != 3 || !fm_dtype_is_float(x->dtype))
        return onnx_node_error(c, FM_ERR_INVALID, "input must be a 3-D float tensor [batch, channels, length]; got %s %s",
                               fm_dtype_name(x->dtype), shp(x, s1, sizeof s1));
    int64_t B = x->shape[0], C = x->shape[1];
    if (w->ndim != 3 || w->dtype != x->dtype || w->shape[0] != C || w->shape[1] != 1 || w->shape[2] < 1)
        return onnx_node_error(c, FM_ERR_INVALID, "weight must be %s [channels, 1, kernel_size] = [%" PRId64 ", 1, k >= 1] (depthwise); "
                               "got %s %s", fm_dtype_name(x->dtype), C, fm_dtype_name(w->dtype), shp(w, s1, sizeof s1));
    *k = w->shape[2];
    if (*k > INT32_MAX || C > INT32_MAX)
        return onnx_node_error(c, FM_ERR_UNSUPPORTED, "kernel size %" PRId64 " or channels %" PRId64 " too large", *k, C);
    if (b && (b->ndim != 1 || b->dtype != x->dtype || b->shape[0] != C))
        return onnx_node_error(c, FM_ERR_INVALID, "bias must be %s [channels] = [%" PRId64 "]; got %s %s", fm_dtype_name(x->dtype), C,
                               fm_dtype_name(b->dtype), shp(b, s1, sizeof s1));
    if (p && (p->ndim != 3 || p->dtype != x->dtype || p->shape[0] != B || p->shape[1] != C || p->shape[2] != *k - 1))
        return onnx_node_error(c, FM_ERR_INVALID, "past_state must be %s [batch, channels, kernel_size - 1] = [%" PRId64 ", %" PRId64
                               ", %" PRId64 "]; got %s %s (input %s)", fm_dtype_name(x->dtype), B, C, *k - 1, fm_dtype_name(p->dtype),
                               shp(p, s1, sizeof s1), shp(x, s2, sizeof s2));
    return FM_OK;
}

/* The depthwise valid convolution of xp [B, C, L + k - 1] with w [C, 1, k] (and bias b) in the
 * math's type wt: [B, C, L]. */
static fm_tensor *cc_conv(fm_tensor *xp, fm_tensor *w, fm_tensor *b, fm_dtype wt) {
    fm_conv2d_params p = fm_conv2d_default_params();
    p.groups = (int)w->shape[0];
    fm_tensor *xw = as_dtype(xp, wt), *ww = xw ? as_dtype(w, wt) : NULL, *bw = ww && b ? as_dtype(b, wt) : NULL;
    fm_tensor *x4 = ww && (bw || !b) ? fm_unsqueeze(xw, 2) : NULL, *w4 = x4 ? fm_unsqueeze(ww, 2) : NULL;
    fm_tensor *wc = w4 ? fm_contiguous(w4) : NULL, *y4 = wc ? fm_conv2d(x4, wc, bw, &p) : NULL;
    fm_tensor *y = y4 ? fm_squeeze(y4, 2) : NULL;
    REL(xw, ww, bw, x4, w4, wc, y4);
    return y;
}

/* The output [B, C, L] in x's type from the state-prefixed xp. */
static fm_tensor *cc_output(fm_tensor *x, fm_tensor *xp, fm_tensor *w, fm_tensor *b, int act) {
    fm_dtype dt = x->dtype, wt = dt == FM_F64 ? FM_F64 : FM_F32;
    if (fm_tensor_numel(x) == 0) return fm_tensor_zeros(3, x->shape, dt, dev_of(x));
    fm_tensor *y = cc_conv(xp, w, b, wt), *yr = y ? as_dtype(y, dt) : NULL; /* the convolution rounded to the type */
    if (!yr || !act) {
        fm_tensor_release(y);
        return yr;
    }
    fm_tensor *yw = as_dtype(yr, wt), *s = yw ? fm_silu(yw) : NULL, *r = s ? as_dtype(s, dt) : NULL;
    REL(y, yr, yw, s);
    return r;
}

static fm_status op_causal_conv_with_state(onnx_op_ctx *c) {
    fm_tensor *x = c->in[0], *w = c->in[1], *b = opt_in(c, 2), *p = opt_in(c, 3);
    int64_t k = 1;
    int act = 0;
    if (cc_check(c, &k, &act)) return fm_last_status();
    int64_t L = x->shape[2], psh[3] = {x->shape[0], x->shape[1], k - 1};
    fm_tensor *past = p ? fm_tensor_retain(p) : fm_tensor_zeros(3, psh, x->dtype, dev_of(x));
    fm_tensor *xp = past ? fm_cat(2, (fm_tensor *[]){past, x}, 2) : NULL;
    fm_tensor *y = xp ? cc_output(x, xp, w, b, act) : NULL;
    fm_tensor *ps = y ? fm_narrow(xp, 2, L, k - 1) : NULL, *pc = ps ? fm_contiguous(ps) : NULL;
    fm_status st = onnx_set_out(c, 0, y);
    if (!st) st = onnx_set_out(c, 1, pc);
    else fm_tensor_release(pc);
    REL(past, xp, ps);
    return st;
}

const onnx_op onnx_ops_linattn[] = {
    {"LinearAttention", 27, 3, 6, 2, "chunk_size,kv_num_heads,q_num_heads,scale,update_rule", op_linear_attention},
    {"CausalConvWithState", 27, 2, 4, 2, "activation", op_causal_conv_with_state},
    {NULL, 0, 0, 0, 0, NULL, NULL},
};
