/* The GPT (GPT-2 and Llama) as a graph with its KV cache as inputs and outputs:
 *   tokens [batch, seq] (i64), past_key.<i>, past_value.<i> [batch, kv_heads, past, head_dim]
 *   -> logits [batch, seq, vocab], present_key.<i>, present_value.<i> [batch, kv_heads, past+seq, head_dim].
 * One graph runs a prompt (past = 0) and each decode step (seq = 1): attention is
 * causal_attention, whose queries are the last seq positions of the keys, and the
 * positions (GPT-2's wpe rows, Llama's RoPE tables) are sliced at past .. past+seq.
 *
 * The graph is written from the model's structure, op for op as gpt_model.c's
 * unfused forward runs them (the fused kernels are the same arithmetic in fewer
 * passes), not recorded from a run: the cache is written in place in the model,
 * which a functional graph expresses as past -> present. fm_graph_from_gpt checks
 * the result against fm_gpt_forward and fm_gpt_forward_cached on example tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "gpt/gpt_internal.h"
#include "graph/graph_internal.h"

static void cpy(char *d, const char *s) {
    size_t n = strlen(s);
    if (n > 23) n = 23;
    memcpy(d, s, n);
    d[n] = 0;
}

typedef struct gb { fm_graph *g; const fm_gpt *m; int n; fm_status st; } gb;

static const char *pname(const gb *b, const fm_tensor *t) {
    for (int i = 0; i < b->m->params.n; i++)
        if (b->m->params.items[i].tensor == t) return b->m->params.items[i].name;
    return NULL;
}

/* A new value name, "v<n>" (kept in a small ring: callers use it at once). */
static const char *tmp(gb *b) {
    static _Thread_local char ring[8][24];
    char *s = ring[b->n % 8];
    snprintf(s, 24, "v%d", b->n++);
    return s;
}

/* Adds op(ins) -> a fresh value; returns its name (copied into out). */
static const char *node(gb *b, char *out, const char *op, int nin, const char *const *ins, int na, const fm_graph_attr *at) {
    cpy(out, tmp(b));
    if (b->st == FM_OK) b->st = fm_graph_add_node(b->g, op, NULL, nin, ins, 1, (const char *[]){out}, na, at);
    return out;
}

static fm_graph_attr dims_attr(const char *name, int n, const int64_t *v, const char *const *e) {
    return (fm_graph_attr){.name = name, .type = FM_ATTR_INTS, .n = n, .ints = v, .dims = e};
}

static const char *slice_pos(gb *b, char *out, const char *x, int axis) {
    fm_graph_attr at[3] = {fm_graph_attr_int("axis", axis), dims_attr("start", 1, (int64_t[]){0}, (const char *[]){"past"}),
                           dims_attr("end", 1, (int64_t[]){0}, (const char *[]){"past+seq"})};
    return node(b, out, "slice", 1, &x, 3, at);
}

static const char *slice_fixed(gb *b, char *out, const char *x, int axis, int64_t s, int64_t e) {
    fm_graph_attr at[3] = {fm_graph_attr_int("axis", axis), fm_graph_attr_int("start", s), fm_graph_attr_int("end", e)};
    return node(b, out, "slice", 1, &x, 3, at);
}

static const char *norm(gb *b, char *out, const char *x, const fm_tensor *w, const fm_tensor *bias) {
    fm_graph_attr eps = fm_graph_attr_float("eps", b->m->cfg.norm_eps);
    if (b->m->cfg.arch == FM_GPT_LLAMA) return node(b, out, "rms_norm", 2, (const char *[]){x, pname(b, w)}, 1, &eps);
    return node(b, out, "layer_norm", 3, (const char *[]){x, pname(b, w), bias ? pname(b, bias) : ""}, 1, &eps);
}

static const char *linear(gb *b, char *out, const char *x, const fm_tensor *w, const fm_tensor *bias) {
    return node(b, out, "linear", 3, (const char *[]){x, pname(b, w), bias ? pname(b, bias) : ""}, 0, NULL);
}

