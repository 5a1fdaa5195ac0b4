/* A GPT inference graph as the paged decoder's model: see graph_gpt_paged.h.
 *
 * Why by name rather than by running the graph's nodes: the paged decoder batches
 * the rows of many sequences, each at its own position, through one step, which a
 * graph's position slices and KV concatenations cannot express; the decoder already
 * runs the GPT block (tests/test_gpt_paged.c holds it to fm_gpt_forward). What a
 * graph adds is the weights' form, which fm_graph_from_gpt names after the model's
 * parameters and quantize after those names plus a suffix (graph_quant.c): the
 * names are the mapping, and the prompt check below proves it for each graph. */
#include "graph/graph_gpt_paged.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "graph/graph_internal.h"
#include "gpt/gpt_internal.h"

bool fm_graph_is_gpt(const fm_graph *g) {
    const char *k = fm_graph_get_meta(g, "model_kind");
    return k && !strcmp(k, "gpt");
}

typedef struct bind_ctx {
    const fm_graph *g;
    const char *where;
    fm_paged_weights *q;
    int n_layer;
    bool untied;
} bind_ctx;

/* The paged decoder's index of the linear whose weight is `name` (per layer qkv,
 * proj, fc, fc2; then the head), or -1. */
static int linear_index(const bind_ctx *b, const char *name) {
    int l = -1, end = 0;
    char part[16] = "";
    if (!strcmp(name, "lm_head.weight") || (!b->untied && !strcmp(name, "wte.weight"))) return b->n_layer * 4;
    if (sscanf(name, "h.%d.%15[a-z_].%n", &l, part, &end) != 2 || l < 0 || l >= b->n_layer) return -1;
    const char *rest = name + end;
    if (!strcmp(part, "attn") && !strcmp(rest, "qkv.weight")) return l * 4;
    if (!strcmp(part, "attn") && !strcmp(rest, "proj.weight")) return l * 4 + 1;
    if (!strcmp(part, "mlp") && !strcmp(rest, "fc.weight")) return l * 4 + 2;
    if (!strcmp(part, "mlp") && !strcmp(rest, "proj.weight")) return l * 4 + 3;
    return -1;
}

static fm_tensor *constant(const fm_graph *g, const char *name) {
    int v = g_find_value(g, name);
    return v >= 0 && g->values[v].kind == GV_CONST ? g->values[v].tensor : NULL;
}

/* The first node of op `op` reading value `name` as input k. */
static const gnode *reader(const fm_graph *g, const char *op, const char *name, int k) {
    int v = g_find_value(g, name);
    for (int i = 0; v >= 0 && i < g->n_nodes; i++)
        if (!strcmp(g->nodes[i].op, op) && g->nodes[i].n_in > k && g->nodes[i].in[k] == v) return &g->nodes[i];
    return NULL;
}

static bool has_shape(const fm_tensor *t, fm_dtype dt, int ndim, const int64_t *d) {
    if (!t || t->dtype != dt || t->ndim != ndim || fm_tensor_device(t).type != FM_DEV_CPU || !fm_tensor_is_contiguous(t))
        return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != d[i]) return false;
    return true;
}

/* The int4 form of weight `name` [N, K] (emb: as the token table), if the graph has one:
 * 1 found (into *out, with references of its own), 0 none, -1 error. */
static int find_int4(const bind_ctx *b, const char *name, int64_t N, int64_t K, bool emb, fm_paged_linear *out) {
    char wn[300], sn[300], mn[300];
    snprintf(wn, sizeof wn, "%s.int4", name);
    snprintf(sn, sizeof sn, "%s.int4_scale", name);
    snprintf(mn, sizeof mn, "%s.int4_min", name);
    fm_tensor *w = constant(b->g, wn), *s = constant(b->g, sn), *m = constant(b->g, mn);
    if (!w) return 0;
    const gnode *n = emb ? reader(b->g, "qembedding_int4", wn, 0) : reader(b->g, "qlinear_int4", wn, 1);
    const gattr *ga = n ? g_node_attr(n, "group") : NULL;
    const int64_t group = ga ? ga->i : 0;
    if (!n) return emb ? 0 : (fm_set_error(FM_ERR_FORMAT, "%s: no qlinear_int4 node reads '%s'", b->where, wn), -1);
    if (!(group == 32 || group == 64 || group == 128) || K % group || K % 2 ||
        !has_shape(w, FM_U8, 2, (int64_t[]){N, K / 2}) || !has_shape(s, FM_F16, 2, (int64_t[]){N, K / group}) ||
        (m && !has_shape(m, FM_F16, 2, (int64_t[]){N, K / group}))) {
        fm_set_error(FM_ERR_FORMAT, "%s: the int4 form of '%s' (group %lld) does not fit its [%lld, %lld] weight", b->where,
                     name, (long long)group, (long long)N, (long long)K);
        return -1;
    }
    *out = (fm_paged_linear){FM_PAGED_LIN_INT4, fm_tensor_retain(w), fm_tensor_retain(s), fm_tensor_retain(m), (int)group};
    return 1;
}

