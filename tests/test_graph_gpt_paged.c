/* Text generation from GPT inference graphs (src/graph/graph_gpt_paged.c): the
 * graph that fm_graph_from_gpt traces, compiled, and quantized (int4 symmetric and
 * with offsets, int8 dynamic) becomes the paged decoder's model, whose batched,
 * interleaved steps give each sequence the logits the graph itself gives for its
 * prefix (GPT-2 and Llama with GQA, tied and untied heads); and graphs whose
 * metadata, weights or structure do not fit are refused with the reason. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/graph.h"
#include "fathom/quant.h"
#include "core/cpu_features.h"
#include "gpt/gpt_internal.h"
#include "gpt/gpt_paged.h"
#include "graph/graph_gpt_paged.h"
#include "test_util.h"

static fm_gpt_config tiny(fm_gpt_arch arch, bool untied) {
    fm_gpt_config c = fm_gpt_config_default(arch);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = arch == FM_GPT_LLAMA ? 2 : 4;
    c.n_embd = 64;
    c.block_size = 24;
    c.vocab_size = 96;
    c.ffn_hidden = 128;
    c.untied_head = untied;
    c.dropout = 0;
    return c;
}

/* the logits row of the graph's own forward for seq[0..len), last position */
static double diff_vs_graph(const fm_graph *g, const int32_t *seq, int len, const float *paged, int V) {
    int64_t ids[32];
    for (int i = 0; i < len; i++) ids[i] = seq[i];
    fm_tensor *idx = fm_tensor_from_data(ids, 2, (int64_t[]){1, len}, FM_I64);
    fm_tensor *lg = idx ? fm_graph_gpt_forward(g, idx) : NULL, *c = lg ? fm_contiguous(lg) : NULL;
    double d = INFINITY;
    if (c) {
        const float *r = (const float *)fm_tensor_data(c) + (size_t)(len - 1) * V;
        double scale = 1;
        d = 0;
        for (int v = 0; v < V; v++) scale = fmax(scale, fabs(r[v]));
        for (int v = 0; v < V; v++) d = fmax(d, fabs((double)paged[v] - r[v]) / scale);
    }
    fm_tensor_release_n(3, idx, lg, c);
    return d;
}

/* Three sequences decoding together, one joining late with a prompt chunk: every
 * step's logits against the graph's forward of that sequence's prefix. */
static double run_interleaved(const fm_graph *g, fm_gpt *m, const fm_paged_weights *q, const char *what) {
    const int V = fm_gpt_get_config(m)->vocab_size;
    fm_gpt_paged *p = fm_gpt_paged_new_ex(m, q, 12, 4, 3, FM_F32);
    CHECK(p != NULL);
    if (!p) return INFINITY;
    int32_t seq[3][20];
    int len[3] = {0, 0, 0}, sid[3];
    for (int s = 0; s < 3; s++) {
        sid[s] = fm_gpt_paged_open(p);
        for (int t = 0; t < 20; t++) seq[s][t] = (int32_t)((s * 31 + t * 7 + 5) % V);
    }
    float *lg = malloc(sizeof(float) * 3 * (size_t)V), *seq0 = malloc(sizeof(float) * 10 * (size_t)V);
    double worst = 0;
    for (int step = 0; step < 10 && lg; step++) {
        int seqs[3], counts[3], n = 0, r = 0;
        int32_t tk[16];
        for (int s = 0; s < 3; s++) {
            if (s == 2 && step < 4) continue; /* joins late, with a 5-token prompt chunk */
            int k = s == 2 && step == 4 ? 5 : s == 1 && step == 0 ? 3 : 1;
            seqs[n] = sid[s];
            counts[n++] = k;
            for (int j = 0; j < k; j++) tk[r++] = seq[s][len[s] + j];
        }
        CHECK(fm_gpt_paged_step_n(m, p, n, seqs, counts, tk, lg) == FM_OK);
        for (int i = 0, s = 0; i < n; i++, s++) {
            while (sid[s] != seqs[i]) s++;
            len[s] += counts[i];
            worst = fmax(worst, diff_vs_graph(g, seq[s], len[s], lg + (size_t)i * V, V));
            if (s == 0 && seq0) memcpy(seq0 + (size_t)step * V, lg + (size_t)i * V, sizeof(float) * (size_t)V);
        }
    }
    /* sequence 0 again, alone, one token a step: every logit bitwise the batched one
     * (f32's packed linears, int4's row-wise x codes, int8's per-row scales) */
    fm_gpt_paged_free(p);
    p = fm_gpt_paged_new_ex(m, q, 12, 4, 1, FM_F32);
    int s0 = p ? fm_gpt_paged_open(p) : -1;
    bool same = p && lg && seq0;
    for (int step = 0; same && step < 10; step++) {
        same = fm_gpt_paged_step(m, p, 1, &s0, &seq[0][step], lg) == FM_OK;
        same = same && !memcmp(lg, seq0 + (size_t)step * V, sizeof(float) * (size_t)V);
    }
    CHECK_MSG(same, "%s: a sequence decoded alone differs from the same sequence batched with others", what);
    free(lg);
    free(seq0);
    fm_gpt_paged_free(p);
    return worst;
}