/* rotate-half RoPE on x [B, h, T, D] at positions past .. past+seq */
static const char *rope(gb *b, char *out, const char *x, int64_t D) {
    char cs[24], sn[24], x1[24], x2[24], nx2[24], rot[24], a[24], c[24];
    slice_pos(b, cs, "rope.cos", 0);
    slice_pos(b, sn, "rope.sin", 0);
    slice_fixed(b, x1, x, 3, 0, D / 2);
    slice_fixed(b, x2, x, 3, D / 2, D);
    node(b, nx2, "neg", 1, (const char *[]){x2}, 0, NULL);
    fm_graph_attr ax = fm_graph_attr_int("axis", 3);
    node(b, rot, "cat", 2, (const char *[]){nx2, x1}, 1, &ax);
    node(b, a, "mul", 2, (const char *[]){x, cs}, 0, NULL);
    node(b, c, "mul", 2, (const char *[]){rot, sn}, 0, NULL);
    return node(b, out, "add", 2, (const char *[]){a, c}, 0, NULL);
}

static const char *block(gb *b, char *out, const char *x, int i) {
    const fm_gpt *m = b->m;
    const gpt_layer *L = &m->layers[i];
    const int64_t H = m->cfg.n_head, D = fm_gpt_head_dim(&m->cfg), F = m->cfg.ffn_hidden;
    char n1[24], qkv[24], q[24], k[24], v[24], y[24], t[24], mg[24], h[24], r[24], n2[24], f[24], act[24], h2[24];
    char pk[32], pv[32], ok[32], ov[32];
    snprintf(pk, sizeof pk, "past_key.%d", i);
    snprintf(pv, sizeof pv, "past_value.%d", i);
    snprintf(ok, sizeof ok, "present_key.%d", i);
    snprintf(ov, sizeof ov, "present_value.%d", i);
    norm(b, n1, x, L->ln1_w, L->ln1_b);
    linear(b, qkv, n1, L->qkv_w, L->qkv_b);
    cpy(q, tmp(b));
    cpy(k, tmp(b));
    cpy(v, tmp(b));
    fm_graph_attr heads[2] = {fm_graph_attr_int("n_head", H), fm_graph_attr_int("n_kv_head", m->n_kv)};
    if (b->st == FM_OK) b->st = fm_graph_add_node(b->g, "qkv_split_heads", NULL, 1, (const char *[]){qkv}, 3, (const char *[]){q, k, v}, 2, heads);
    if (m->cfg.arch == FM_GPT_LLAMA) {
        char rq[24], rk[24];
        rope(b, rq, q, D);
        rope(b, rk, k, D);
        cpy(q, rq);
        cpy(k, rk);
    }
    fm_graph_attr ax2 = fm_graph_attr_int("axis", 2);
    if (b->st == FM_OK) b->st = fm_graph_add_node(b->g, "cat", NULL, 2, (const char *[]){pk, k}, 1, (const char *[]){ok}, 1, &ax2);
    if (b->st == FM_OK) b->st = fm_graph_add_node(b->g, "cat", NULL, 2, (const char *[]){pv, v}, 1, (const char *[]){ov}, 1, &ax2);
    node(b, y, "causal_attention", 3, (const char *[]){q, ok, ov}, 0, NULL);
    fm_graph_attr tr[2] = {fm_graph_attr_int("dim0", 1), fm_graph_attr_int("dim1", 2)};
    node(b, t, "transpose", 1, (const char *[]){y}, 2, tr);
    fm_graph_attr sh = fm_graph_attr_ints("shape", 3, (int64_t[]){0, 0, H * D});
    node(b, mg, "reshape", 1, (const char *[]){t}, 1, &sh);
    linear(b, h, mg, L->proj_w, L->proj_b);
    node(b, r, "add", 2, (const char *[]){x, h}, 0, NULL);
    norm(b, n2, r, L->ln2_w, L->ln2_b);
    linear(b, f, n2, L->fc_w, L->fc_b);
    if (m->cfg.arch == FM_GPT_LLAMA) {
        char gt[24], up[24], sg[24];
        slice_fixed(b, gt, f, 2, 0, F);
        slice_fixed(b, up, f, 2, F, 2 * F);
        node(b, sg, "silu", 1, (const char *[]){gt}, 0, NULL);
        node(b, act, "mul", 2, (const char *[]){sg, up}, 0, NULL);
    } else {
        node(b, act, "gelu_tanh", 1, (const char *[]){f}, 0, NULL);
    }
    linear(b, h2, act, L->fc2_w, L->fc2_b);
    return node(b, out, "add", 2, (const char *[]){r, h2}, 0, NULL);
}