/* The token table `name` [N, K] as int8 panels that a qembedding_int8 node looks up (a tied
 * head's qlinear_int8 may read the same panels): 1, 0 or -1. */
static int find_int8_table(const bind_ctx *b, const char *name, int64_t N, int64_t K, fm_paged_linear *out) {
    char pn[300], sn[300];
    snprintf(pn, sizeof pn, "%s.int8_panels", name);
    snprintf(sn, sizeof sn, "%s.int8_scale", name);
    fm_tensor *p = constant(b->g, pn), *s = constant(b->g, sn);
    const gnode *n = p ? reader(b->g, "qembedding_int8", pn, 0) : NULL;
    if (!n) return 0;
    const gattr *d = g_node_attr(n, "dim");
    if (!d || d->i != K || !has_shape(p, FM_I8, 4, (int64_t[]){(N + 15) / 16, (K + 3) / 4, 16, 4}) || !has_shape(s, FM_F32, 1, &N)) {
        fm_set_error(FM_ERR_FORMAT, "%s: the int8 table '%s' does not fit its [%lld, %lld] weight", b->where, name, (long long)N,
                     (long long)K);
        return -1;
    }
    *out = (fm_paged_linear){FM_PAGED_LIN_INT8, fm_tensor_retain(p), fm_tensor_retain(s), NULL, 0};
    return 1;
}

/* The int8 form (dynamic activations, VNNI panels) of weight `name` [N, K]: 1, 0 or -1. */
static int find_int8(const bind_ctx *b, const char *name, int64_t N, int64_t K, fm_paged_linear *out) {
    char pn[300], sn[300], un[300], rn[300];
    snprintf(pn, sizeof pn, "%s.int8_panels", name);
    snprintf(sn, sizeof sn, "%s.int8_scale", name);
    snprintf(un, sizeof un, "%s.int8_sum", name);
    snprintf(rn, sizeof rn, "%s.int8", name);
    fm_tensor *p = constant(b->g, pn), *s = constant(b->g, sn), *u = constant(b->g, un);
    if (!p) {
        if (!constant(b->g, rn)) return 0;
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: '%s' is int8 in rows (over 32768 inputs), which text generation does not run; "
                     "quantize with --int4", b->where, name);
        return -1;
    }
    const gnode *n = reader(b->g, "qlinear_int8", pn, 1);
    const gattr *as = n ? g_node_attr(n, "a_scale") : NULL, *relu = n ? g_node_attr(n, "relu") : NULL;
    const gattr *gelu = n ? g_node_attr(n, "gelu_tanh") : NULL, *gelu_erf = n ? g_node_attr(n, "gelu") : NULL;
    if (gelu_erf && gelu_erf->i) {
        fm_set_error(FM_ERR_FORMAT, "%s: '%s' has a fused exact GELU, which a GPT-2 or Llama does not have", b->where, name);
        return -1;
    }
    if (!n || (as && as->f > 0) || (relu && relu->i)) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: '%s' is not int8 dynamic (%s); text generation runs int8 --dynamic and int4 "
                     "graphs", b->where, name, !n ? "no qlinear_int8 node reads it" : as && as->f > 0 ? "calibrated activation scale" : "a fused relu");
        return -1;
    }
    /* a tanh GELU fused into the int8 node (fathom quantize of a compiled GPT-2) is the MLP's
     * own, which the paged decoder applies after its first linear; anywhere else the graph is
     * not the GPT its metadata describes */
    if (gelu && gelu->i && !strstr(name, ".mlp.fc.")) {
        fm_set_error(FM_ERR_FORMAT, "%s: '%s' has a fused tanh GELU, which only the MLP's first linear (mlp.fc) has in a GPT-2",
                     b->where, name);
        return -1;
    }
    if (!has_shape(p, FM_I8, 4, (int64_t[]){(N + 15) / 16, (K + 3) / 4, 16, 4}) || !has_shape(s, FM_F32, 1, &N) ||
        !has_shape(u, FM_I32, 1, &N)) {
        fm_set_error(FM_ERR_FORMAT, "%s: the int8 form of '%s' does not fit its [%lld, %lld] weight", b->where, name,
                     (long long)N, (long long)K);
        return -1;
    }
    *out = (fm_paged_linear){FM_PAGED_LIN_INT8, fm_tensor_retain(p), fm_tensor_retain(s), fm_tensor_retain(u), 0};
    return 1;
}

