/* The graph's op table, attention: scaled dot-product attention, the causal
 * attention of a KV cache, the fused transformer helpers on a QKV projection, and
 * attention_kv (fuse-attention: head split, cache append, attention and head
 * merge as one node). Rules as in graph_ops.c: infer checks like the front end;
 * run calls it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/ops.h"
#include "graph/graph_internal.h"

static fm_status need_float(const gtype *t, const char *what) {
    if (!fm_dtype_is_float(t->dt)) return fm_set_error(FM_ERR_INVALID, "%s must be floating-point, got %s", what, fm_dtype_name(t->dt));
    return FM_OK;
}

#define RUN_DONE(expr) do { out[0] = (expr); return out[0] ? FM_OK : fm_last_status(); } while (0)

/* ---- attention and the fused transformer helpers ---- */

static fm_status sdpa_flags(const gctx *c, bool *causal, double *scale) {
    int64_t cz = 0;
    if (ga_int(c, "causal", 0, &cz) || ga_float(c, "scale", 0, scale)) return fm_last_status();
    *causal = cz != 0;
    return FM_OK;
}

static fm_status inf_sdpa(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale) || need_float(&in[0], "q")) return fm_last_status();
    const gtype *q = &in[0], *k = &in[1], *v = &in[2];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || q->dt != k->dt || q->dt != v->dt)
        return fm_set_error(FM_ERR_INVALID, "q, k, v must be 4-D [B, H, T, D] of one dtype");
    if (memcmp(k->d, v->d, 4 * sizeof(int64_t)) || q->d[0] != k->d[0] || q->d[3] != k->d[3] || k->d[1] <= 0 || q->d[1] % k->d[1] ||
        k->d[2] <= 0 || q->d[3] <= 0)
        return fm_set_error(FM_ERR_INVALID, "q %s does not fit k/v %s (batch, head dim, kv heads dividing heads)", g_tshape(q, s1, sizeof s1),
                            g_tshape(k, s2, sizeof s2));
    out[0] = *q;
    return FM_OK;
}

static fm_status run_sdpa(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale)) return fm_last_status();
    RUN_DONE(fm_scaled_dot_product_attention(in[0], in[1], in[2], causal, scale));
}

/* sdpa_mask (fuse-masked-attention writes it): q, k, v as sdpa's, an additive mask that
 * broadcasts to the scores [B, H, T, L]; fm_sdpa_mask on the CPU, elsewhere the graph's
 * pattern again (matmul, scale, add, softmax, a fully masked row's NaNs to 0, matmul). */
static fm_status inf_sdpa_mask(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    if (inf_sdpa(c, in, out)) return fm_last_status();
    const gtype *q = &in[0], *k = &in[1], *m = &in[3];
    const int64_t full[4] = {q->d[0], q->d[1], q->d[2], k->d[2]};
    if (m->dt != q->dt || m->ndim > 4) return fm_set_error(FM_ERR_INVALID, "the mask must be of q's dtype, with at most 4 dims");
    for (int d = 0; d < m->ndim; d++)
        if (m->d[d] != 1 && m->d[d] != full[4 - m->ndim + d])
            return fm_set_error(FM_ERR_INVALID, "the mask %s does not broadcast to the scores", g_tshape(m, s1, sizeof s1));
    return FM_OK;
}

/* x [B, KV, L, D] with each kv head repeated for its H / KV query heads: [B, H, L, D] */
static fm_tensor *repeat_kv(fm_tensor *x, int64_t H) {
    const int64_t B = x->shape[0], KV = x->shape[1], L = x->shape[2], D = x->shape[3];
    if (KV == H) return fm_tensor_retain(x);
    fm_tensor *u = fm_unsqueeze(x, 2), *e = u ? fm_expand(u, 5, (int64_t[]){B, KV, H / KV, L, D}) : NULL;
    fm_tensor *r = e ? fm_reshape(e, 4, (int64_t[]){B, H, L, D}) : NULL;
    fm_tensor_release_n(2, u, e);
    return r;
}