static fm_status declare(gb *b) {
    const fm_gpt *m = b->m;
    const int64_t D = fm_gpt_head_dim(&m->cfg);
    fm_status st = fm_graph_add_input(b->g, "tokens", FM_I64, 2, (int64_t[]){-1, -1}, (const char *[]){"batch", "seq"});
    for (int i = 0; st == FM_OK && i < m->cfg.n_layer; i++) {
        char pk[32], pv[32];
        snprintf(pk, sizeof pk, "past_key.%d", i);
        snprintf(pv, sizeof pv, "past_value.%d", i);
        const int64_t dims[4] = {-1, m->n_kv, -1, D};
        const char *nm[4] = {"batch", NULL, "past", NULL};
        st = fm_graph_add_input(b->g, pk, FM_F32, 4, dims, nm);
        if (st == FM_OK) st = fm_graph_add_input(b->g, pv, FM_F32, 4, dims, nm);
    }
    if (st == FM_OK) st = fm_graph_set_dim_hint(b->g, "batch", 1);
    /* probes: seq 1 then 3, past 1 then 4: past + seq stays within a context of 7 */
    if (st == FM_OK) st = fm_graph_set_dim_hint(b->g, "seq", 1);
    if (st == FM_OK) st = fm_graph_set_dim_hint(b->g, "past", 1);
    for (int i = 0; st == FM_OK && i < m->params.n; i++) st = fm_graph_add_const(b->g, m->params.items[i].name, m->params.items[i].tensor);
    if (st == FM_OK && m->cfg.arch == FM_GPT_LLAMA) {
        st = fm_graph_add_const(b->g, "rope.cos", m->rope_cos);
        if (st == FM_OK) st = fm_graph_add_const(b->g, "rope.sin", m->rope_sin);
    }
    return st;
}

static fm_status build(gb *b) {
    const fm_gpt *m = b->m;
    char x[24], e[24], pe[24], nf[24];
    if ((b->st = declare(b)) != FM_OK) return b->st;
    node(b, x, "embedding", 2, (const char *[]){pname(b, m->wte), "tokens"}, 0, NULL);
    if (m->cfg.arch == FM_GPT_GPT2) {
        slice_pos(b, pe, pname(b, m->wpe), 0);
        cpy(e, x);
        node(b, x, "add", 2, (const char *[]){e, pe}, 0, NULL);
    }
    for (int i = 0; i < m->cfg.n_layer && b->st == FM_OK; i++) {
        char y[24];
        block(b, y, x, i);
        cpy(x, y);
    }
    norm(b, nf, x, m->lnf_w, m->lnf_b);
    if (b->st == FM_OK) b->st = fm_graph_add_node(b->g, "linear", "lm_head", 3, (const char *[]){nf, pname(b, m->lm_head ? m->lm_head : m->wte), ""}, 1, (const char *[]){"logits"}, 0, NULL);
    if (b->st == FM_OK) b->st = fm_graph_add_output(b->g, "logits");
    for (int i = 0; i < m->cfg.n_layer && b->st == FM_OK; i++) {
        char ok[32], ov[32];
        snprintf(ok, sizeof ok, "present_key.%d", i);
        snprintf(ov, sizeof ov, "present_value.%d", i);
        b->st = fm_graph_add_output(b->g, ok);
        if (b->st == FM_OK) b->st = fm_graph_add_output(b->g, ov);
    }
    return b->st;
}

static double max_rel_diff(const fm_tensor *a, const fm_tensor *ref) {
    if (!a || !ref || a->ndim != ref->ndim || memcmp(a->shape, ref->shape, sizeof(int64_t) * (size_t)a->ndim)) return INFINITY;
    double m = 0, scale = 1;
    for (int64_t i = 0; i < fm_tensor_numel(ref); i++) scale = fmax(scale, fabs(fm_tensor_get(ref, i)));
    for (int64_t i = 0; i < fm_tensor_numel(ref); i++) {
        double d = fabs(fm_tensor_get(a, i) - fm_tensor_get(ref, i));
        if (!(d <= m)) m = d;
    }
    return m / scale;
}

/* Empty caches [1, KV, 0, D] for every layer, in input order after the tokens. */
static fm_status empty_past(const fm_gpt *m, fm_tensor **in) {
    const int64_t D = fm_gpt_head_dim(&m->cfg);
    for (int i = 0; i < 2 * m->cfg.n_layer; i++)
        if (!(in[1 + i] = fm_tensor_zeros(4, (int64_t[]){1, m->n_kv, 0, D}, FM_F32, FM_CPU))) return fm_last_status();
    return FM_OK;
}

/* The graph against the model: a prompt of T tokens (fm_gpt_forward), then one
 * decode step on the graph's own cache (fm_gpt_forward_cached). */