static int count_kind(const fm_paged_weights *q, fm_paged_lin_kind k) {
    int n = 0;
    for (int i = 0; i < q->n_lin; i++) n += q->lin[i].kind == k;
    return n;
}

static fm_graph *quantized(const fm_graph *g, fm_quant_mode mode, bool with_min) {
    fm_quant_options o;
    fm_quant_options_init(&o);
    o.mode = mode;
    o.group = 32;
    o.with_min = with_min;
    return fm_graph_quantize(g, &o, NULL);
}

static void check_model(fm_gpt_arch arch, bool untied) {
    fm_gpt_config c = tiny(arch, untied);
    fm_rng rng;
    fm_rng_init(&rng, 7 + (uint64_t)arch * 2 + untied);
    fm_gpt *src = fm_gpt_new(&c, &rng);
    CHECK(src != NULL);
    /* biases and norms away from their initial 0 and 1 */
    const fm_named_list *ps = fm_gpt_parameters(src);
    for (int i = 0; i < ps->n; i++)
        if (ps->items[i].tensor->ndim == 1) CHECK(fm_tensor_normal_(ps->items[i].tensor, 0.5, 0.2, &rng) == FM_OK);
    fm_graph *traced = fm_graph_from_gpt(src);
    CHECK(traced != NULL);
    fm_compile_report rep;
    memset(&rep, 0, sizeof rep);
    fm_graph *compiled = traced ? fm_graph_compile(traced, &rep) : NULL;
    CHECK_MSG(compiled != NULL, "compile: %s", fm_last_error());
    struct { const char *name; fm_graph *g; int n_int4, n_int8; bool emb4; double bound; } v[] = {
        {"traced", traced, 0, 0, false, 1e-4},
        {"compiled", compiled, 0, 0, false, 1e-4},
        /* int4 rounds x to int8 per group (per row: the kernel gives a row the same
         * values in any batch), so float-ordering differences of 1e-7 in the attention
         * can move one x across a rounding step: 1.2-1.5e-3 measured on one prompt
         * (int4 with min, all three models), 1e-7..2e-6 elsewhere */
        {"int4", compiled ? quantized(compiled, FM_QUANT_INT4, false) : NULL, c.n_layer * 4 + 1, 0, true, 5e-3},
        {"int4 with min", compiled ? quantized(compiled, FM_QUANT_INT4, true) : NULL, c.n_layer * 4 + 1, 0, true, 5e-3},
        /* the decoder's int8 quantizes each row at its own range, the graph's one range
         * per call (2.5-5.5e-3 measured) */
        {"int8 dynamic", compiled ? quantized(compiled, FM_QUANT_INT8_DYNAMIC, false) : NULL, 0, c.n_layer * 4 + 1, false, 0.02},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        CHECK(v[k].g != NULL);
        if (!v[k].g) continue;
        fm_paged_weights q;
        fm_gpt *m = fm_graph_gpt_unpack(v[k].g, v[k].name, &q);
        CHECK_MSG(m != NULL, "%s %s: %s", fm_gpt_arch_name(arch), v[k].name, fm_last_error());
        if (!m) continue;
        CHECK_MSG(count_kind(&q, FM_PAGED_LIN_INT4) == v[k].n_int4 && count_kind(&q, FM_PAGED_LIN_INT8) == v[k].n_int8 &&
                  (q.emb.kind == FM_PAGED_LIN_INT4) == v[k].emb4,
                  "%s %s: int4 %d, int8 %d, emb %d", fm_gpt_arch_name(arch), v[k].name, count_kind(&q, FM_PAGED_LIN_INT4),
                  count_kind(&q, FM_PAGED_LIN_INT8), (int)q.emb.kind);
        char what[96];
        snprintf(what, sizeof what, "%s%s %s", fm_gpt_arch_name(arch), untied ? " untied" : "", v[k].name);
        double d = run_interleaved(v[k].g, m, &q, what);
        CHECK_MSG(d <= v[k].bound, "%s%s %s: paged vs graph %.3g (bound %g)", fm_gpt_arch_name(arch), untied ? " untied" : "",
                  v[k].name, d, v[k].bound);
        fm_gpt_free(m);
        fm_paged_weights_free(&q);
    }
    for (size_t k = 2; k < sizeof v / sizeof v[0]; k++) fm_graph_free(v[k].g);
    fm_graph_free(compiled);
    fm_graph_free(traced);
    fm_gpt_free(src);
}

/* unpack must fail, with `want` in the message */
static void expect_refused(const fm_graph *g, const char *what, const char *want) {
    fm_paged_weights q;
    fm_gpt *m = fm_graph_gpt_unpack(g, what, &q);
    CHECK_MSG(m == NULL && strstr(fm_last_error(), want), "%s: got %s ('%s')", what, m ? "a model" : "refused", fm_last_error());
    fm_gpt_free(m);
    CHECK(q.lin == NULL && q.n_lin == 0 && q.emb.w == NULL); /* nothing left to free */
}