static fm_tensor *composed_sdpa_mask(fm_tensor *q, fm_tensor *k0, fm_tensor *v0, fm_tensor *m, double scale) {
    fm_tensor *k = repeat_kv(k0, q->shape[1]), *v = k ? repeat_kv(v0, q->shape[1]) : NULL;
    if (!v) { fm_tensor_release(k); return NULL; }
    fm_tensor *kt = fm_transpose(k, 2, 3), *s = kt ? fm_matmul(q, kt) : NULL, *ss = s ? fm_mul_scalar(s, scale) : NULL;
    fm_tensor *sm = ss ? fm_add(ss, m) : NULL, *p = sm ? fm_softmax(sm, 3) : NULL, *nan = p ? fm_ne(p, p) : NULL;
    fm_tensor *z = nan ? fm_tensor_scalar(0.0, p->dtype) : NULL, *zd = z ? fm_tensor_to(z, fm_tensor_device(p)) : NULL;
    fm_tensor *pz = zd ? fm_where(nan, zd, p) : NULL, *y = pz ? fm_matmul(pz, v) : NULL;
    fm_tensor_release_n(11, kt, s, ss, sm, p, nan, z, zd, pz, k, v);
    return y;
}

static fm_status run_sdpa_mask(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale)) return fm_last_status();
    if (!(scale > 0)) scale = 1.0 / sqrt((double)in[0]->shape[3]);
    if (fm_tensor_device(in[0]).type == FM_DEV_CPU) RUN_DONE(fm_sdpa_mask(in[0], in[1], in[2], in[3], scale));
    RUN_DONE(composed_sdpa_mask(in[0], in[1], in[2], in[3], scale));
}

/* causal_attention: q [B, H, T, D] against k, v [B, KV, L, D] with L >= T, the
 * queries being the last T positions (a KV cache's layout): query i sees keys
 * j <= L - T + i. One graph serves a prompt (L == T) and each decode step. */
static fm_status inf_causal_attention(const gctx *c, const gtype *in, gtype *out) {
    char s1[96];
    if (inf_sdpa(c, in, out)) return fm_last_status();
    if (in[1].d[2] < in[0].d[2])
        return fm_set_error(FM_ERR_INVALID, "keys %s are fewer than the queries (%lld)", g_tshape(&in[1], s1, sizeof s1), (long long)in[0].d[2]);
    return FM_OK;
}

/* The general case (L > T > 1): scores with an additive mask, softmax, values;
 * kv heads repeated for grouped-query attention. */
static fm_tensor *masked_attention(fm_tensor *q, fm_tensor *k, fm_tensor *v, double scale) {
    const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], KV = k->shape[1], L = k->shape[2];
    fm_tensor *ke = NULL, *ve = NULL, *kt = NULL, *s = NULL, *mask = NULL, *sm = NULL, *p = NULL, *y = NULL;
    fm_tensor *src[2] = {k, v}, **dst[2] = {&ke, &ve};
    for (int i = 0; i < 2; i++) {
        fm_tensor *u = fm_unsqueeze(src[i], 2), *e = u ? fm_expand(u, 5, (int64_t[]){B, KV, H / KV, L, D}) : NULL;
        *dst[i] = e ? fm_reshape(e, 4, (int64_t[]){B, H, L, D}) : NULL;
        fm_tensor_release_n(2, u, e);
    }
    float *m = malloc(sizeof(float) * (size_t)(T * L));
    if (m) {
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < L; j++) m[i * L + j] = j <= L - T + i ? 0.0f : -INFINITY;
        fm_tensor *h = fm_tensor_from_data(m, 2, (int64_t[]){T, L}, FM_F32);
        mask = h ? fm_tensor_to(h, fm_tensor_device(q)) : NULL;
        fm_tensor_release(h);
        free(m);
    }
    fm_tensor *mc = mask && mask->dtype != q->dtype ? fm_to_dtype(mask, q->dtype) : fm_tensor_retain(mask);
    if (ke && ve && mc && (kt = fm_transpose(ke, 2, 3)) && (s = fm_matmul(q, kt)) &&
        (sm = fm_mul_scalar(s, scale > 0 ? scale : 1.0 / sqrt((double)D)))) {
        fm_tensor_release(s);
        s = fm_add(sm, mc);
        p = s ? fm_softmax(s, 3) : NULL;
        y = p ? fm_matmul(p, ve) : NULL;
    }
    fm_tensor_release_n(8, ke, ve, kt, s, mask, mc, sm, p);
    return y;
}