static fm_status check_against_model(const fm_graph *g, fm_gpt *m) {
    const int n_io = 1 + 2 * m->cfg.n_layer;
    const int64_t T = m->cfg.block_size >= 4 ? 3 : 1;
    fm_tensor **in = calloc((size_t)n_io, sizeof *in), **out = calloc((size_t)n_io, sizeof *out), **out2 = calloc((size_t)n_io, sizeof *out2);
    int64_t ids[4];
    for (int i = 0; i < 4; i++) ids[i] = (7 * i + 1) % m->cfg.vocab_size;
    fm_tensor *idx = fm_tensor_from_data(ids, 2, (int64_t[]){1, T}, FM_I64), *next = fm_tensor_from_data(ids + 3, 2, (int64_t[]){1, 1}, FM_I64);
    fm_tensor *ref = NULL, *ref1 = NULL, *ref2 = NULL;
    fm_gpt_kv_cache *kv = fm_gpt_kv_cache_new(m, 1);
    fm_status st = in && out && out2 && idx && next && kv ? FM_OK : fm_last_status();
    if (st == FM_OK) st = empty_past(m, in);
    if (st == FM_OK) { in[0] = fm_tensor_retain(idx); st = fm_graph_run(g, in, out); }
    if (st == FM_OK && !((ref = fm_gpt_forward(m, idx, NULL, NULL)) && (ref1 = fm_gpt_forward_cached(m, idx, kv)) &&
                         (ref2 = fm_gpt_forward_cached(m, next, kv))))
        st = fm_last_status();
    double d1 = st == FM_OK ? max_rel_diff(out[0], ref) : 0, d2 = 0;
    if (st == FM_OK) {
        fm_tensor_release(in[0]);
        in[0] = fm_tensor_retain(next);
        for (int i = 1; i < n_io; i++) { fm_tensor_release(in[i]); in[i] = fm_tensor_retain(out[i]); }
        st = fm_graph_run(g, in, out2);
        if (st == FM_OK) d2 = max_rel_diff(out2[0], ref2);
    }
    if (st == FM_OK && !(d1 <= 1e-4 && d2 <= 1e-4))
        st = fm_set_error(FM_ERR_INTERNAL, "gpt graph: its logits differ from the model's by %.3g (prompt) and %.3g (decode step), relative", d1, d2);
    for (int i = 0; i < n_io; i++) fm_tensor_release_n(3, in ? in[i] : NULL, out ? out[i] : NULL, out2 ? out2[i] : NULL);
    free(in);
    free(out);
    free(out2);
    fm_tensor_release_n(5, idx, next, ref, ref1, ref2);
    fm_gpt_kv_cache_free(kv);
    return st;
}

fm_graph *fm_graph_from_gpt(fm_gpt *m) {
    if (!m) { fm_set_error(FM_ERR_INVALID, "gpt graph: NULL model"); return NULL; }
    gb b = {fm_graph_new(), m, 0, FM_OK};
    if (!b.g) return NULL;
    bool prev = fm_set_grad_enabled(false), was = m->training;
    m->training = false;
    fm_status st = build(&b);
    if (st == FM_OK) st = fm_graph_validate(b.g);
    if (st == FM_OK) st = check_against_model(b.g, m);
    char v[32];
    const char *keys[] = {"model_kind", "arch", "block_size", "vocab_size", "n_layer", "producer"};
    for (int i = 0; st == FM_OK && i < 6; i++) {
        int n = i == 2 ? m->cfg.block_size : i == 3 ? m->cfg.vocab_size : m->cfg.n_layer;
        snprintf(v, sizeof v, "%d", n);
        st = fm_graph_set_meta(b.g, keys[i], i == 0 ? "gpt" : i == 1 ? fm_gpt_arch_name(m->cfg.arch) : i == 5 ? "fathom gpt graph" : v);
    }
    /* the whole configuration, for what runs the model outside the graph (the paged
     * text generation of `fathom serve`, graph_gpt_paged.c) */
    char *cj = st == FM_OK ? gpt_config_json(&m->cfg, false) : NULL;
    if (st == FM_OK) st = cj ? fm_graph_set_meta(b.g, "gpt_config", cj) : fm_last_status();
    free(cj);
    m->training = was;
    fm_set_grad_enabled(prev);
    if (st != FM_OK) { fm_graph_free(b.g); return NULL; }
    return b.g;
}