static fm_tensor *placeholder(int ndim, const int64_t *shape) {
    return fm_tensor_empty(ndim, shape, FM_F32, (fm_device){FM_DEV_META, 0});
}

/* gpt_param_source: the graph's f32 constant, or a placeholder for a weight the graph
 * keeps quantized (recorded in b->q). */
static fm_tensor *bind(void *vctx, const char *name, int ndim, const int64_t *shape) {
    bind_ctx *b = vctx;
    const int li = ndim == 2 ? linear_index(b, name) : -1;
    const bool table = !strcmp(name, "wte.weight");
    fm_tensor *f = constant(b->g, name);
    if (li >= 0) { /* the linear's quantized form first: quantize keeps an f32 copy only where another node reads it */
        int r = find_int4(b, name, shape[0], shape[1], false, &b->q->lin[li]);
        if (r == 0) r = find_int8(b, name, shape[0], shape[1], &b->q->lin[li]);
        if (r < 0) return NULL;
    }
    if (table) { /* the token table: int4 or int8 when the graph looks tokens up in that form */
        int r = find_int4(b, name, shape[0], shape[1], true, &b->q->emb);
        if (r == 0) r = find_int8_table(b, name, shape[0], shape[1], &b->q->emb);
        if (r < 0) return NULL;
    }
    if (f && f->dtype == FM_F32) return fm_tensor_retain(f);
    const bool quantized = (li >= 0 && b->q->lin[li].kind != FM_PAGED_LIN_F32) || (table && b->q->emb.kind != FM_PAGED_LIN_F32);
    const bool all_uses = !table || (b->q->emb.kind != FM_PAGED_LIN_F32 && (b->untied || b->q->lin[li].kind != FM_PAGED_LIN_F32));
    if (quantized && all_uses) return placeholder(ndim, shape);
    fm_set_error(FM_ERR_FORMAT, "%s: the graph has no f32 or quantized weight '%s'; it is not the GPT its metadata describes",
                 b->where, name);
    return NULL;
}

/* rms(a - ref) / rms(ref): what a structural difference moves by its whole size
 * while the rounding of quantized activations moves it by a few per cent */
static double rms_rel(const float *a, const float *ref, int64_t n) {
    double se = 0, sr = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)a[i] - ref[i];
        se += e * e;
        sr += (double)ref[i] * ref[i];
    }
    return sr > 0 ? sqrt(se / sr) : se > 0 ? INFINITY : 0;
}

/* A prompt through the graph and through the paged decoder (the first T-1 tokens as
 * one chunk, the last as a decode step): the last two rows' logits must agree. */
static fm_status check_paged(const fm_graph *g, fm_gpt *m, const fm_paged_weights *q, const char *where, double tol) {
    const fm_gpt_config *c = fm_gpt_get_config(m);
    const int T = c->block_size >= 6 ? 6 : c->block_size, V = c->vocab_size;
    if (T < 2) return FM_OK; /* a context of one token has no decode step to compare */
    int64_t ids[6];
    int32_t ids32[6];
    for (int i = 0; i < T; i++) ids32[i] = (int32_t)(ids[i] = (11 * i + 3) % V);
    fm_tensor *tok = fm_tensor_from_data(ids, 2, (int64_t[]){1, T}, FM_I64), *ref = tok ? fm_graph_gpt_forward(g, tok) : NULL;
    fm_tensor *refc = ref ? fm_contiguous(ref) : NULL;
    fm_gpt_paged *p = refc ? fm_gpt_paged_new_ex(m, q, (T + 15) / 16, 16, 1, FM_F32) : NULL;
    float *lg = malloc(sizeof(float) * 2 * (size_t)V);
    fm_status st = p && lg ? FM_OK : fm_last_status();
    if (st == FM_OK && !lg) st = fm_set_error(FM_ERR_OOM, "out of host memory");
    int seq = p ? fm_gpt_paged_open(p) : -1;
    if (st == FM_OK) st = fm_gpt_paged_step_n(m, p, 1, &seq, (int[]){T - 1}, ids32, lg);
    if (st == FM_OK) st = fm_gpt_paged_step(m, p, 1, &seq, ids32 + T - 1, lg + V);
    if (st == FM_OK) {
        const float *r = fm_tensor_data(refc);
        double d = fmax(rms_rel(lg, r + (size_t)(T - 2) * V, V), rms_rel(lg + V, r + (size_t)(T - 1) * V, V));
        if (!(d <= tol))
            st = fm_set_error(FM_ERR_FORMAT, "%s: text generation from this graph gives logits %.3g (rms, relative) from the "
                              "graph's own (bound %g): its nodes are not the GPT its metadata and weight names describe", where, d, tol);
    }
    fm_gpt_paged_free(p);
    free(lg);
    fm_tensor_release_n(3, tok, ref, refc);
    return st;
}