static fm_status run_causal_attention(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale)) return fm_last_status();
    int64_t T = in[0]->shape[2], L = in[1]->shape[2];
    if (T == L || T == 1) RUN_DONE(fm_scaled_dot_product_attention(in[0], in[1], in[2], T == L && T > 1, scale));
    RUN_DONE(masked_attention(in[0], in[1], in[2], scale));
}

static fm_status qkv_heads(const gctx *c, const gtype *x, int64_t *H, int64_t *KV, int64_t *D) {
    char s1[96];
    if (ga_int(c, "n_head", 0, H) || ga_int(c, "n_kv_head", *H, KV) || need_float(x, "qkv")) return fm_last_status();
    if (x->ndim != 3 || *H < 1 || *KV < 1 || *H % *KV || x->d[2] % (*H + 2 * *KV) || x->d[2] == 0 || x->d[1] < 1)
        return fm_set_error(FM_ERR_INVALID, "qkv %s must be [B, T, (n_head + 2 n_kv_head) D] with n_kv_head dividing n_head",
                            g_tshape(x, s1, sizeof s1));
    *D = x->d[2] / (*H + 2 * *KV);
    return FM_OK;
}

static fm_status inf_sdpa_qkv(const gctx *c, const gtype *in, gtype *out) {
    int64_t H = 0, KV = 0, D = 0;
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale) || qkv_heads(c, &in[0], &H, &KV, &D)) return fm_last_status();
    out[0] = (gtype){in[0].dt, 3, {in[0].d[0], in[0].d[1], H * D}};
    return FM_OK;
}

static fm_status run_sdpa_qkv(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t H = 0, KV = 0;
    bool causal = false;
    double scale = 0;
    if (sdpa_flags(c, &causal, &scale) || ga_int(c, "n_head", 0, &H) || ga_int(c, "n_kv_head", H, &KV)) return fm_last_status();
    RUN_DONE(fm_sdpa_qkv(in[0], (int)H, (int)KV, causal, scale));
}

static fm_status inf_qkv_split(const gctx *c, const gtype *in, gtype *out) {
    int64_t H = 0, KV = 0, D = 0;
    if (qkv_heads(c, &in[0], &H, &KV, &D)) return fm_last_status();
    int64_t B = in[0].d[0], T = in[0].d[1];
    out[0] = (gtype){in[0].dt, 4, {B, H, T, D}};
    out[1] = out[2] = (gtype){in[0].dt, 4, {B, KV, T, D}};
    return FM_OK;
}

static fm_status run_qkv_split(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t H = 0, KV = 0;
    if (ga_int(c, "n_head", 0, &H) || ga_int(c, "n_kv_head", H, &KV)) return fm_last_status();
    return fm_qkv_split_heads(in[0], (int)H, (int)KV, &out[0], &out[1], &out[2]);
}

/* attention_kv: qkv [B, T, (H + 2 KV) D], past_key, past_value [B, KV, P, D] ->
 * y [B, T, H D] (heads merged), present_key, present_value [B, KV, P + T, D]:
 * what qkv_split_heads, two cats on axis 2, causal_attention, transpose(1, 2) and
 * reshape compute, in one node. With an empty past (a prompt) attention runs
 * straight on the projection (sdpa_qkv: no head copies, merged output) and the
 * present cache is the split k and v, with no concatenation copy. */