static char *config_with(const fm_gpt_config *c0, const char *key, double value) {
    fm_gpt_config c = *c0;
    if (!strcmp(key, "norm_eps")) c.norm_eps = value;
    if (!strcmp(key, "n_layer")) c.n_layer = (int)value;
    if (!strcmp(key, "n_embd")) c.n_embd = (int)value;
    return gpt_config_json(&c, false);
}

static void check_refusals(void) {
    fm_gpt_config c = tiny(FM_GPT_GPT2, false);
    fm_rng rng;
    fm_rng_init(&rng, 3);
    fm_gpt *src = fm_gpt_new(&c, &rng);
    fm_graph *g = src ? fm_graph_from_gpt(src) : NULL;
    CHECK(g != NULL);
    if (!g) { fm_gpt_free(src); return; }
    /* a configuration the weights do not fit: a layer more (a missing weight), a wider model */
    struct { const char *key; double v; const char *want; } bad[] = {
        {"n_layer", 3, "no f32 or quantized weight 'h.2.ln_1.weight'"},
        {"n_embd", 128, "must be f32 [96, 128]"},
        /* names and shapes fit, the numbers do not: the prompt check catches it */
        {"norm_eps", 0.5, "not the GPT its metadata"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *cj = config_with(&c, bad[i].key, bad[i].v);
        CHECK(cj && fm_graph_set_meta(g, "gpt_config", cj) == FM_OK);
        free(cj);
        /* the metadata's own n_layer agreeing, so that the weights are what disagree */
        CHECK(fm_graph_set_meta(g, "n_layer", !strcmp(bad[i].key, "n_layer") ? "3" : "2") == FM_OK);
        expect_refused(g, bad[i].key, bad[i].want);
    }
    /* the same on an int4 graph, whose check allows quantized activations' rounding */
    char *cj = config_with(&c, "norm_eps", 0.5);
    fm_graph *q4 = quantized(g, FM_QUANT_INT4, false);
    CHECK(cj && q4 && fm_graph_set_meta(q4, "gpt_config", cj) == FM_OK);
    if (q4) expect_refused(q4, "int4 norm_eps", "not the GPT its metadata");
    free(cj);
    fm_graph_free(q4);
    CHECK(fm_graph_set_meta(g, "gpt_config", "{\"arch\": \"gpt2\"") == FM_OK);
    expect_refused(g, "truncated config", "not JSON");
    CHECK(fm_graph_set_meta(g, "gpt_config", "[1, 2]") == FM_OK);
    expect_refused(g, "config not an object", "bad model config");
    /* the metadata's sizes against gpt_config's */
    cj = gpt_config_json(&c, false);
    CHECK(cj && fm_graph_set_meta(g, "gpt_config", cj) == FM_OK && fm_graph_set_meta(g, "block_size", "4096") == FM_OK);
    free(cj);
    expect_refused(g, "metadata block_size", "metadata's block_size (4096) is not gpt_config's (24)");
    CHECK(fm_graph_set_meta(g, "block_size", "24") == FM_OK && fm_graph_set_meta(g, "n_layer", "3") == FM_OK);
    expect_refused(g, "metadata n_layer", "metadata's n_layer (3) is not gpt_config's (2)");
    CHECK(fm_graph_set_meta(g, "model_kind", "classifier") == FM_OK);
    expect_refused(g, "classifier", "not a GPT graph");
    fm_graph_free(g);
    fm_gpt_free(src);
}

/* A Llama graph whose configuration names another context or RoPE base than its tables */
static void check_llama_refusals(void) {
    fm_gpt_config c = tiny(FM_GPT_LLAMA, false);
    fm_rng rng;
    fm_rng_init(&rng, 5);
    fm_gpt *src = fm_gpt_new(&c, &rng);
    fm_graph *g = src ? fm_graph_from_gpt(src) : NULL;
    CHECK(g != NULL);
    if (!g) { fm_gpt_free(src); return; }
    fm_gpt_config b = c;
    b.block_size = 1 << 20; /* with the metadata's block_size to match: only the tables say otherwise */
    char *cj = gpt_config_json(&b, false);
    CHECK(cj && fm_graph_set_meta(g, "gpt_config", cj) == FM_OK && fm_graph_set_meta(g, "block_size", "1048576") == FM_OK);
    free(cj);
    expect_refused(g, "llama context", "rope.cos is not f32 [1048576, 16]");
    b = c;
    b.rope_theta = 500000;
    cj = gpt_config_json(&b, false);
    CHECK(cj && fm_graph_set_meta(g, "gpt_config", cj) == FM_OK && fm_graph_set_meta(g, "block_size", "24") == FM_OK);
    free(cj);
    expect_refused(g, "llama rope_theta", "RoPE table differs from gpt_config's");
    fm_graph_free(g);
    fm_gpt_free(src);
}

int main(void) {
    fm_gpt_paged_set_parallel_min(0); /* the pooled attention too */
    check_model(FM_GPT_GPT2, false);
    check_model(FM_GPT_LLAMA, false);
    check_model(FM_GPT_LLAMA, true);
    check_refusals();
    check_llama_refusals();
    TEST_DONE();
}