fm_gpt *fm_graph_gpt_unpack(const fm_graph *g, const char *where, fm_paged_weights *q) {
    memset(q, 0, sizeof *q);
    const char *cj = fm_graph_get_meta(g, "gpt_config");
    if (!fm_graph_is_gpt(g) || !cj) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: %s; text generation needs a GPT graph that names its configuration (made by "
                     "`fathom compile` or `fathom quantize` from a GPT model since 2026-12: make it again)", where,
                     !fm_graph_is_gpt(g) ? "not a GPT graph (model_kind)" : "the graph's metadata has no gpt_config");
        return NULL;
    }
    fm_gpt_config c;
    if (gpt_config_parse(cj, where, &c)) return NULL;
    if (fm_graph_device(g).type != FM_DEV_CPU) {
        fm_set_error(FM_ERR_UNSUPPORTED, "%s: text generation runs graphs on the CPU", where);
        return NULL;
    }
    c.dropout = 0;
    /* the metadata's own sizes and, for Llama, the graph's RoPE tables [context, head
     * size] must agree with the configuration before anything is sized from it (a
     * context the weights do not bound would size the tables and the cache) */
    const char *keys[3] = {"block_size", "vocab_size", "n_layer"};
    const int want[3] = {c.block_size, c.vocab_size, c.n_layer};
    for (int i = 0; i < 3; i++) {
        const char *v = fm_graph_get_meta(g, keys[i]);
        if (v && atoll(v) != want[i]) {
            fm_set_error(FM_ERR_FORMAT, "%s: the metadata's %s (%s) is not gpt_config's (%d)", where, keys[i], v, want[i]);
            return NULL;
        }
    }
    const fm_tensor *rc = constant(g, "rope.cos");
    if (c.arch == FM_GPT_LLAMA && !has_shape(rc, FM_F32, 2, (int64_t[]){c.block_size, fm_gpt_head_dim(&c)})) {
        fm_set_error(FM_ERR_FORMAT, "%s: the graph's RoPE table rope.cos is not f32 [%d, %d] as gpt_config says", where,
                     c.block_size, fm_gpt_head_dim(&c));
        return NULL;
    }
    q->n_lin = c.n_layer * 4 + 1;
    if (!(q->lin = calloc((size_t)q->n_lin, sizeof *q->lin))) {
        fm_set_error(FM_ERR_OOM, "out of host memory");
        return NULL;
    }
    bind_ctx b = {g, where, q, c.n_layer, c.untied_head};
    bool prev = fm_set_grad_enabled(false);
    fm_gpt *m = gpt_new_bound(&c, bind, &b);
    /* the decoder's RoPE tables (made from the configuration's theta and scaling) are
     * the graph's: otherwise its positions are not the graph's */
    if (m && c.arch == FM_GPT_LLAMA) {
        const float *a = fm_tensor_data(m->rope_cos), *bq = fm_tensor_data(rc);
        double d = 0;
        for (int64_t i = 0; i < fm_tensor_numel(rc); i++) d = fmax(d, fabs((double)a[i] - bq[i]));
        if (!(d <= 1e-6)) {
            fm_set_error(FM_ERR_FORMAT, "%s: the graph's RoPE table differs from gpt_config's (by %.3g): rope_theta or "
                         "its scaling is not the graph's", where, d);
            fm_gpt_free(m);
            m = NULL;
        }
    }
    /* Quantized activations (int8 per step, int4's x per group) turn the float-ordering
     * differences between the graph's fused ops and the decoder's into whole rounding
     * steps, which add up over the layers: measured rms / rms, int4 and int8, 3e-7 and
     * 2e-3 on the trained kjv-gpt, up to 0.042 (int4) and 0.028 (int8) on a random
     * GPT-2-small-shaped model (12 x 768); f32 2e-6 at most. A structure other than
     * the metadata's (layer-norm eps 0.5 for 1e-5) measured 0.26-0.99. */
    bool quant = q->emb.kind != FM_PAGED_LIN_F32;
    for (int i = 0; i < q->n_lin; i++) quant |= q->lin[i].kind != FM_PAGED_LIN_F32;
    if (m && check_paged(g, m, q, where, quant ? 0.15 : 1e-3) != FM_OK) {
        fm_gpt_free(m);
        m = NULL;
    }
    fm_set_grad_enabled(prev);
    if (!m) fm_paged_weights_free(q);
    return m;
}