static fm_status inf_attention_kv(const gctx *c, const gtype *in, gtype *out) {
    char s1[96], s2[96];
    int64_t H = 0, KV = 0, D = 0;
    double scale = 0;
    if (ga_float(c, "scale", 0, &scale) || qkv_heads(c, &in[0], &H, &KV, &D)) return fm_last_status();
    const int64_t B = in[0].d[0], T = in[0].d[1];
    for (int i = 1; i < 3; i++)
        if (in[i].dt != in[0].dt || in[i].ndim != 4 || in[i].d[0] != B || in[i].d[1] != KV || in[i].d[3] != D || in[i].d[2] != in[1].d[2])
            return fm_set_error(FM_ERR_INVALID, "past %s must be [%lld, %lld, past, %lld] of the qkv's dtype (qkv %s)", g_tshape(&in[i], s1, sizeof s1),
                                (long long)B, (long long)KV, (long long)D, g_tshape(&in[0], s2, sizeof s2));
    if (c->n->n_in > 3) /* a rope's cos and sin for the T new positions */
        for (int i = 3; i < 5; i++)
            if (i >= c->n->n_in || in[i].dt != in[0].dt || in[i].ndim != 2 || in[i].d[0] != T || in[i].d[1] != D || D % 2)
                return fm_set_error(FM_ERR_INVALID, "rope tables (inputs 3 and 4) must be [%lld, %lld] of the qkv's dtype, both given", (long long)T,
                                    (long long)D);
    out[0] = (gtype){in[0].dt, 3, {B, T, H * D}};
    out[1] = out[2] = (gtype){in[0].dt, 4, {B, KV, in[1].d[2] + T, D}};
    return FM_OK;
}

/* Rows [row0, row0 + n) of every (batch, head) of dst (a [B, KV, >= row0 + n, D] CPU
 * view whose rows are D apart) from src [B, KV, n, D]: one memcpy per head when src's
 * rows are contiguous within each head (a contiguous tensor or a cache's view), else
 * a dispatched copy (its generic strided path cost 10 ns an element, 3% of a GPT-2
 * small decode loop when it made the caches). */
static fm_status put_rows(fm_tensor *dst, int64_t row0, fm_tensor *src) {
    const int64_t B = src->shape[0], KV = src->shape[1], n = src->shape[2], D = src->shape[3];
    const bool by_rows = src->strides[3] == 1 && (src->strides[2] == D || n == 1) && dst->strides[3] == 1 && dst->strides[2] == D;
    if (by_rows && src->dtype == FM_F32 && dst->dtype == FM_F16) { /* an f16 cache: the rows converted (F16C where there is one) */
        const float *sp = fm_tensor_data(src);
        uint16_t *dp = fm_tensor_data(dst);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < KV; h++)
                fm_convert_f32_to_f16(sp + b * src->strides[0] + h * src->strides[1], dp + b * dst->strides[0] + h * dst->strides[1] + row0 * D,
                                      (size_t)(n * D));
        return FM_OK;
    }
    if (by_rows && src->dtype == dst->dtype) {
        const size_t es = fm_dtype_size(src->dtype);
        const char *sp = fm_tensor_data(src);
        char *dp = fm_tensor_data(dst);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < KV; h++)
                memcpy(dp + (size_t)(b * dst->strides[0] + h * dst->strides[1] + row0 * D) * es,
                       sp + (size_t)(b * src->strides[0] + h * src->strides[1]) * es, (size_t)(n * D) * es);
        return FM_OK;
    }
    fm_tensor *rows = fm_narrow(dst, 2, row0, n);
    fm_status st = rows ? fm_copy_(rows, src) : fm_last_status();
    fm_tensor_release(rows);
    return st;
}

bool g_kv_append_on(const gctx *c) { return c->opt && c->opt->kv_append && fm_graph_device(c->g).type == FM_DEV_CPU; }

/* fm_graph_run_options.kv_dtype FM_F16 (fm_graph_run_ex checked it comes with
 * kv_append on the CPU): the attention_kv nodes keep their caches in f16 */
bool g_kv16_on(const gctx *c) { return g_kv_append_on(c) && c->opt->kv_dtype == FM_F16; }

/* g_kv_append: present = past ++ x along axis 2 as a view
 * [B, KV, L, D] of a cache with C >= L rows per head (strides KV C D, C D, D, 1).
 * When past is such a view at offset 0 with a spare row for each of x's, and its
 * storage is the memory's owner's (not borrowed, no deleter) and held by no other
 * tensor, x goes into rows P..L-1 in place: nothing else can see those rows, so no
 * held tensor changes. The claim is the storage's reference count: the present
 * view is made first, and the append is in place only if that view and past are
 * the storage's only holders (two runs racing on one past both see more, or one
 * does, and copy). Otherwise a new cache of dtype dt gets past and x (attention_kv's
 * caches in f16 when the run asks, g_kv16_on: a past in f32 is converted as it is
 * copied in; an in-place past is the cache's own dtype). */
fm_tensor *g_kv_append(const gctx *c, fm_tensor *past, fm_tensor *x, fm_dtype dt) {
    const int64_t B = past->shape[0], KV = past->shape[1], P = past->shape[2], D = past->shape[3], T = x->shape[2], L = P + T;
    const fm_storage *s = past->storage;
    const int64_t C = D > 0 ? past->strides[1] / D : 0;
    const bool shaped = D > 0 && past->dtype == dt && past->offset == 0 && past->strides[3] == 1 && past->strides[2] == D && past->strides[1] == C * D &&
                        (B == 1 || past->strides[0] == KV * C * D) && C >= L && s->alloc && !s->deleter &&
                        s->nbytes / fm_dtype_size(past->dtype) >= (size_t)(B * KV * C * D);
    if (shaped) {
        fm_tensor *pres = fm_as_strided(past, 4, (int64_t[]){B, KV, L, D}, (int64_t[]){KV * C * D, C * D, D, 1}, 0);
        if (!pres) return NULL;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->refcount, __ATOMIC_SEQ_CST) == 2) {
            if (put_rows(pres, P, x) == FM_OK) return pres;
            fm_tensor_release(pres);
            return NULL;
        }
        fm_tensor_release(pres);
    }
    int64_t want = c->opt->kv_capacity >= L ? c->opt->kv_capacity : 2 * L, cap = want > 64 ? want : 64;
    fm_tensor *cache = fm_tensor_empty(4, (int64_t[]){B, KV, cap, D}, dt, fm_tensor_device(x));
    if (!cache) fm_error_prefix("a KV cache with room for %lld positions (fm_graph_run_options.kv_capacity %lld)", (long long)cap,
                                (long long)c->opt->kv_capacity);
    fm_tensor *pres = cache ? fm_narrow(cache, 2, 0, L) : NULL;
    fm_status st = pres ? FM_OK : fm_last_status();
    if (st == FM_OK && P) st = put_rows(pres, 0, past);
    if (st == FM_OK) st = put_rows(pres, P, x);
    fm_tensor_release(cache);
    if (st == FM_OK) return pres;
    fm_tensor_release(pres);
    return NULL;
}

static fm_status run_attention_kv(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    int64_t H = 0, KV = 0;
    double scale = 0;
    if (ga_int(c, "n_head", 0, &H) || ga_int(c, "n_kv_head", H, &KV) || ga_float(c, "scale", 0, &scale)) return fm_last_status();
    fm_tensor *q = NULL, *k = NULL, *v = NULL, *y = NULL, *t = NULL;
    if (fm_qkv_split_heads(in[0], (int)H, (int)KV, &q, &k, &v)) return fm_last_status();
    const bool rope = c->n->n_in > 3;
    for (int r = 0; rope && r < 2; r++) { /* q and k rotated for their positions (fuse-rope's rope, Llama's) */
        fm_tensor **x = r ? &k : &q, *rx = fm_rope(*x, in[3], in[4]);
        fm_tensor_release(*x);
        *x = rx;
        if (!rx) { fm_tensor_release_n(3, q, k, v); return fm_last_status(); }
    }
    const int64_t B = q->shape[0], T = q->shape[2], L = in[1]->shape[2] + T;
    const bool app = g_kv_append_on(c); /* caches with room (a prompt's too: its first decode step appends in place) */
    const bool kv16 = g_kv16_on(c) && k->dtype == FM_F32; /* f16 caches for an f32 graph's keys and values */
    if (app) {
        const fm_dtype dt = kv16 ? FM_F16 : k->dtype;
        out[1] = g_kv_append(c, in[1], k, dt);
        out[2] = out[1] ? g_kv_append(c, in[2], v, dt) : NULL;
    }
    if (kv16 && L != T) { /* a past in the f16 caches: attention over them (a prompt's runs on its f32 k and v) */
        if (out[1] && out[2]) y = fm_sdpa_kv16(q, out[1], out[2], scale);
        if (y) t = fm_transpose(y, 1, 2);
        if (t) out[0] = fm_reshape(t, 3, (int64_t[]){B, T, H * q->shape[3]});
    } else if (L == T && !rope) { /* a prompt: no past */
        if (out[1] || !app) out[0] = fm_sdpa_qkv(in[0], (int)H, (int)KV, true, scale);
        if (!app) out[1] = fm_tensor_retain(k), out[2] = fm_tensor_retain(v);
    } else { /* a decode step, or a prompt whose q and k were rotated (not the projection's) */
        if (!app && L == T) out[1] = fm_tensor_retain(k), out[2] = fm_tensor_retain(v);
        else if (!app) out[1] = fm_cat(2, (fm_tensor *[]){in[1], k}, 2), out[2] = fm_cat(2, (fm_tensor *[]){in[2], v}, 2);
        if (out[1] && out[2])
            y = L == T ? fm_scaled_dot_product_attention(q, k, v, true, scale)
              : T == 1 ? fm_scaled_dot_product_attention(q, out[1], out[2], false, scale) : masked_attention(q, out[1], out[2], scale);
        if (y) t = fm_transpose(y, 1, 2);
        if (t) out[0] = fm_reshape(t, 3, (int64_t[]){B, T, H * q->shape[3]});
    }
    fm_tensor_release_n(5, q, k, v, y, t);
    if (out[0] && out[1] && out[2]) return FM_OK;
    fm_status st = fm_last_status();
    for (int i = 0; i < 3; i++) { fm_tensor_release(out[i]); out[i] = NULL; }
    return st;
}

/* rope: x [..., T, D] (D even) with cos, sin [T, D] of x's dtype: fm_rope. */
static fm_status inf_rope(const gctx *c, const gtype *in, gtype *out) {
    (void)c;
    char s1[96], s2[96];
    if (need_float(&in[0], "x")) return fm_last_status();
    const int nd = in[0].ndim;
    bool ok = nd >= 2 && in[0].d[nd - 1] % 2 == 0;
    for (int k = 1; ok && k < 3; k++) ok = in[k].dt == in[0].dt && in[k].ndim == 2 && in[k].d[0] == in[0].d[nd - 2] && in[k].d[1] == in[0].d[nd - 1];
    if (!ok) return fm_set_error(FM_ERR_INVALID, "x %s needs [..., T, D] with D even, and cos and sin [T, D] of its dtype (cos %s)",
                                 g_tshape(&in[0], s1, sizeof s1), g_tshape(&in[1], s2, sizeof s2));
    out[0] = in[0];
    return FM_OK;
}

static fm_status run_rope(const gctx *c, fm_tensor *const *in, fm_tensor **out) {
    (void)c;
    RUN_DONE(fm_rope(in[0], in[1], in[2]));
}

const g_op_spec g_ops_attn[] = {
    {"scaled_dot_product_attention", 3, 3, 1, "causal,scale", inf_sdpa, run_sdpa, NULL},
    {"causal_attention", 3, 3, 1, "scale", inf_causal_attention, run_causal_attention, NULL},
    {"sdpa_mask", 4, 4, 1, "scale", inf_sdpa_mask, run_sdpa_mask, NULL},
    {"sdpa_qkv", 1, 1, 1, "n_head,n_kv_head,causal,scale", inf_sdpa_qkv, run_sdpa_qkv, NULL},
    {"qkv_split_heads", 1, 1, 3, "n_head,n_kv_head", inf_qkv_split, run_qkv_split, NULL},
    {"attention_kv", 3, 5, 3, "n_head,n_kv_head,scale", inf_attention_kv, run_attention_kv, NULL},
    {"rope", 3, 3, 1, "", inf_rope, run_rope, NULL},
};
const int g_n_ops_attn = (int)(sizeof g_ops_attn / sizeof g_ops_attn[0]);
